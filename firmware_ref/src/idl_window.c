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
#define IDL_BLOCKNUM_MASK (0xFFFFFFFFu >> IDL_BLOCK_SHIFT) /* block numbers live mod 2^27 */

#if IDL_WINDOW_COUNTERS
#define IDL_COUNT(w, field) ((w)->counters.field++)
#else
#define IDL_COUNT(w, field) ((void)0)
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

idl_verdict_t idl_window_commit(idl_window_t *w, uint32_t seq)
{
    const uint32_t highest = w->highest;
    const uint32_t back = highest - seq;
    uint32_t *word;
    uint32_t bit;

    if (back > IDL_HALF || w->empty) {
        /* Blocks passed over, counted modulo 2^27 so the count stays right across 2^32. When
         * empty the bitmap is already zero and clearing is merely redundant. */
        uint32_t n = ((seq >> IDL_BLOCK_SHIFT) - (highest >> IDL_BLOCK_SHIFT)) & IDL_BLOCKNUM_MASK;
        if (n != 0u) {
            uint32_t blk = highest >> IDL_BLOCK_SHIFT;
            if (n > IDL_WINDOW_BLOCKS) {
                n = IDL_WINDOW_BLOCKS;
            }
            do {
                ++blk;
                w->bitmap[blk & IDL_INDEX_MASK] = 0u;
            } while (--n != 0u);
        }
        w->highest = seq;
        w->empty = false;
        IDL_COUNT(w, advances);
        IDL_COUNT(w, accepted);
        w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK] |= 1u << (seq & IDL_BIT_MASK);
        return IDL_VERDICT_NEW;
    }
    if (back >= IDL_WINDOW_SIZE) {
        IDL_COUNT(w, too_old);
        return IDL_VERDICT_TOO_OLD;
    }
    word = &w->bitmap[(seq >> IDL_BLOCK_SHIFT) & IDL_INDEX_MASK];
    bit = 1u << (seq & IDL_BIT_MASK);
    if ((*word & bit) != 0u) {
        IDL_COUNT(w, duplicates);
        return IDL_VERDICT_DUPLICATE;
    }
    *word |= bit;
    IDL_COUNT(w, accepted);
    return IDL_VERDICT_ACCEPT_OLD;
}
