/**
 * @file idl_window.c
 * @brief The replay window (see idl_window.h for the rules). Masks and shifts only: no `%`, no
 *        division (Cortex-M0+ has no divide instruction), no shifting of the bitmap.
 */
#include "idl_window.h"

#include <string.h>

#define IDL_HALF 0x80000000u                    /* 2^(SEQ_BITS-1) */
#define IDL_BLOCK_SHIFT 5u                      /* log2(32) */
#define IDL_BIT_MASK 31u                        /* bit inside a block */
#define IDL_INDEX_MASK (IDL_WINDOW_BLOCKS - 1u) /* block number -> ring slot */

/* IDL_WINDOW_SMALL selects the commit variant; both give identical results (same tests). */
#ifndef IDL_WINDOW_SMALL
#ifdef __OPTIMIZE_SIZE__
#define IDL_WINDOW_SMALL 1
#else
#define IDL_WINDOW_SMALL 0
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define IDL_NOINLINE __attribute__((noinline))
#else
#define IDL_NOINLINE
#endif

void idl_window_init(idl_window_t *w)
{
    (void)memset(w, 0, sizeof *w); /* span 0: empty */
}

void idl_window_reset(idl_window_t *w)
{
    (void)memset(w->bitmap, 0, sizeof w->bitmap);
    w->highest = 0u;
    w->span = 0u;
}

idl_verdict_t idl_window_check(const idl_window_t *w, uint32_t seq)
{
    const uint32_t back = w->highest - seq;

    /* back > 2^31 <=> d = seq - highest in 1 .. 2^31-1: ahead. back = 2^31 (d = 2^31, undefined
     * in RFC 1982) is old. Tested first: the in-order stream is the common case. */
    if (back > IDL_HALF) {
        return IDL_VERDICT_NEW;
    }
    /* In the window (never while empty: span is 0): 1 + the bit = ACCEPT_OLD or DUPLICATE. */
    if (back < w->span) {
        return (idl_verdict_t)(
            ((w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK] >> (seq & IDL_BIT_MASK)) & 1u)
            + 1u);
    }
    /* Outside the window: too old, unless the window is empty (then every number is NEW). */
    return w->span == 0u ? IDL_VERDICT_NEW : IDL_VERDICT_TOO_OLD;
}

/* Clear the n >= 1 ring blocks ending with seq's own, at most the whole ring. The speed-first
 * commit keeps it out of line: it runs once per 32 numbers in order, and keeping the loop out of
 * commit spares registers on every path (gcc 12 -O2: 0.8 instructions per number); the size-first
 * one lets the compiler inline its one call. */
#if IDL_WINDOW_SMALL
#define IDL_CLEAR_LINKAGE static
#else
#define IDL_CLEAR_LINKAGE IDL_NOINLINE static
#endif
IDL_CLEAR_LINKAGE void idl_window_clear(idl_window_t *w, uint32_t seq, uint32_t n)
{
    const uint32_t blk = seq >> IDL_BLOCK_SHIFT;
    if (n > IDL_WINDOW_BLOCKS) {
        n = IDL_WINDOW_BLOCKS;
    }
    do {
        --n;
        w->bitmap[(blk - n) & IDL_INDEX_MASK] = 0u;
    } while (n != 0u);
}

#if IDL_WINDOW_SMALL
/* Size-first variant (default under -Os): the verdict from idl_window_check(), one shared tail. */
idl_verdict_t idl_window_commit(idl_window_t *w, uint32_t seq)
{
    const idl_verdict_t v = idl_window_check(w, seq);
    uint32_t *const word = &w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK];

    if (v == IDL_VERDICT_NEW) {
        /* n = ((highest mod 32) + d) / 32 blocks passed over (d = seq - highest; with
         * 1 <= d < 2^31 the sum cannot wrap), ending with seq's own, cleared, at most the whole
         * ring. From the empty state n is arbitrary but the bitmap is already zero. */
        const uint32_t highest = w->highest;
        const uint32_t n = ((highest & IDL_BIT_MASK) + (seq - highest)) >> IDL_BLOCK_SHIFT;
        if (n != 0u) {
            idl_window_clear(w, seq, n);
        }
        w->highest = seq;
        w->span = IDL_WINDOW_SIZE;
    }
    if (v <= IDL_VERDICT_ACCEPT_OLD) {
        *word |= 1u << (seq & IDL_BIT_MASK);
    }
    return v;
}
#else
/* Speed-first variant (default otherwise): each verdict on its own straight path. The in-window
 * test comes first: it is one compare (span is 0 while empty), and a late number, the common case
 * of a reordering link, then pays nothing for the NEW test; a NEW number pays one extra compare. */
idl_verdict_t idl_window_commit(idl_window_t *w, uint32_t seq)
{
    const uint32_t highest = w->highest;
    const uint32_t back = highest - seq;
    if (back < w->span) {
        /* ACCEPT_OLD (1) if the bit was clear, DUPLICATE (2) if set; the block is written back
         * either way (with the same value on a duplicate): no branch on the bit. */
        uint32_t *const word = w->bitmap + ((seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK);
        const uint32_t bits = *word;
        *word = bits | (1u << (seq & IDL_BIT_MASK));
        return (idl_verdict_t)(((bits >> (seq & IDL_BIT_MASK)) & 1u) + 1u);
    }
    /* Outside the window: old unless ahead (back > 2^31) or the window is empty. */
    if (back <= IDL_HALF && w->span != 0u) {
        return IDL_VERDICT_TOO_OLD;
    }
    /* NEW (ahead, or the first number since init/reset). When seq lies in another block than
     * the highest, n = ((highest mod 32) + d) / 32 blocks were passed over (d = seq - highest =
     * -back; with 1 <= d < 2^31 the sum cannot wrap); from the empty state n is arbitrary but
     * the bitmap is already zero, so clearing is merely redundant. */
    if (((seq ^ highest) >> IDL_BLOCK_SHIFT) != 0u) {
        idl_window_clear(w, seq, ((highest & IDL_BIT_MASK) - back) >> IDL_BLOCK_SHIFT);
    }
    w->highest = seq;
    w->span = IDL_WINDOW_SIZE; /* opens the window after init/reset */
    /* (seq mod ring) / 32 is seq's slot, written unlike the late path's (seq / 32) mod blocks:
     * gcc 12 then keeps the slot computation off the paths that do not need it. */
    w->bitmap[(seq & (IDL_WINDOW_RING_BITS - 1u)) >> IDL_BLOCK_SHIFT] |= 1u << (seq & IDL_BIT_MASK);
    return IDL_VERDICT_NEW;
}
#endif
