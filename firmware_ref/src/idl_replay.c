/* Replay cache: see idl_replay.h. K is small (default 8), so every operation is a linear scan. */
#include "idl_replay.h"

#include <string.h>

void idl_replay_init(idl_replay_t *c) { memset(c, 0, sizeof *c); }

uint8_t idl_replay_claim(idl_replay_t *c, uint32_t seq)
{
    uint8_t i;
    uint8_t empty = IDL_REPLAY_SLOTS;
    uint8_t oldest = 0;
    uint32_t oldest_age = 0;
    for (i = 0; i < IDL_REPLAY_SLOTS; i++) {
        const idl_replay_entry_t *e = &c->entry[i];
        if (e->length == 0u) {
            if (empty == IDL_REPLAY_SLOTS) {
                empty = i;
            }
        } else if (e->seq == seq) {
            c->entry[i].length = 0;
            return i;
        } else if (c->stamp - e->stamp >= oldest_age) {
            oldest_age = c->stamp - e->stamp;
            oldest = i;
        }
    }
    if (empty == IDL_REPLAY_SLOTS) {
        empty = oldest;
    }
    c->entry[empty].length = 0;
    return empty;
}

void idl_replay_commit(idl_replay_t *c, uint8_t slot, uint32_t seq, uint32_t digest,
                       uint16_t length)
{
    idl_replay_entry_t *e = &c->entry[slot];
    c->stamp++;
    e->seq = seq;
    e->digest = digest;
    e->stamp = c->stamp;
    e->length = length;
}

idl_replay_verdict_t idl_replay_lookup(const idl_replay_t *c, uint32_t seq, uint32_t digest,
                                       const uint8_t **answer, uint16_t *length)
{
    uint8_t i;
    for (i = 0; i < IDL_REPLAY_SLOTS; i++) {
        const idl_replay_entry_t *e = &c->entry[i];
        if (e->length != 0u && e->seq == seq) {
            if (e->digest != digest) {
                return IDL_REPLAY_CONFLICT;
            }
            *answer = e->data;
            *length = e->length;
            return IDL_REPLAY_REPLAY;
        }
    }
    return IDL_REPLAY_EVICTED;
}
