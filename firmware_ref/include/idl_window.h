/**
 * @file idl_window.h
 * @brief Sliding-window sequence de-duplication (replay window) for idemlink devices.
 *
 * Bit-exact with protocol/window.py. Sequence numbers are 32-bit and compared with RFC 1982
 * serial arithmetic; the window tracks the last ::IDL_WINDOW_SIZE numbers ending at the highest
 * committed one, in a ring of ::IDL_WINDOW_RING_BITS bits made of 32-bit blocks (WireGuard's
 * layout: window = ring - one block). Advancing clears whole blocks, at most the whole ring; the
 * bitmap is never shifted. No division, no malloc, no libc beyond string.h; all state lives in a
 * caller-owned ::idl_window_t.
 *
 * Rules (with back = highest - seq and d = seq - highest, both modulo 2^32):
 *  - empty window, or 1 <= d <= 2^31 - 1 (i.e. back > 2^31)  -> ::IDL_VERDICT_NEW
 *  - back >= ::IDL_WINDOW_SIZE (this includes d = 2^31 exactly, which RFC 1982 leaves undefined
 *    and idemlink treats as old)                                 -> ::IDL_VERDICT_TOO_OLD
 *  - back < ::IDL_WINDOW_SIZE and the bit is set                  -> ::IDL_VERDICT_DUPLICATE
 *  - back < ::IDL_WINDOW_SIZE and the bit is clear                -> ::IDL_VERDICT_ACCEPT_OLD
 *
 * Usage: call idl_window_check() as early as you like (it is pure); call idl_window_commit()
 * only once the frame passed its integrity check (CRC, later the MAC) and act on the verdict
 * commit returns. A forged far-ahead number that fails the CRC then cannot wipe the window.
 * Pure is not atomic: when commit runs in an interrupt, serialise check with it (a check torn by
 * a commit can combine the old and new state and answer DUPLICATE for a number never committed).
 */
#ifndef IDL_WINDOW_H
#define IDL_WINDOW_H

#include "idl_checkreturn.h"

#include <stdbool.h>
#include <stdint.h>

#include "idemlink_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#if !defined(IDL_SEQ_BITS) || !defined(IDL_WINDOW_RING_BITS) || !defined(IDL_WINDOW_BLOCK_BITS) \
    || !defined(IDL_WINDOW_SIZE)
#error "idemlink_proto.h must define IDL_SEQ_BITS and the IDL_WINDOW_* constants"
#endif
#if IDL_SEQ_BITS != 32
#error "idl_window implements 32-bit sequence numbers only (IDL_SEQ_BITS must be 32)"
#endif
#if IDL_WINDOW_BLOCK_BITS != 32
#error "idl_window uses uint32_t blocks: IDL_WINDOW_BLOCK_BITS must be 32"
#endif
#if (IDL_WINDOW_RING_BITS & (IDL_WINDOW_RING_BITS - 1u)) != 0
#error "IDL_WINDOW_RING_BITS must be a power of two (so block numbers stay continuous at the wrap)"
#endif
#if IDL_WINDOW_RING_BITS < 2u * IDL_WINDOW_BLOCK_BITS || IDL_WINDOW_RING_BITS > 0x80000000u
#error "IDL_WINDOW_RING_BITS must hold at least two blocks and at most 2^31 bits"
#endif
#if IDL_WINDOW_SIZE < 1u || IDL_WINDOW_SIZE > IDL_WINDOW_RING_BITS - IDL_WINDOW_BLOCK_BITS
#error "IDL_WINDOW_SIZE must be between 1 and ring bits minus one block"
#endif

/** Number of 32-bit blocks in the ring. */
#define IDL_WINDOW_BLOCKS (IDL_WINDOW_RING_BITS / IDL_WINDOW_BLOCK_BITS)

/**
 * Window state: the whole of it, 136 bytes at the default window. Caller-owned; treat the fields
 * as read-only and change them through the API.
 */
typedef struct {
    uint32_t highest; /**< highest committed number (meaningless when empty) */
    uint32_t span;    /**< ::IDL_WINDOW_SIZE once a number is committed, 0 while empty: one compare
                           `highest - seq < span` is the in-window test and excludes the empty state */
    uint32_t bitmap[IDL_WINDOW_BLOCKS]; /**< the ring: bit (seq mod ring) marks seq as seen */
} idl_window_t;

/** True while nothing was committed since init/reset (every number is NEW). */
#define IDL_WINDOW_IS_EMPTY(w) ((w)->span == 0u)

/**
 * Diagnostic counters: one per verdict, indexed by ::idl_verdict_t (they wrap at 2^32).
 *
 * Kept out of ::idl_window_t on purpose: they are diagnostics, not window state. The window must
 * start empty at every boot epoch, while counters are most useful when they survive it (put them
 * in a no-init section if you want them across resets), and a device that does not read them pays
 * neither their RAM nor the increment. Count with idl_window_commit_counted() or
 * IDL_WINDOW_COUNT(); read through the IDL_WINDOW_ACCEPTED / _DUPLICATES / _TOO_OLD / _ADVANCES
 * macros.
 */
typedef struct {
    uint32_t by_verdict[4]; /**< commits that found NEW, ACCEPT_OLD, DUPLICATE, TOO_OLD */
} idl_window_counters_t;

/** Tally verdict @p v (the return value of idl_window_commit()) in counters @p c. */
#define IDL_WINDOW_COUNT(c, v) ((void)((c)->by_verdict[(v)]++))
/** Commits of NEW or ACCEPT_OLD (numbers accepted). */
#define IDL_WINDOW_ACCEPTED(c) \
    ((c)->by_verdict[IDL_VERDICT_NEW] + (c)->by_verdict[IDL_VERDICT_ACCEPT_OLD])
/** Commits that found DUPLICATE. */
#define IDL_WINDOW_DUPLICATES(c) ((c)->by_verdict[IDL_VERDICT_DUPLICATE])
/** Commits that found TOO_OLD. */
#define IDL_WINDOW_TOO_OLD(c) ((c)->by_verdict[IDL_VERDICT_TOO_OLD])
/** Commits of NEW (the window moved). */
#define IDL_WINDOW_ADVANCES(c) ((c)->by_verdict[IDL_VERDICT_NEW])

/**
 * @brief Initialise @p w to the empty state.
 * @param w caller-owned state (not NULL).
 */
void idl_window_init(idl_window_t *w);

/**
 * @brief Return @p w to the empty state (e.g. on a new boot epoch).
 * @param w an initialised window.
 */
void idl_window_reset(idl_window_t *w);

/**
 * @brief The verdict for @p seq. Pure: changes nothing, so it may run before the integrity check.
 * @param w   an initialised window.
 * @param seq the frame's sequence number.
 * @return ::IDL_VERDICT_NEW, ::IDL_VERDICT_ACCEPT_OLD, ::IDL_VERDICT_DUPLICATE or
 *         ::IDL_VERDICT_TOO_OLD (see the rules in the file comment).
 */
IDL_CHECKRETURN idl_verdict_t idl_window_check(const idl_window_t *w, uint32_t seq);

/**
 * @brief Apply @p seq after its frame passed the integrity check; returns the verdict applied.
 *
 * The verdict is re-derived from the state as it is now, so a stale idl_window_check() (another
 * commit or a reset in between) is harmless, and commit alone is the fused check-and-update a
 * CRC-only device needs per frame. NEW moves the highest and clears the ring blocks passed over
 * (at most the whole ring) before setting the bit; ACCEPT_OLD sets the bit; DUPLICATE and TOO_OLD
 * change nothing.
 * @param w   an initialised window.
 * @param seq the frame's sequence number.
 * @return the verdict, as idl_window_check() would have returned it just before the call.
 */
IDL_CHECKRETURN idl_verdict_t idl_window_commit(idl_window_t *w, uint32_t seq);

/**
 * @brief idl_window_commit() that also tallies the verdict in @p c.
 * @param w   an initialised window.
 * @param c   counters (zero them once; idl_window_init() and idl_window_reset() leave them alone).
 * @param seq the frame's sequence number.
 * @return the verdict of idl_window_commit().
 */
static inline idl_verdict_t idl_window_commit_counted(idl_window_t *w, idl_window_counters_t *c,
                                                      uint32_t seq)
{
    const idl_verdict_t v = idl_window_commit(w, seq);
    IDL_WINDOW_COUNT(c, v);
    return v;
}

#ifdef __cplusplus
}
#endif

#endif /* IDL_WINDOW_H */
