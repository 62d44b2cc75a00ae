/**
 * @file idl_window.c
 * @brief The replay window (see idl_window.h for the rules). Masks and shifts only: no `%`, no
 *        division (Cortex-M0+ has no divide instruction), no shifting of the bitmap.
 */
#include "idl_window.h"

#include <string.h>

#define IDL_HALF 0x80000000u            /* 2^(SEQ_BITS-1) */
#define IDL_BLOCK_SHIFT 5u              /* log2(32) */
#define IDL_BIT_MASK 31u                /* bit inside a block */
#define IDL_INDEX_MASK (IDL_WINDOW_BLOCKS - 1u) /* block number -> ring slot */

/* IDL_WINDOW_SMALL selects the commit variant; both give identical results (same tests). */
#ifndef IDL_WINDOW_SMALL
#ifdef __OPTIMIZE_SIZE__
#define IDL_WINDOW_SMALL 1
#else
#define IDL_WINDOW_SMALL 0
#endif
#endif

#if IDL_WINDOW_COUNTERS
#define IDL_COUNT(w, v) ((w)->counters.by_verdict[(v)]++)
#else
#define IDL_COUNT(w, v) ((void)0)
#endif

void idl_window_init(idl_window_t *w)
{
    (void)memset(w, 0, sizeof *w);
    w->empty = true;
}

void idl_window_reset(idl_window_t *w)
{
    (void)memset(w->bitmap, 0, sizeof w->bitmap);
    w->highest = 0u;
    w->empty = true;
}

idl_verdict_t idl_window_check(const idl_window_t *w, uint32_t seq)
{
    const uint32_t back = w->highest - seq;

    /* back > 2^31  <=>  d = seq - highest in 1 .. 2^31-1: ahead of the highest. */
    if (back > IDL_HALF || w->empty) {
        return IDL_VERDICT_NEW;
    }
    /* Covers back = 2^31 (d = 2^31, undefined in RFC 1982): old. */
    if (back >= IDL_WINDOW_SIZE) {
        return IDL_VERDICT_TOO_OLD;
    }
    if ((w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK] >> (seq & IDL_BIT_MASK)) & 1u) {
        return IDL_VERDICT_DUPLICATE;
    }
    return IDL_VERDICT_ACCEPT_OLD;
}

/* Move the highest to seq (a NEW verdict). offset = (highest mod 32) + (seq - highest): with
 * 1 <= seq - highest < 2^31 it cannot wrap, and offset / 32 is the number of ring blocks passed
 * over; those blocks (ending with seq's own) are cleared, at most the whole ring. In the empty
 * state offset is arbitrary but the bitmap is already zero, so clearing is merely redundant. */
static inline void idl_window_advance(idl_window_t *w, uint32_t seq, uint32_t offset)
{
    uint32_t n = offset >> IDL_BLOCK_SHIFT;
    if (n != 0u) {
        const uint32_t blk = seq >> IDL_BLOCK_SHIFT;
        if (n > IDL_WINDOW_BLOCKS) {
            n = IDL_WINDOW_BLOCKS;
        }
        do {
            --n;
            w->bitmap[(blk - n) & IDL_INDEX_MASK] = 0u;
        } while (n != 0u);
    }
    w->highest = seq;
    w->empty = false;
}

#if IDL_WINDOW_SMALL
/* Size-first variant (default under -Os): one shared tail, the verdict from idl_window_check(). */
idl_verdict_t idl_window_commit(idl_window_t *w, uint32_t seq)
{
    const idl_verdict_t v = idl_window_check(w, seq);
    uint32_t *const word = &w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK];

    if (v == IDL_VERDICT_NEW) {
        idl_window_advance(w, seq, (w->highest & IDL_BIT_MASK) + (seq - w->highest));
    }
    if (v <= IDL_VERDICT_ACCEPT_OLD) {
        *word |= 1u << (seq & IDL_BIT_MASK);
    }
    IDL_COUNT(w, v);
    return v;
}
#else
/* Speed-first variant (default otherwise): each verdict on its own straight path. */
idl_verdict_t idl_window_commit(idl_window_t *w, uint32_t seq)
{
    const uint32_t highest = w->highest;
    const uint32_t back = highest - seq;
    uint32_t *word;
    uint32_t bits;

    if (back > IDL_HALF || w->empty) {
        idl_window_advance(w, seq, (highest & IDL_BIT_MASK) - back);
        w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK] |= 1u << (seq & IDL_BIT_MASK);
        IDL_COUNT(w, IDL_VERDICT_NEW);
        return IDL_VERDICT_NEW;
    }
    if (back >= IDL_WINDOW_SIZE) {
        IDL_COUNT(w, IDL_VERDICT_TOO_OLD);
        return IDL_VERDICT_TOO_OLD;
    }
    word = &w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK];
    bits = *word;
    if (((bits >> (seq & IDL_BIT_MASK)) & 1u) != 0u) {
        IDL_COUNT(w, IDL_VERDICT_DUPLICATE);
        return IDL_VERDICT_DUPLICATE;
    }
    *word = bits | (1u << (seq & IDL_BIT_MASK));
    IDL_COUNT(w, IDL_VERDICT_ACCEPT_OLD);
    return IDL_VERDICT_ACCEPT_OLD;
}
#endif
