/* Unit tests of idl_window: the shared stream table (tests/vectors/window_streams.json, turned into
 * window_vectors.h by the build) plus a few API properties. Runs natively, under the sanitizers
 * and on QEMU (semihosting); prints one line per failure and a summary, exits non-zero on failure.
 */
#include <stdio.h>
#include <string.h>

#include "idl_window.h"
#include "window_vectors.h"

#if VEC_WINDOW != IDL_WINDOW_SIZE || VEC_RING_BITS != IDL_WINDOW_RING_BITS
#error "the vector table was generated for another window than idemlink_proto.h declares"
#endif

#define CANARY 0xA5C3E1F0u

typedef struct {
    uint32_t pre[4];
    idl_window_t w;
    uint32_t post[4];
} guarded_t;

static unsigned failures;
static unsigned checks;

static const char *vname(idl_verdict_t v)
{
    switch (v) {
    case IDL_VERDICT_NEW: return "NEW";
    case IDL_VERDICT_ACCEPT_OLD: return "ACCEPT_OLD";
    case IDL_VERDICT_DUPLICATE: return "DUPLICATE";
    case IDL_VERDICT_TOO_OLD: return "TOO_OLD";
    }
    return "?";
}

static void expect(int ok, const char *what, unsigned id, unsigned step)
{
    ++checks;
    if (!ok) {
        ++failures;
        if (failures <= 20u) {
            printf("FAIL stream %u step %u: %s\n", id, step, what);
        }
    }
}

static void guard_init(guarded_t *g)
{
    unsigned i;
    for (i = 0; i < 4u; ++i) {
        g->pre[i] = CANARY;
        g->post[i] = CANARY;
    }
    idl_window_init(&g->w);
}

static int guard_ok(const guarded_t *g)
{
    unsigned i;
    for (i = 0; i < 4u; ++i) {
        if (g->pre[i] != CANARY || g->post[i] != CANARY) {
            return 0;
        }
    }
    return 1;
}

static void run_table(void)
{
    unsigned s;
    for (s = 0; s < VEC_NSTREAMS; ++s) {
        const vec_stream_t *st = &vec_streams[s];
        static guarded_t g;
        static idl_window_t before;
        idl_window_counters_t c;
        uint32_t acc = 0, dup = 0, old = 0, adv = 0;
        uint32_t i;
        memset(&c, 0, sizeof c);
        guard_init(&g);
        for (i = 0; i < st->count; ++i) {
            const vec_step_t *step = &vec_steps[st->first + i];
            const idl_verdict_t want = (idl_verdict_t)step->verdict;
            idl_verdict_t got;
            before = g.w;
            got = idl_window_check(&g.w, step->seq);
            if (got != want) {
                printf("  check(%lu) = %s, want %s\n", (unsigned long)step->seq, vname(got),
                       vname(want));
            }
            expect(got == want, "check verdict", st->id, (unsigned)i);
            expect(memcmp(&before, &g.w, sizeof before) == 0, "check changed state", st->id,
                   (unsigned)i);
            if (step->deliver) {
                got = idl_window_commit_counted(&g.w, &c, step->seq);
                if (got != want) {
                    printf("  commit(%lu) = %s, want %s\n", (unsigned long)step->seq, vname(got),
                           vname(want));
                }
                expect(got == want, "commit verdict", st->id, (unsigned)i);
                switch (want) {
                case IDL_VERDICT_NEW: ++adv; ++acc; break;
                case IDL_VERDICT_ACCEPT_OLD: ++acc; break;
                case IDL_VERDICT_DUPLICATE: ++dup; break;
                case IDL_VERDICT_TOO_OLD: ++old; break;
                }
            }
        }
        expect(guard_ok(&g), "canary overwritten", st->id, (unsigned)st->count);
        expect(IDL_WINDOW_ACCEPTED(&c) == acc && IDL_WINDOW_DUPLICATES(&c) == dup
                   && IDL_WINDOW_TOO_OLD(&c) == old && IDL_WINDOW_ADVANCES(&c) == adv,
               "counters differ from the table's verdict counts", st->id, (unsigned)st->count);
    }
}

static void test_init_reset(void)
{
    static guarded_t g;
    unsigned i;
    guard_init(&g);
    expect(IDL_WINDOW_IS_EMPTY(&g.w), "init leaves the window empty", 0u, 0u);
    for (i = 0; i < IDL_WINDOW_BLOCKS; ++i) {
        expect(g.w.bitmap[i] == 0u, "init clears the bitmap", 0u, i);
    }
    expect(idl_window_commit(&g.w, 7u) == IDL_VERDICT_NEW, "first commit is NEW", 0u, 1u);
    expect(idl_window_commit(&g.w, 7u) == IDL_VERDICT_DUPLICATE, "then DUPLICATE", 0u, 2u);
    idl_window_reset(&g.w);
    expect(IDL_WINDOW_IS_EMPTY(&g.w), "reset empties", 0u, 3u);
    expect(idl_window_check(&g.w, 7u) == IDL_VERDICT_NEW, "after reset 7 is NEW", 0u, 4u);
    expect(idl_window_check(&g.w, 6u) == IDL_VERDICT_NEW, "after reset 6 is NEW", 0u, 5u);
    expect(guard_ok(&g), "canary", 0u, 7u);
}

/* Every ring slot, across the wrap: after a jump that clears the whole ring, only the highest is
 * seen; each other number inside the window is ACCEPT_OLD exactly once. */
static void test_full_ring_after_jump(void)
{
    static guarded_t g;
    uint32_t base = 0xFFFFFE00u, k;
    guard_init(&g);
    for (k = 0; k < 2u * IDL_WINDOW_RING_BITS; ++k) {
        if (idl_window_commit(&g.w, base + k) != IDL_VERDICT_NEW) {
            expect(0, "consecutive numbers are NEW", base + k, 0u);
        }
    }
    base = base + 2u * IDL_WINDOW_RING_BITS - 1u + IDL_WINDOW_RING_BITS; /* jump of the ring */
    expect(idl_window_commit(&g.w, base) == IDL_VERDICT_NEW, "ring jump is NEW", 1u, 0u);
    for (k = 1; k < IDL_WINDOW_SIZE; ++k) {
        expect(idl_window_commit(&g.w, base - k) == IDL_VERDICT_ACCEPT_OLD,
               "slot cleared by the ring jump", 1u, (unsigned)k);
    }
    expect(idl_window_check(&g.w, base - IDL_WINDOW_SIZE) == IDL_VERDICT_TOO_OLD, "edge", 1u, 0u);
    for (k = 0; k < IDL_WINDOW_SIZE; ++k) {
        expect(idl_window_check(&g.w, base - k) == IDL_VERDICT_DUPLICATE, "all seen", 1u,
               (unsigned)k);
    }
    expect(guard_ok(&g), "canary", 1u, 0u);
}

int main(void)
{
    run_table();
    test_init_reset();
    test_full_ring_after_jump();
    printf("idl_window: %u streams, %u steps, %u checks, %u failures (W=%u, ring=%u, "
           "state=%u bytes, counters=%u bytes)\n",
           (unsigned)VEC_NSTREAMS, (unsigned)VEC_NSTEPS, checks, failures,
           (unsigned)IDL_WINDOW_SIZE, (unsigned)IDL_WINDOW_RING_BITS,
           (unsigned)sizeof(idl_window_t), (unsigned)sizeof(idl_window_counters_t));
    return failures == 0u ? 0 : 1;
}
