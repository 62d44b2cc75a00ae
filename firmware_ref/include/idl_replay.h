/**
 * @file idl_replay.h
 * @brief The replay cache: the answers of the last IDL_REPLAY_SLOTS executed requests, keyed by
 *        sequence number, with the CRC-32C of the request payload (protocol/replay.py).
 *
 * Semantics (an ordered map with oldest-first eviction):
 * - storing a number that is present replaces its entry and makes it the newest;
 * - storing a new number into a full cache evicts the oldest entry;
 * - lookup: no entry -> EVICTED, other digest -> CONFLICT, same digest -> REPLAY (stored bytes).
 *
 * Storing is split in two so the answer is written straight into its slot (no second buffer):
 * idl_replay_claim() picks and empties the slot, the caller writes at most IDL_REPLAY_MAX_ANSWER
 * bytes into idl_replay_data(), then idl_replay_commit() files it.
 */
#ifndef IDL_REPLAY_H
#define IDL_REPLAY_H

#include "idl_checkreturn.h"

#include <stdint.h>

#ifndef IDL_REPLAY_SLOTS
#define IDL_REPLAY_SLOTS 8u
#endif
#if IDL_REPLAY_SLOTS < 1u || IDL_REPLAY_SLOTS > 255u
#error "IDL_REPLAY_SLOTS must be 1..255"
#endif

/** Largest stored answer: status u8 + the largest response PDU (253 bytes). */
#define IDL_REPLAY_MAX_ANSWER 254u

typedef enum {
    IDL_REPLAY_REPLAY = 0,
    IDL_REPLAY_CONFLICT = 1,
    IDL_REPLAY_EVICTED = 2
} idl_replay_verdict_t;

typedef struct {
    uint32_t seq;
    uint32_t digest;
    uint32_t stamp;  /**< insertion order (the newest has the largest, modulo 2^32) */
    uint16_t length; /**< 0: empty slot */
    uint8_t data[IDL_REPLAY_MAX_ANSWER];
} idl_replay_entry_t;

typedef struct {
    uint32_t stamp;
    idl_replay_entry_t entry[IDL_REPLAY_SLOTS];
} idl_replay_t;

void idl_replay_init(idl_replay_t *c);

/** The slot `seq` will be stored in (its own entry, else an empty one, else the oldest); the
 *  slot is emptied. */
IDL_CHECKRETURN uint8_t idl_replay_claim(idl_replay_t *c, uint32_t seq);

static inline uint8_t *idl_replay_data(idl_replay_t *c, uint8_t slot)
{
    return c->entry[slot].data;
}

/** File the answer written into `slot` (1..IDL_REPLAY_MAX_ANSWER bytes) as the newest entry. */
void idl_replay_commit(idl_replay_t *c, uint8_t slot, uint32_t seq, uint32_t digest,
                       uint16_t length);

/** Classify a duplicate; on REPLAY, answer and length give the stored bytes. */
IDL_CHECKRETURN idl_replay_verdict_t idl_replay_lookup(const idl_replay_t *c, uint32_t seq, uint32_t digest,
                                       const uint8_t **answer, uint16_t *length);

#endif /* IDL_REPLAY_H */
