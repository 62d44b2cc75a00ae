/* Instruction-count benchmark of idl_window (run under valgrind callgrind by `make bench`, which
 * collects only inside the functions named below and divides by the numbers of the stream).
 *
 * Usage: bench_window PATTERN [FLOW]
 * PATTERN, 2^20 numbers per stream, starting 2^19 below 2^32 so the wrap happens mid-run:
 *  - inorder:  start, start+1, ...
 *  - shuffled: the in-order stream shuffled within groups of 32
 *  - dup10:    in order, but 10% of the numbers repeat one of the last 32
 *  - jumps1:   in order, but 1% jump forward by W + rand(W)
 * FLOW, what a device does per frame:
 *  - check+commit (default): check (the pre-filter before an expensive MAC), then commit (after
 *    the integrity check). make bench collects inside idl_window_check and idl_window_commit.
 *  - commit: commit only (what a CRC-only device needs: commit re-derives the verdict, it is the
 *    fused check-and-update, like WireGuard's counter_validate). Collects inside commit.
 * Both call through pointers, so the calls are real calls wherever the bench is built.
 */
#include <stdio.h>
#include <string.h>

#include "idl_window.h"

#define N (1u << 20)
#define START (0u - (1u << 19))

static uint32_t stream[N];
static idl_window_t win;

static uint32_t rng_state = 0x9E3779B9u;
static uint32_t rnd(void)
{
    uint32_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    rng_state = x;
    return x;
}

static int build(const char *pattern)
{
    uint32_t i, cur = START;
    if (strcmp(pattern, "inorder") == 0) {
        for (i = 0; i < N; ++i) {
            stream[i] = START + i;
        }
    } else if (strcmp(pattern, "shuffled") == 0) {
        for (i = 0; i < N; ++i) {
            stream[i] = START + i;
        }
        for (i = 0; i < N; i += 32u) {
            uint32_t k;
            for (k = 31u; k > 0u; --k) {
                uint32_t j = rnd() & 31u; /* biased is fine for a benchmark stream */
                uint32_t t;
                if (j > k) {
                    j = k;
                }
                t = stream[i + k];
                stream[i + k] = stream[i + j];
                stream[i + j] = t;
            }
        }
    } else if (strcmp(pattern, "dup10") == 0) {
        for (i = 0; i < N; ++i) {
            if (i > 32u && rnd() % 10u == 0u) {
                stream[i] = cur - (rnd() & 31u);
            } else {
                stream[i] = ++cur;
            }
        }
    } else if (strcmp(pattern, "jumps1") == 0) {
        for (i = 0; i < N; ++i) {
            if (rnd() % 100u == 0u) {
                cur += IDL_WINDOW_SIZE + rnd() % IDL_WINDOW_SIZE;
            } else {
                ++cur;
            }
            stream[i] = cur;
        }
    } else {
        return 0;
    }
    return 1;
}

volatile idl_verdict_t bench_early; /* the check's verdict: the check cannot be dropped */

int main(int argc, char **argv)
{
    idl_verdict_t (*volatile check_fn)(const idl_window_t *, uint32_t) = idl_window_check;
    idl_verdict_t (*volatile commit_fn)(idl_window_t *, uint32_t) = idl_window_commit;
    const char *flow = argc == 3 ? argv[2] : "check+commit";
    uint32_t i, counts[4] = {0u, 0u, 0u, 0u};
    if (argc < 2 || argc > 3 || !build(argv[1])) {
        fprintf(stderr, "usage: %s inorder|shuffled|dup10|jumps1 [check+commit|commit]\n",
                argv[0]);
        return 2;
    }
    idl_window_init(&win);
    if (strcmp(flow, "check+commit") == 0) {
        for (i = 0; i < N; ++i) {
            bench_early = check_fn(&win, stream[i]);
            counts[commit_fn(&win, stream[i])]++;
        }
    } else if (strcmp(flow, "commit") == 0) {
        for (i = 0; i < N; ++i) {
            counts[commit_fn(&win, stream[i])]++;
        }
    } else {
        fprintf(stderr, "unknown flow %s\n", flow);
        return 2;
    }
    printf("checks=%u new=%u old=%u dup=%u too_old=%u\n", (unsigned)N, (unsigned)counts[0],
           (unsigned)counts[1], (unsigned)counts[2], (unsigned)counts[3]);
    return 0;
}
