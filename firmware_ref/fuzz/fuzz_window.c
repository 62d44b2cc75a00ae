/* libFuzzer differential target: idl_window against a naive model (a list of the committed
 * numbers still inside the window, plus the highest) over streams decoded from the input.
 *
 * Input: 3 bytes per operation — kind, then a 16-bit parameter p (little-endian).
 *   kind & 0x80: check only (the frame "failed its CRC"); otherwise check then commit.
 *   kind & 0x0F selects the step from the model's highest h (0xFFFFFC00 while empty, so the
 *   wrap at 2^32 is near): h+1+(p&63), h-(p&1023), h+W-1..W+2, h-W-1..h-W+2, h+ring-1..+2,
 *   h+2^31-2..+1, h-2^31-2..+1, an absolute p*65537, h+p, h-p, and h itself.
 * Invariants (abort on violation): check == model, commit == model, check changes nothing,
 * the counters equal the model's tallies, the canaries around the state are intact.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idl_window.h"

#define MAX_OPS 4096u
#define W IDL_WINDOW_SIZE

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    bool empty;
    uint32_t highest;
    uint32_t seen[W]; /* committed numbers within the window (at most W of them) */
    uint32_t nseen;
    uint32_t tally[4];
} model_t;

static idl_verdict_t model_verdict(const model_t *m, uint32_t seq)
{
    uint32_t d, back, i;
    if (m->empty) {
        return IDL_VERDICT_NEW;
    }
    d = seq - m->highest;
    if (d >= 1u && d < 0x80000000u) {
        return IDL_VERDICT_NEW;
    }
    back = m->highest - seq;
    if (back >= W) {
        return IDL_VERDICT_TOO_OLD;
    }
    for (i = 0; i < m->nseen; ++i) {
        if (m->seen[i] == seq) {
            return IDL_VERDICT_DUPLICATE;
        }
    }
    return IDL_VERDICT_ACCEPT_OLD;
}

static idl_verdict_t model_commit(model_t *m, uint32_t seq)
{
    const idl_verdict_t v = model_verdict(m, seq);
    uint32_t i, k = 0;
    if (v == IDL_VERDICT_NEW) {
        m->empty = false;
        m->highest = seq;
        for (i = 0; i < m->nseen; ++i) { /* forget what fell out of the window */
            if (seq - m->seen[i] < W) {
                m->seen[k++] = m->seen[i];
            }
        }
        m->nseen = k;
    }
    if (v == IDL_VERDICT_NEW || v == IDL_VERDICT_ACCEPT_OLD) {
        if (m->nseen >= W) {
            abort(); /* the model itself is wrong */
        }
        m->seen[m->nseen++] = seq;
    }
    m->tally[v]++;
    return v;
}

static uint32_t pick(const model_t *m, uint8_t kind, uint32_t p)
{
    const uint32_t h = m->empty ? 0xFFFFFC00u : m->highest;
    const uint32_t s = p & 3u;
    switch (kind & 0x0Fu) {
    case 0: return h + 1u + (p & 63u);
    case 1: return h - (p & 1023u);
    case 2: return h + W - 1u + s;
    case 3: return h - W - 1u + s;
    case 4: return h + IDL_WINDOW_RING_BITS - 1u + s;
    case 5: return h + 0x80000000u - 2u + s;
    case 6: return h - 0x80000000u - 2u + s;
    case 7: return p * 65537u;
    case 8: return h + p;
    case 9: return h - p;
    default: return h;
    }
}

typedef struct {
    uint32_t pre[3];
    idl_window_t w;
    uint32_t post[3];
} guarded_t;

static model_t model;
static guarded_t g;
static idl_window_counters_t counters;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off;
    unsigned i, n = 0;
    memset(&model, 0, sizeof model);
    model.empty = true;
    for (i = 0; i < 3u; ++i) {
        g.pre[i] = g.post[i] = 0xDEADBEEFu;
    }
    idl_window_init(&g.w);
    memset(&counters, 0, sizeof counters);
    for (off = 0; off + 3u <= size && n < MAX_OPS; off += 3u, ++n) {
        const uint8_t kind = data[off];
        const uint32_t p = (uint32_t)data[off + 1u] | ((uint32_t)data[off + 2u] << 8);
        const uint32_t seq = pick(&model, kind, p);
        static idl_window_t before;
        before = g.w;
        if (idl_window_check(&g.w, seq) != model_verdict(&model, seq)) {
            abort();
        }
        if (memcmp(&before, &g.w, sizeof before) != 0) {
            abort();
        }
        if ((kind & 0x80u) == 0u
            && idl_window_commit_counted(&g.w, &counters, seq) != model_commit(&model, seq)) {
            abort();
        }
    }
    for (i = 0; i < 4u; ++i) {
        if (counters.by_verdict[i] != model.tally[i]) {
            abort();
        }
    }
    for (i = 0; i < 3u; ++i) {
        if (g.pre[i] != 0xDEADBEEFu || g.post[i] != 0xDEADBEEFu) {
            abort();
        }
    }
    return 0;
}
