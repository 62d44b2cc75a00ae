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
    /* no session key yet; the device nonce a reply carries before any keyed HELLO (key_id is
     * set by every HELLO) */
    s->keyed = idl_port_auth_key(0u) != NULL ? 1u : 0u;
    idl_port_random(s->auth.nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
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
/* answers are signed with `key` (NULL: unsigned) */
#define ENCODE(s, key, type, flags, seq, payload, len) \
    idl_frame_encode_signed((s)->tx, TO(s), (key), (type), (flags), (s)->epoch, (seq), \
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
#define ENCODE(s, key, type, flags, seq, payload, len) \
    idl_frame_encode_addressed((s)->tx, (s)->to, (type), (flags), (s)->epoch, (seq), (payload), (len))
#endif
#else
#if IDL_AUTH
#undef TO
#define TO(s) IDL_FRAME_NO_ADDRESS
#else
#define ENCODE(s, key, type, flags, seq, payload, len) \
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

#if IDL_AUTH
/* the labels without their C terminators (nothing reads past them) */
static const uint8_t KEY_ID_LABEL[sizeof IDL_KEY_ID_LABEL - 1u] = IDL_KEY_ID_LABEL;
/* the key id's message: one constant piece */
static const idl_piece_t KEY_ID = { KEY_ID_LABEL, sizeof KEY_ID_LABEL };
static const uint8_t KDF_LABEL[sizeof IDL_KDF_LABEL - 1u] = IDL_KDF_LABEL;

/* A keyed device's HELLO (protocol/auth.py DeviceAuth.hello; the table of idl_auth.h): the
 * session key it derives if the HELLO names a key the device holds, else NULL (the session key,
 * if any, stays). `id` is the device id as the key derivation takes it (length byte, bytes);
 * the reply's key id (the named key's, else the current one's) is written to `key_id`. */
static const uint8_t *handshake(idl_session_t *s, const idl_frame_t *f, const uint8_t *id,
                                uint8_t *key_id)
{
    idl_auth_t *a = &s->auth;
    const uint8_t *ext = f->payload + 1u + IDL_CONTRACT_HASH_LEN;
    const uint8_t *k;
    uint8_t kid[4];
#if IDL_BUS
    uint8_t address = (uint8_t)TO(s); /* 0xFF point-to-point */
#else
    static const uint8_t address = IDL_KDF_ADDRESS_NONE; /* point-to-point */
#endif
    idl_piece_t pieces[4];
    unsigned i;
    unsigned diff;
    /* the key the host names, if we hold it (an unkeyed host's HELLO, too short for the
     * extension, names none): each key's id is written over a copy of the host's and compared
     * with it, the current key's (the first) in key_id: the one the reply names unless another
     * matches */
    for (i = 0; (k = idl_port_auth_key(i)) != NULL; i++) {
        uint8_t *kid_i = i == 0u ? key_id : kid;
        memcpy(kid_i, ext + IDL_NONCE_LEN, 4u);
        if (idl_blake2s(kid_i, 4u, k, &KEY_ID, 1u) == 0u
            && f->length >= 1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN + 4u) {
            break;
        }
    }
    if (k == NULL) {
        return NULL; /* no key named, or another one: nothing signed */
    }
    memcpy(key_id, ext + IDL_NONCE_LEN, 4u); /* the named key's */
    /* a new handshake: a new nonce (the same HELLO again gets the same answer) */
    diff = s->keyed & 1u; /* no session yet */
    for (i = 0; i < IDL_NONCE_LEN; i++) {
        diff |= (unsigned)(a->nonces[i] ^ ext[i]);
        a->nonces[i] = ext[i];
    }
    if (diff != 0u) {
        idl_port_random(a->nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
    }
    pieces[0].p = KDF_LABEL;
    pieces[0].n = sizeof KDF_LABEL;
    pieces[1].p = a->nonces;
    pieces[1].n = sizeof a->nonces;
    pieces[2].p = id;
    pieces[2].n = 1u + (size_t)id[0];
    pieces[3].p = &address;
    pieces[3].n = 1u;
    (void)idl_blake2s(a->session, IDL_KEY_LEN, k, pieces, 4u);
    s->keyed = 2u;
    s->decoder.mac_key = a->session; /* every frame from now on verified with it */
    return a->session;
}
#endif

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
#if IDL_AUTH
        /* capabilities and address 0, then a keyed device's bus extension (used below): next 1 */
        memset(p + n, 0, 7u);
        p[n + 3u] = 1u;
#else
        p[n] = 0u;
        p[n + 1u] = 0u;
        p[n + 2u] = 0u;
#endif
        n += 3u;
    }
#if IDL_AUTH
    const uint8_t *key = NULL; /* signed only with a session key this HELLO made */
    if (s->keyed != 0u) {
        /* a new session key if the HELLO names a key we hold (this reply is its first signed
         * frame; else the reply goes unsigned), then AUTH and the fourth extension: the key id
         * and the device nonce (after the bus one) */
#if IDL_BUS
        p[caps] |= (uint8_t)IDL_CAP_AUTH;
#else
        p[caps] = (uint8_t)IDL_CAP_AUTH; /* no other capability without the bus */
#endif
        n = n == caps + 3u ? n + 4u : n;
        key = handshake(s, f, p + id_at, p + n);
        memcpy(p + n + 4u, s->auth.nonces + IDL_NONCE_LEN, IDL_NONCE_LEN);
        n += 4u + IDL_NONCE_LEN;
    }
#endif
    s->handed_out = next;
    s->has_handed_out = 1u;
    return ENCODE(s, key, IDL_FT_HELLO_REPLY, 0u, f->seq, p, n);
}

/* One RESPONSE frame in tx, to the REQUEST `f`: the only place that passes idl_frame_encode's
 * seven arguments; with IDL_AUTH signed if `f` verified (its signer's key), else unsigned. */
static size_t response(idl_session_t *s, const idl_frame_t *f, uint8_t flags,
                       const uint8_t *payload, size_t len)
{
    return ENCODE(s, f->signer, IDL_FT_RESPONSE, flags, f->seq, payload, len);
}

/* A status-only answer; EPOCH_MISMATCH's also carries the request's epoch (ours is in the
 * header) */
static size_t status_answer(idl_session_t *s, const idl_frame_t *f, uint8_t status)
{
    uint8_t payload[5];
    payload[0] = status;
    put_le(payload + 1, f->epoch, 4u);
    return response(s, f, 0u, payload, status == IDL_STATUS_EPOCH_MISMATCH ? 5u : 1u);
}

static size_t request(idl_session_t *s, const idl_frame_t *f, uint32_t now)
{
    idl_verdict_t v;
    uint32_t digest;
    const uint8_t *answer;
    uint16_t length;
    if (f->epoch != s->epoch) {
        s->counters[IDL_DISP_EPOCH_MISMATCH]++;
        return status_answer(s, f, IDL_STATUS_EPOCH_MISMATCH);
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
        return response(s, f, 0u, out, n + 1u);
    }
    if (v == IDL_VERDICT_TOO_OLD) {
        s->counters[IDL_DISP_TOO_OLD]++;
        return status_answer(s, f, IDL_STATUS_TOO_OLD);
    }
    switch (idl_replay_lookup(&s->cache, f->seq, digest, &answer, &length)) {
    case IDL_REPLAY_REPLAY:
        s->counters[IDL_DISP_REPLAYED]++;
        return response(s, f, IDL_FLAG_REPLAY, answer, length);
    case IDL_REPLAY_CONFLICT:
        s->counters[IDL_DISP_CONFLICT]++;
        return status_answer(s, f, IDL_STATUS_IDEMPOTENCY_CONFLICT);
    case IDL_REPLAY_EVICTED:
    default:
        s->counters[IDL_DISP_EVICTED]++;
        return status_answer(s, f, IDL_STATUS_ANSWER_EVICTED);
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
    if (s->keyed != 0u) { /* even a verified one: the devices share no session key */
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
    uint8_t keyed = s->keyed;
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
        /* a REQUEST: without a tag, AUTHENTICATION_REQUIRED (unsigned: a keyed host never takes
         * it for its answer); with one while no session key exists and of another epoch,
         * EPOCH_MISMATCH (rebooted: no key to check or sign with); else silence */
        if (f->type != (uint8_t)IDL_FT_REQUEST
            || (f->tag_len != 0u && (s->keyed > 1u || f->epoch == s->epoch))) {
            return 0;
        }
        return status_answer(s, f, f->tag_len == 0u ? (uint8_t)IDL_STATUS_AUTHENTICATION_REQUIRED
                                                    : (uint8_t)IDL_STATUS_EPOCH_MISMATCH);
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
