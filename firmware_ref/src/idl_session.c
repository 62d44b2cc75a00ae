/* Framed device session: see idl_session.h. */
#include "idl_session.h"

#include <string.h>

#include "idl_crc32c.h"

#define RESPONSE_PDU_MAX (IDL_REPLAY_MAX_ANSWER - 1u)

static const uint8_t CONTRACT_HASH[IDL_CONTRACT_HASH_LEN] = IDL_CONTRACT_HASH_BYTES;

void idl_session_init(idl_session_t *s, const idl_session_config_t *cfg, uint32_t epoch)
{
    memset(s->counters, 0, sizeof s->counters);
    s->cfg = cfg;
    s->epoch = epoch;
    s->handed_out = 0;
    s->has_handed_out = 0;
    idl_window_init(&s->window);
#if IDL_BUS
    idl_window_init(&s->broadcast_window);
    s->to = IDL_FRAME_NO_ADDRESS;
    s->broadcasting = 0u;
#endif
    idl_replay_init(&s->cache);
    idl_frame_decoder_init(&s->decoder);
#if IDL_AUTH
    idl_auth_init(&s->auth);
#endif
}

uint32_t idl_session_first_seq(const idl_session_t *s)
{
    bool seen = !IDL_WINDOW_IS_EMPTY(&s->window);
    uint32_t anchor = seen ? s->window.highest + 1u : 1u;
    uint32_t offset;
    uint32_t following;
    if (!s->has_handed_out) {
        return seen ? anchor + IDL_WINDOW_SIZE : anchor;
    }
    offset = s->handed_out - anchor;
    /* handed out at or ahead of the anchor: one window further; behind it: requests passed it */
    following = offset < 0x80000000u ? offset + IDL_WINDOW_SIZE : IDL_WINDOW_SIZE;
    if (following > IDL_HANDOUT_SPAN) {
        following = IDL_WINDOW_SIZE;
    }
    return anchor + following;
}

#if IDL_AUTH
#define TO(s) (s)->to
#define ENCODE(s, type, flags, seq, payload, len) \
    idl_frame_encode_signed((s)->tx, TO(s), (s)->sign, (type), (flags), (s)->epoch, (seq), \
                            (payload), (len))
#endif

#if IDL_BUS
uint32_t idl_session_broadcast_next(const idl_session_t *s)
{
    if (IDL_WINDOW_IS_EMPTY(&s->broadcast_window)) {
        return 1u;
    }
    return s->broadcast_window.highest + 1u + IDL_WINDOW_SIZE;
}

#if !IDL_AUTH
/* Answers go to the address the request came from (IDL_FRAME_NO_ADDRESS: unaddressed). */
#define ENCODE(s, type, flags, seq, payload, len) \
    idl_frame_encode_addressed((s)->tx, (s)->to, (type), (flags), (s)->epoch, (seq), (payload), (len))
#endif
#else
#if IDL_AUTH
#undef TO
#define TO(s) IDL_FRAME_NO_ADDRESS
#else
#define ENCODE(s, type, flags, seq, payload, len) \
    idl_frame_encode((s)->tx, (type), (flags), (s)->epoch, (seq), (payload), (len))
#endif
#endif

/* A pascal string of at most `max` bytes (the caps keep DEVICE_INFO within IDL_MAX_PAYLOAD:
 * 20 fixed bytes + 129 + 8 + 65 + 256 = 478). */
static size_t put_str(uint8_t *p, const char *str, size_t max)
{
    /* one loop instead of strlen + memcpy: no libc strlen, and it stops at `max` */
    size_t n = 0;
    if (str != NULL) {
        while (n < max && str[n] != '\0') {
            p[n + 1u] = (uint8_t)str[n];
            n++;
        }
    }
    p[0] = (uint8_t)n;
    return n + 1u;
}

static void put_le(uint8_t *p, uint32_t v, unsigned bytes)
{
    unsigned i;
    for (i = 0; i < bytes; i++) {
        p[i] = (uint8_t)(v >> (8u * i));
    }
}

static size_t hello(idl_session_t *s, const idl_frame_t *f)
{
    const idl_session_config_t *c = s->cfg;
    /* built at the end of tx; idl_frame_encode reads it before it overwrites it. Every byte
     * DEVICE_INFO gains must be counted in IDL_SESSION_HELLO_MAX (idl_session.h): the TX buffer
     * is sized by it (tests/test_core.c test_hello_bound pins it) */
    uint8_t *p = s->tx + sizeof s->tx - IDL_SESSION_HELLO_MAX;
    size_t n = 0;
    unsigned i;
    uint8_t inflight = c->max_inflight < IDL_REPLAY_SLOTS ? c->max_inflight
                                                          : (uint8_t)IDL_REPLAY_SLOTS;
    uint32_t next = idl_session_first_seq(s);
#if IDL_AUTH
    size_t id_at;
    size_t caps;
#endif
    p[n++] = (uint8_t)IDL_PROTOCOL_VERSION;
    put_le(p + n, IDL_WINDOW_SIZE, 2u);
    put_le(p + n + 2u, IDL_MAX_PAYLOAD, 2u);
    put_le(p + n + 4u, IDL_REPLAY_SLOTS, 2u);
    n += 6u;
    p[n++] = inflight;
    for (i = 0; i < IDL_CONTRACT_HASH_LEN; i++) {
        p[n++] = CONTRACT_HASH[i];
    }
    put_le(p + n, next, 4u);
    n += 4u;
    n += put_str(p + n, c->name, 128u);
    memcpy(p + n, c->map_hash, IDL_MAP_HASH_LEN);
    n += IDL_MAP_HASH_LEN;
#if IDL_AUTH
    id_at = n; /* the device id as the key derivation takes it: length byte, bytes */
#endif
    n += put_str(p + n, c->device_id, IDL_MAX_DEVICE_ID_LEN);
    n += put_str(p + n, c->map_name, 255u);
    /* the second extension: capabilities u16 and the bus address u8 (0: none configured);
     * an old host ignores them */
#if IDL_AUTH
    caps = n;
#endif
#if IDL_BUS
    if (c->address != 0u) {
        p[n] = (uint8_t)IDL_CAP_ADDRESSED;
        p[n + 1u] = 0u;
        p[n + 2u] = c->address;
        put_le(p + n + 3u, idl_session_broadcast_next(s), 4u); /* the bus extension */
        n += 7u;
    } else
#endif
    {
        p[n] = 0u;
        p[n + 1u] = 0u;
        p[n + 2u] = 0u;
        n += 3u;
#if IDL_AUTH
        put_le(p + n, 1u, 4u); /* a keyed device's bus extension (used below): next 1 */
#endif
    }
#if IDL_AUTH
    s->sign = NULL; /* signed only with a session key this HELLO made */
    if (s->auth.keyed != 0u) {
        /* a new session key if the HELLO names a key we hold, then AUTH and the fourth
         * extension: the key id and the device nonce (after the bus one) */
        int fresh = idl_auth_hello(&s->auth, f->payload, f->length, p + id_at, (uint8_t)TO(s));
        p[caps] |= (uint8_t)IDL_CAP_AUTH;
        n = n == caps + 3u ? n + 4u : n;
        memcpy(p + n, s->auth.key_id, 4u);
        memcpy(p + n + 4u, s->auth.nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
        n += 4u + IDL_NONCE_LEN;
        if (fresh) { /* a new session key: this reply is its first signed frame */
            s->decoder.mac_key = s->auth.session;
            s->sign = s->auth.session;
        }
    }
#endif
    s->handed_out = next;
    s->has_handed_out = 1u;
    return ENCODE(s, IDL_FT_HELLO_REPLY, 0u, f->seq, p, n);
}

/* One RESPONSE frame in tx: the only place that passes idl_frame_encode's seven arguments. */
static size_t response(idl_session_t *s, uint8_t flags, uint32_t seq, const uint8_t *payload,
                       size_t len)
{
    return ENCODE(s, IDL_FT_RESPONSE, flags, seq, payload, len);
}

static size_t status_answer(idl_session_t *s, uint32_t seq, uint8_t status)
{
    return response(s, 0u, seq, &status, 1u);
}

/* EPOCH_MISMATCH: our epoch in the header, the request's in the payload */
static size_t epoch_mismatch(idl_session_t *s, const idl_frame_t *f)
{
    uint8_t payload[5];
    payload[0] = (uint8_t)IDL_STATUS_EPOCH_MISMATCH;
    put_le(payload + 1, f->epoch, 4u);
    return response(s, 0u, f->seq, payload, 5u);
}

static size_t request(idl_session_t *s, const idl_frame_t *f, uint32_t now)
{
    idl_verdict_t v;
    uint32_t digest;
    const uint8_t *answer;
    uint16_t length;
    if (f->epoch != s->epoch) {
        s->counters[IDL_DISP_EPOCH_MISMATCH]++;
        return epoch_mismatch(s, f);
    }
    v = idl_window_check(&s->window, f->seq);
    digest = idl_crc32c(f->payload, f->length);
    if (v == IDL_VERDICT_NEW || v == IDL_VERDICT_ACCEPT_OLD) {
        uint8_t slot = idl_replay_claim(&s->cache, f->seq);
        uint8_t *out = idl_replay_data(&s->cache, slot);
        uint16_t n = s->cfg->execute(s->cfg->ctx, f->payload, f->length, out + 1, now,
                                    f->seq);
        if (n > RESPONSE_PDU_MAX) {
            n = RESPONSE_PDU_MAX;
        }
        out[0] = (uint8_t)IDL_STATUS_OK;
        idl_verdict_t committed = idl_window_commit(&s->window, f->seq); /* re-derives v */
        (void)committed;
        idl_replay_commit(&s->cache, slot, f->seq, digest, (uint16_t)(n + 1u));
        s->counters[IDL_DISP_EXECUTED]++;
        return response(s, 0u, f->seq, out, n + 1u);
    }
    if (v == IDL_VERDICT_TOO_OLD) {
        s->counters[IDL_DISP_TOO_OLD]++;
        return status_answer(s, f->seq, IDL_STATUS_TOO_OLD);
    }
    switch (idl_replay_lookup(&s->cache, f->seq, digest, &answer, &length)) {
    case IDL_REPLAY_REPLAY:
        s->counters[IDL_DISP_REPLAYED]++;
        return response(s, IDL_FLAG_REPLAY, f->seq, answer, length);
    case IDL_REPLAY_CONFLICT:
        s->counters[IDL_DISP_CONFLICT]++;
        return status_answer(s, f->seq, IDL_STATUS_IDEMPOTENCY_CONFLICT);
    case IDL_REPLAY_EVICTED:
    default:
        s->counters[IDL_DISP_EVICTED]++;
        return status_answer(s, f->seq, IDL_STATUS_ANSWER_EVICTED);
    }
}

#if IDL_BUS
/* A broadcast REQUEST: run at most once per number if it is a set-only write; never answered
 * (protocol/device_session.py DeviceSession._broadcast). Returns the counter it adds to. */
static idl_disposition_t broadcast(idl_session_t *s, const idl_frame_t *f, uint32_t now)
{
    const idl_session_config_t *c = s->cfg;
    idl_verdict_t v;
    uint16_t n;
    if (f->type != (uint8_t)IDL_FT_REQUEST || c->broadcast_ok == NULL
        || !c->broadcast_ok(c->ctx, f->payload, f->length)) {
        return IDL_DISP_BROADCAST_REFUSED;
    }
#if IDL_AUTH
    if (s->auth.keyed != 0u) { /* even a verified one: the devices share no session key */
        return IDL_DISP_UNAUTHENTICATED;
    }
#endif
    v = idl_window_check(&s->broadcast_window, f->seq);
    if (v != IDL_VERDICT_NEW && v != IDL_VERDICT_ACCEPT_OLD) {
        return IDL_DISP_BROADCAST_REPEATED;
    }
    s->broadcasting = 1u;
    /* the answer nobody hears goes to tx, free while nothing is being answered */
    n = c->execute(c->ctx, f->payload, f->length, s->tx, now, f->seq);
    (void)n;
    s->broadcasting = 0u;
    v = idl_window_commit(&s->broadcast_window, f->seq);
    (void)v;
    return IDL_DISP_BROADCAST_EXECUTED;
}
#endif

/* One decoder event: the answer's length in tx (0: none). */
static size_t dispatch(idl_session_t *s, int ev, const idl_frame_t *f, uint32_t now)
{
    if (ev == IDL_FRAME_NONE) {
        return 0;
    }
    if (ev != IDL_FRAME_READY) {
        s->counters[IDL_DISP_DECODE_ERRORS]++;
        return 0;
    }
#if IDL_AUTH
    /* a keyed device takes nothing but HELLO without a verified tag (no downgrade) */
    uint8_t keyed = s->auth.keyed;
    s->sign = f->signer; /* an answer to a verified frame is signed */
    if (keyed != 0u && f->type != (uint8_t)IDL_FT_HELLO && f->signer == NULL) {
        s->counters[IDL_DISP_UNAUTHENTICATED]++;
#if IDL_BUS
        s->to = f->addressed != 0u ? f->address : IDL_FRAME_NO_ADDRESS;
        if (f->addressed != 0u && (s->cfg->address == 0u || f->address != s->cfg->address)) {
            return 0; /* not ours to answer */
        }
#else
        if (f->addressed != 0u) {
            return 0;
        }
#endif
        if (f->type != (uint8_t)IDL_FT_REQUEST) {
            return 0;
        }
        if (f->tag_len == 0u) { /* unsigned: a keyed host never takes it for its answer */
            return status_answer(s, f->seq, IDL_STATUS_AUTHENTICATION_REQUIRED);
        }
        if (s->auth.has_session == 0u && f->epoch != s->epoch) {
            return epoch_mismatch(s, f); /* rebooted: no key to check or sign with */
        }
        return 0;
    }
#define UNTAGGED(f) ((f)->tag_len == 0u || keyed != 0u)
#else
#define UNTAGGED(f) ((f)->tag_len == 0u)
#endif
#if IDL_BUS
    /* address_verdict: untagged frames only (an unkeyed device); no address -> this line */
    s->to = IDL_FRAME_NO_ADDRESS;
    if (UNTAGGED(f) && f->addressed != 0u && s->cfg->address != 0u) {
        if (f->address == IDL_BROADCAST_ADDRESS) {
            s->counters[broadcast(s, f, now)]++;
            return 0;
        }
        if (f->address != s->cfg->address) {
            s->counters[IDL_DISP_OTHER_ADDRESS]++;
            return 0;
        }
        s->to = f->address;
    } else
#endif
    if (f->addressed != 0u || !UNTAGGED(f)) {
        /* a keyed device's frame, or (without an address) a bus device's: no key, no address,
         * so it stays silent, like a device of the first contract (see idl_frame.h) */
        s->counters[IDL_DISP_UNEXPECTED]++;
        return 0;
    }
    if (f->type == (uint8_t)IDL_FT_REQUEST) {
        return request(s, f, now);
    }
    if (f->type == (uint8_t)IDL_FT_HELLO) {
        s->counters[IDL_DISP_HELLO]++;
        return hello(s, f);
    }
    s->counters[IDL_DISP_UNEXPECTED]++;
    return 0;
}

size_t idl_session_feed_buf(idl_session_t *s, const uint8_t *data, size_t n, size_t *used,
                            uint32_t now)
{
    idl_frame_t f;
    int ev = idl_frame_decoder_feed_buf(&s->decoder, data, n, used, &f);
    return dispatch(s, ev, &f, now);
}
