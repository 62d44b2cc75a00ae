/* Unit tests of the device core: CRC-32C, COBS and frames, the decoder's refusals, the replay
 * cache, the register core through Modbus PDUs and the session's dispositions. The byte-for-byte
 * agreement with the Python reference is tested in tests/test_c_device.py (ctypes differential);
 * these run natively, under the sanitizers and with every compiler variant. Prints one line per
 * failure and a summary; exits non-zero on failure. */
#include <stdio.h>
#include <string.h>

#include "frame_vectors.h"
#if IDL_BUS
#include "bus_vectors.h"
#endif
#if IDL_AUTH
#include "auth_vectors.h"
#endif
#include "idl_crc32c.h"
#include "idl_files.h"
#include "idl_frame.h"
#include "idl_modbus.h"
#include "idl_name.h"
#include "idl_replay.h"
#include "idl_rtu.h"
#include "idl_session.h"

static unsigned failures;
static unsigned checks;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
        }                                                                                  \
    } while (0)

static void test_crc(void)
{
    static const uint8_t digits[] = "123456789";
    uint8_t frame[13];
    uint32_t crc;
    CHECK(idl_crc32c(digits, 9u) == IDL_CRC_CHECK);
    CHECK(idl_crc32c(digits, 0u) == 0u);
    memcpy(frame, digits, 9u);
    crc = idl_crc32c(frame, 9u);
    frame[9] = (uint8_t)crc;
    frame[10] = (uint8_t)(crc >> 8);
    frame[11] = (uint8_t)(crc >> 16);
    frame[12] = (uint8_t)(crc >> 24);
    CHECK(idl_crc32c_update(IDL_CRC_INIT, frame, 13u) == IDL_CRC32C_RESIDUE_REG);
}

static idl_frame_decoder_t dec;
static uint8_t wire[IDL_WIRE_MAX];
static uint8_t payload[IDL_MAX_PAYLOAD];

/* Feed bytes; returns the last event that was not NONE. */
static int feed(const uint8_t *p, size_t n, idl_frame_t *f)
{
    int last = IDL_FRAME_NONE;
    size_t i;
    for (i = 0; i < n; i++) {
        int ev = idl_frame_decoder_feed(&dec, p[i], f);
        if (ev != IDL_FRAME_NONE) {
            last = ev;
        }
    }
    return last;
}

static void test_frames(void)
{
    static const size_t sizes[] = { 0u, 1u, 200u, 253u, 254u, 255u, 508u, 509u, IDL_MAX_PAYLOAD };
    size_t k;
    size_t i;
    idl_frame_t f;
    idl_frame_decoder_init(&dec);
    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        unsigned pattern;
        for (pattern = 0; pattern < 3u; pattern++) {
            size_t n;
            for (i = 0; i < sizes[k]; i++) { /* no zeros, all zeros, mixed */
                payload[i] = (uint8_t)(pattern == 0u ? 1u + i % 255u : pattern == 1u ? 0u : i * 7u);
            }
            n = idl_frame_encode(wire, IDL_FT_REQUEST, IDL_FLAG_RETRANSMIT, 0xDEADBEEFu,
                                 0xFFFFFFFEu, payload, sizes[k]);
            CHECK(n >= IDL_MIN_FRAME + 2u && n <= IDL_WIRE_MAX);
            CHECK(wire[0] == 0u && wire[n - 1u] == 0u && memchr(wire + 1, 0, n - 2u) == NULL);
            CHECK(feed(wire, n, &f) == IDL_FRAME_READY);
            CHECK(f.type == IDL_FT_REQUEST && f.flags == IDL_FLAG_RETRANSMIT);
            CHECK(f.epoch == 0xDEADBEEFu && f.seq == 0xFFFFFFFEu && f.length == sizes[k]);
            CHECK(memcmp(f.payload, payload, sizes[k]) == 0);
        }
    }
    CHECK(idl_frame_encode(wire, IDL_FT_REQUEST, 0u, 1u, 1u, payload, IDL_MAX_PAYLOAD + 1u) == 0u);
    CHECK(dec.counters[IDL_FRAME_COUNT_FRAMES] == 27u);
}

/* The golden frames shared with Python (tests/vectors/frames.json): every one decodes to its
 * fields, byte by byte; every one without a tag is also what the encoder writes. */
static void test_frame_vectors(void)
{
    unsigned k;
    idl_frame_decoder_init(&dec);
    for (k = 0; k < VEC_NFRAMES; k++) {
        const vec_frame_t *v = &vec_frames[k];
        idl_frame_t f;
        size_t n;
        CHECK(feed(v->wire, v->wire_len, &f) == IDL_FRAME_READY);
        CHECK(f.type == v->type && (f.flags & (uint8_t)~IDL_LAYOUT_FLAGS) == v->flags);
        CHECK(f.epoch == v->epoch && f.seq == v->seq && f.length == v->payload_len);
        CHECK(memcmp(f.payload, v->payload, v->payload_len) == 0);
        CHECK(f.addressed == (v->address >= 0 ? 1u : 0u));
        CHECK(v->address < 0 || f.address == (uint8_t)v->address);
        CHECK(f.tag_len == v->tag_len);
        CHECK(v->tag_len == 0u ? f.tag == NULL
                               : f.tag != NULL && memcmp(f.tag, v->tag, v->tag_len) == 0);
        if (v->tag_len == 0u) { /* no MAC in this C core yet: tagged frames are decoded only */
            n = idl_frame_encode_addressed(
                wire, v->address < 0 ? (uint16_t)IDL_FRAME_NO_ADDRESS : (uint16_t)v->address,
                v->type, v->flags, v->epoch, v->seq, v->payload, v->payload_len);
            CHECK(n == v->wire_len && memcmp(wire, v->wire, n) == 0);
        }
    }
    CHECK(dec.counters[IDL_FRAME_COUNT_FRAMES] == VEC_NFRAMES);
    CHECK(idl_frame_encode_addressed(wire, 248u, IDL_FT_REQUEST, 0u, 1u, 1u, payload, 1u) == 0u);
    CHECK(idl_frame_encode_addressed(wire, 7u, IDL_FT_REQUEST, IDL_FLAG_AUTH, 1u, 1u, payload,
                                     1u) == 0u);
}

static void test_refusals(void)
{
    static const uint8_t garbage[] = { 0x00, 0x05, 0x01, 0x02, 0x00 };
    uint8_t junk[IDL_MAX_ENCODED + 10u];
    idl_frame_t f;
    size_t n;
    uint8_t *hit;
    idl_frame_decoder_init(&dec);
    memset(payload, 0x41, 10u);
    n = idl_frame_encode(wire, IDL_FT_HELLO, 0u, 0u, 3u, payload, 10u);
    hit = memchr(wire, 0x41, n); /* a payload byte: changing it keeps the COBS valid */
    CHECK(hit != NULL);
    if (hit != NULL) {
        *hit = 0x42u;
    }
    CHECK(feed(wire, n, &f) == IDL_DECODE_BAD_CRC);
    CHECK(feed(garbage, sizeof garbage, &f) == IDL_DECODE_MALFORMED); /* code past the end */
    memset(junk, 0x41, sizeof junk);
    CHECK(feed(junk, sizeof junk, &f) == IDL_DECODE_OVERSIZE);
    CHECK(dec.len == 0u && dec.discarding == 1u);
    n = idl_frame_encode(wire, IDL_FT_HELLO, 0u, 0u, 3u, payload, 10u);
    CHECK(feed(wire, n, &f) == IDL_FRAME_READY); /* the delimiter ends the discarded run */
    CHECK(dec.counters[IDL_DECODE_BAD_CRC] == 1u && dec.counters[IDL_DECODE_MALFORMED] == 1u);
    CHECK(dec.counters[IDL_DECODE_OVERSIZE] == 1u && dec.counters[IDL_FRAME_COUNT_FRAMES] == 1u);
}

static idl_replay_t cache;

static void store(uint32_t seq, uint8_t tag)
{
    uint8_t slot = idl_replay_claim(&cache, seq);
    idl_replay_data(&cache, slot)[0] = tag;
    idl_replay_commit(&cache, slot, seq, seq * 3u, 1u);
}

/* One event of a fed stream: where it came (bytes consumed so far), what, and the frame. */
typedef struct {
    size_t at;
    int ev;
    uint32_t seq;
    uint16_t length;
    uint8_t first;
} event_t;

#define MAX_EVENTS 64u

static size_t stream_bytes(uint8_t *s, size_t cap)
{
    static const uint8_t garbage[] = { 0x00, 0x00, 0x05, 0x01, 0x02, 0x00, 0x03, 0x01, 0x00 };
    size_t n = 0;
    unsigned k;
    for (k = 0; k < VEC_NFRAMES && n + vec_frames[k].wire_len + sizeof garbage < cap; k++) {
        memcpy(s + n, vec_frames[k].wire, vec_frames[k].wire_len);
        n += vec_frames[k].wire_len;
        if (k % 3u == 0u) {
            memcpy(s + n, garbage, sizeof garbage);
            n += sizeof garbage;
        }
    }
    memset(s + n, 0x41, IDL_MAX_ENCODED + 7u); /* oversize: refused once, dropped to the 00 */
    n += IDL_MAX_ENCODED + 7u;
    memcpy(s + n, vec_frames[0].wire, vec_frames[0].wire_len);
    return n + vec_frames[0].wire_len;
}

static unsigned record(event_t *e, unsigned count, size_t at, int ev, const idl_frame_t *f)
{
    if (ev == IDL_FRAME_NONE || count >= MAX_EVENTS) {
        return count;
    }
    e[count].at = at;
    e[count].ev = ev;
    e[count].seq = ev == IDL_FRAME_READY ? f->seq : 0u;
    e[count].length = ev == IDL_FRAME_READY ? f->length : 0u;
    e[count].first = ev == IDL_FRAME_READY && f->length != 0u ? f->payload[0] : 0u;
    return count + 1u;
}

/* Feeding a buffer is feeding its bytes one by one: the same events at the same places, the same
 * frames and counters, whatever the chunks (frames, garbage, empty segments, an oversize run). */
static void test_bulk_feed(void)
{
    static uint8_t s[4 * IDL_WIRE_MAX + 2048u];
    static event_t one[MAX_EVENTS];
    static event_t bulk[MAX_EVENTS];
    static idl_frame_decoder_t d2;
    static const size_t chunks[] = { 1u, 2u, 7u, 64u, 255u, 4096u };
    size_t n = stream_bytes(s, sizeof s);
    unsigned n_one = 0;
    unsigned c;
    size_t i;
    idl_frame_t f;
    idl_frame_decoder_init(&dec);
    for (i = 0; i < n; i++) {
        n_one = record(one, n_one, i + 1u, idl_frame_decoder_feed(&dec, s[i], &f), &f);
    }
    CHECK(n_one > VEC_NFRAMES);
    for (c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        unsigned n_bulk = 0;
        size_t at = 0;
        idl_frame_decoder_init(&d2);
        while (at < n) {
            size_t end = at + chunks[c] < n ? at + chunks[c] : n;
            while (at < end) {
                size_t used = 0;
                int ev = idl_frame_decoder_feed_buf(&d2, s + at, end - at, &used, &f);
                CHECK(used >= 1u && used <= end - at);
                at += used;
                n_bulk = record(bulk, n_bulk, at, ev, &f);
            }
        }
        CHECK(n_bulk == n_one && memcmp(d2.counters, dec.counters, sizeof dec.counters) == 0);
        for (i = 0; i < n_one && i < n_bulk; i++) {
            CHECK(bulk[i].at == one[i].at && bulk[i].ev == one[i].ev && bulk[i].seq == one[i].seq
                  && bulk[i].length == one[i].length && bulk[i].first == one[i].first);
        }
    }
}

/* A payload inside the output buffer (from IDL_FRAME_INPLACE_MIN on) encodes as one apart. */
static void test_encode_in_place(void)
{
    static uint8_t apart[IDL_WIRE_MAX];
    size_t k;
    for (k = 0; k < IDL_MAX_PAYLOAD; k++) {
        payload[k] = (uint8_t)(k % 5u == 0u ? 0u : k);
    }
    for (k = 0; k < 3u; k++) {
        size_t len = k == 0u ? 5u : k == 1u ? 300u : IDL_MAX_PAYLOAD;
        size_t n = idl_frame_encode(apart, IDL_FT_RESPONSE, 0u, 9u, 10u, payload, len);
        size_t m;
        memcpy(wire + IDL_FRAME_INPLACE_MIN, payload, len);
        m = idl_frame_encode(wire, IDL_FT_RESPONSE, 0u, 9u, 10u, wire + IDL_FRAME_INPLACE_MIN,
                             len);
        CHECK(n != 0u && m == n && memcmp(wire, apart, n) == 0);
    }
}

static void test_replay(void)
{
    const uint8_t *answer = NULL;
    uint16_t length = 0;
    uint32_t s;
    idl_replay_init(&cache);
    CHECK(idl_replay_lookup(&cache, 1u, 3u, &answer, &length) == IDL_REPLAY_EVICTED);
    for (s = 1; s <= IDL_REPLAY_SLOTS; s++) {
        store(s, (uint8_t)s);
    }
    store(1u, 0x11u); /* present: replaced and now the newest */
    store(100u, 0x64u); /* full: the oldest (2) goes */
    CHECK(idl_replay_lookup(&cache, 2u, 6u, &answer, &length) == IDL_REPLAY_EVICTED);
    CHECK(idl_replay_lookup(&cache, 1u, 3u, &answer, &length) == IDL_REPLAY_REPLAY);
    CHECK(length == 1u && answer[0] == 0x11u);
    CHECK(idl_replay_lookup(&cache, 1u, 4u, &answer, &length) == IDL_REPLAY_CONFLICT);
    CHECK(idl_replay_lookup(&cache, 100u, 300u, &answer, &length) == IDL_REPLAY_REPLAY);
}

static idl_regs_t regs;
static uint8_t resp[IDL_MB_MAX_PDU];

static uint16_t run(const uint8_t *pdu, uint16_t n) { return idl_modbus_execute(&regs, pdu, n, resp, 0u); }

static void test_registers(void)
{
    static const uint8_t read3[] = { 0x03, 0x00, 0x04, 0x00, 0x03 };
    static const uint8_t set_bad[] = { 0x10, 0x00, 0x04, 0x00, 0x02, 0x04, 0x01, 0x00, 0x00, 0x09 };
    static const uint8_t set_ok[] = { 0x10, 0x00, 0x04, 0x00, 0x02, 0x04, 0x01, 0x00, 0x00, 0x02 };
    static const uint8_t guarded_stale[] = { 0x41, 0x00, 0x00, 0x00, 0x04, 0x00, 0x01, 0x02, 0x00, 0x05 };
    static const uint8_t input_write[] = { 0x06, 0x00, 0x00, 0x00, 0x01 };
    static const uint8_t trigger1[] = { 0x42, 0x00, 0x08, 0x00, 0x01 };
    static const uint8_t unknown[] = { 0x44 };
    uint16_t v = 0;
    idl_regs_init(&regs, 1000u, NULL, NULL, NULL, 0u);
    CHECK(run(read3, sizeof read3) == 8u && resp[1] == 6u && resp[2] == 0x01 && resp[3] == 0x5E);
    CHECK(run(set_bad, sizeof set_bad) == 2u && resp[0] == 0x90 && resp[1] == 3u);
    CHECK(idl_regs_get(&regs, IDL_REG_THRESHOLD, &v) && v == IDL_REG_THRESHOLD_DEFAULT);
    CHECK(run(set_ok, sizeof set_ok) == 5u && regs.generation == 1u);
    CHECK(idl_regs_get(&regs, IDL_REG_THRESHOLD, &v) && v == 256u);
    CHECK(run(guarded_stale, sizeof guarded_stale) == 4u && resp[1] == IDL_STATUS_GUARD_FAILED);
    CHECK(idl_regs_get(&regs, IDL_REG_THRESHOLD, &v) && v == 256u);
    CHECK(run(input_write, sizeof input_write) == 2u && resp[1] == 2u);
    CHECK(run(trigger1, sizeof trigger1) == 5u && resp[3] == 0x00 && resp[4] == 0x00);
    CHECK(run(trigger1, sizeof trigger1) == 5u && resp[3] == 0x01 && resp[4] == 0x01);
    idl_regs_tick(&regs, 1000u);
    CHECK(run(trigger1, sizeof trigger1) == 5u && resp[3] == 0x01 && resp[4] == 0x02);
    CHECK(run(unknown, sizeof unknown) == 2u && resp[0] == 0xC4 && resp[1] == 1u);
    CHECK(run(unknown, 0u) == 2u && resp[0] == 0x80 && resp[1] == 3u);
}

static uint32_t executed_seq; /* the number the last execution ran under */

static uint16_t execute(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *out, uint32_t now,
                        uint32_t seq)
{
    executed_seq = seq;
    return idl_modbus_execute((idl_regs_t *)ctx, pdu, len, out, now);
}

static idl_session_t session;
static const uint8_t map_hash[IDL_MAP_HASH_LEN] = IDL_MAP_HASH_BYTES;

/* Send one frame through the session; the answer, decoded, in *f (0 if none). */
static int exchange(uint8_t type, uint32_t epoch, uint32_t seq, const uint8_t *p, size_t n,
                    idl_frame_t *f)
{
    size_t len = idl_frame_encode(wire, type, 0u, epoch, seq, p, n);
    size_t i;
    size_t out = 0;
    for (i = 0; i < len; i++) {
        size_t k = idl_session_feed(&session, wire[i], 0u);
        if (k != 0u) {
            out = k;
        }
    }
    if (out == 0u) {
        return 0;
    }
    idl_frame_decoder_init(&dec);
    return feed(session.tx, out, f) == IDL_FRAME_READY;
}

static void test_session(void)
{
    static const uint8_t write[] = { 0x06, 0x00, 0x05, 0x00, 0x02 };
    static const uint8_t other[] = { 0x06, 0x00, 0x05, 0x00, 0x00 };
    idl_session_config_t cfg = { execute, &regs, "t", "dev-1", IDL_MAP_NAME, map_hash, 32u
#if IDL_BUS
                                 , 0u, NULL
#endif
    };
    idl_frame_t f;
    const uint32_t epoch = 0x1234u;
    idl_regs_init(&regs, 1000u, NULL, NULL, NULL, 0u);
    idl_session_init(&session, &cfg, epoch);
    CHECK(idl_session_first_seq(&session) == 1u);
    CHECK(exchange(IDL_FT_HELLO, 0u, 77u, NULL, 0u, &f) && f.type == IDL_FT_HELLO_REPLY);
    CHECK(f.seq == 77u && f.epoch == epoch && f.payload[7] == IDL_REPLAY_SLOTS);
    CHECK(idl_session_first_seq(&session) == 1u + IDL_WINDOW_SIZE);
    CHECK(exchange(IDL_FT_REQUEST, epoch, 10u, write, sizeof write, &f) && f.flags == 0u);
    CHECK(f.length == 6u && f.payload[0] == IDL_STATUS_OK && regs.generation == 1u);
    CHECK(executed_seq == 10u);
    CHECK(exchange(IDL_FT_REQUEST, epoch, 10u, write, sizeof write, &f));
    CHECK(f.flags == IDL_FLAG_REPLAY && f.length == 6u && regs.generation == 1u);
    CHECK(exchange(IDL_FT_REQUEST, epoch, 10u, other, sizeof other, &f));
    CHECK(f.length == 1u && f.payload[0] == IDL_STATUS_IDEMPOTENCY_CONFLICT);
    CHECK(exchange(IDL_FT_REQUEST, epoch + 1u, 11u, write, sizeof write, &f));
    CHECK(f.length == 5u && f.payload[0] == IDL_STATUS_EPOCH_MISMATCH && f.payload[1] == 0x35u);
    CHECK(exchange(IDL_FT_REQUEST, epoch, 10u + IDL_WINDOW_SIZE, other, sizeof other, &f));
    CHECK(executed_seq == 10u + IDL_WINDOW_SIZE);
    CHECK(exchange(IDL_FT_REQUEST, epoch, 10u, write, sizeof write, &f));
    CHECK(f.length == 1u && f.payload[0] == IDL_STATUS_TOO_OLD);
    CHECK(!exchange(IDL_FT_RESPONSE, epoch, 12u, write, sizeof write, &f));
    CHECK(session.counters[IDL_DISP_EXECUTED] == 2u && session.counters[IDL_DISP_REPLAYED] == 1u);
    CHECK(session.counters[IDL_DISP_UNEXPECTED] == 1u);
}

#if IDL_BUS
static bool broadcast_ok(void *ctx, const uint8_t *pdu, uint16_t len)
{
    (void)ctx;
    return idl_modbus_broadcast_ok(pdu, len);
}

/* The golden bus streams (tests/vectors/bus_session.json, the Python reference's answers): every
 * answer byte for byte, silence where the reference is silent, the counters at the end. */
static void test_bus_vectors(void)
{
    unsigned k;
    uint32_t i;
#if IDL_REPLAY_SLOTS != VEC_BUS_REPLAY_SLOTS
    printf("bus vectors skipped: built with %u replay slots, the vectors have %u\n",
           (unsigned)IDL_REPLAY_SLOTS, (unsigned)VEC_BUS_REPLAY_SLOTS);
    return;
#endif
    for (k = 0; k < VEC_BUS_NSTREAMS; k++) {
        const vec_bus_stream_t *v = &vec_bus_streams[k];
        idl_session_config_t cfg = { execute, &regs, "idemlink-sim", v->device_id, IDL_MAP_NAME,
                                     map_hash, 32u, v->address, broadcast_ok };
        idl_regs_init(&regs, 2000u, NULL, NULL, NULL, 0u);
        idl_session_init(&session, &cfg, v->epoch);
        for (i = v->first; i < v->first + v->count; i++) {
            const vec_bus_step_t *st = &vec_bus_steps[i];
            uint16_t j;
            size_t out = 0;
            int same = 1;
            for (j = 0; j < st->in_len; j++) {
                size_t n = idl_session_feed(&session, st->in[j], 0u);
                if (n != 0u) {
                    same = same && out == 0u && n == st->out_len
                           && memcmp(session.tx, st->out, n) == 0;
                    out = n;
                }
            }
            if (!(same && out == st->out_len)) {
                printf("bus stream %s, step %s: another answer\n", v->name, st->name);
            }
            CHECK(same && out == st->out_len);
        }
        for (i = v->first_count; i < v->first_count + v->counts; i++) {
            CHECK(session.counters[vec_bus_counts[i].counter] == vec_bus_counts[i].value);
        }
    }
}
#endif

/* The largest DEVICE_INFO (every string at its cap) is exactly IDL_SESSION_HELLO_MAX bytes, and
 * its frame fits the TX buffer: a byte added to HELLO_REPLY without counting it there fails here
 * (and overruns the buffer under the sanitizers). */
#if IDL_AUTH
/* the port's keys and randomness: the stream's, set before its session starts */
static const uint8_t map_hash_key[IDL_KEY_LEN] = { 7 };
static const uint8_t *port_keys;
static unsigned port_nkeys;
static const uint8_t *port_tape;
static size_t port_tape_len;
static size_t port_tape_at;

const uint8_t *idl_port_auth_key(unsigned i)
{
    return i < port_nkeys ? port_keys + (size_t)i * IDL_KEY_LEN : NULL;
}

void idl_port_random(uint8_t *buf, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        buf[i] = port_tape_len != 0u ? port_tape[port_tape_at++ % port_tape_len] : 0u;
    }
}

/* The keyed known answers of the BLAKE2 reference's blake2s-kat.txt (key 00..1f, message
 * 00 01 .. n-1) for n = 0 (the key block is the last), 1, 64 (a full last block) and 255; each
 * whole and cut into three pieces; the digest compared in place with what `out` held. */
static void test_blake2s(void)
{
    static const struct {
        unsigned n;
        uint8_t digest[32];
    } kat[4] = {
        { 0u, { 0x48, 0xA8, 0x99, 0x7D, 0xA4, 0x07, 0x87, 0x6B, 0x3D, 0x79, 0xC0, 0xD9, 0x23, 0x25,
                0xAD, 0x3B, 0x89, 0xCB, 0xB7, 0x54, 0xD8, 0x6A, 0xB7, 0x1A, 0xEE, 0x04, 0x7A, 0xD3,
                0x45, 0xFD, 0x2C, 0x49 } },
        { 1u, { 0x40, 0xD1, 0x5F, 0xEE, 0x7C, 0x32, 0x88, 0x30, 0x16, 0x6A, 0xC3, 0xF9, 0x18, 0x65,
                0x0F, 0x80, 0x7E, 0x7E, 0x01, 0xE1, 0x77, 0x25, 0x8C, 0xDC, 0x0A, 0x39, 0xB1, 0x1F,
                0x59, 0x80, 0x66, 0xF1 } },
        { 64u, { 0x89, 0x75, 0xB0, 0x57, 0x7F, 0xD3, 0x55, 0x66, 0xD7, 0x50, 0xB3, 0x62, 0xB0, 0x89,
                 0x7A, 0x26, 0xC3, 0x99, 0x13, 0x6D, 0xF0, 0x7B, 0xAB, 0xAB, 0xBD, 0xE6, 0x20, 0x3F,
                 0xF2, 0x95, 0x4E, 0xD4 } },
        { 255u, { 0x3F, 0xB7, 0x35, 0x06, 0x1A, 0xBC, 0x51, 0x9D, 0xFE, 0x97, 0x9E, 0x54, 0xC1, 0xEE,
                  0x5B, 0xFA, 0xD0, 0xA9, 0xD8, 0x58, 0xB3, 0x31, 0x5B, 0xAD, 0x34, 0xBD, 0xE9, 0x99,
                  0xEF, 0xD7, 0x24, 0xDD } },
    };
    uint8_t key[32];
    uint8_t msg[255];
    uint8_t out[32];
    idl_piece_t p[3];
    unsigned i;
    unsigned k;
    for (i = 0; i < sizeof msg; i++) {
        msg[i] = (uint8_t)i;
        key[i % 32u] = (uint8_t)(i % 32u);
    }
    for (k = 0; k < 4u; k++) {
        unsigned n = kat[k].n;
        p[0].p = msg;
        p[0].n = n;
        memset(out, 0, sizeof out);
        CHECK(idl_blake2s(out, 32u, key, p, 1u) != 0u); /* out held zeros, not the digest */
        CHECK(memcmp(out, kat[k].digest, 32u) == 0);
        p[0].n = n / 3u; /* three pieces, one of them empty for n < 3 */
        p[1].p = msg + n / 3u;
        p[1].n = n - n / 3u - n / 4u;
        p[2].p = p[1].p + p[1].n;
        p[2].n = n / 4u;
        CHECK(idl_blake2s(out, 32u, key, p, 3u) == 0u); /* out holds the digest already */
        CHECK(memcmp(out, kat[k].digest, 32u) == 0);
        out[31] ^= 1u;
        CHECK(idl_blake2s(out, 32u, key, p, 3u) != 0u); /* one bit off: told, and repaired */
        CHECK(memcmp(out, kat[k].digest, 32u) == 0);
    }
}

/* The keyed golden streams (tests/vectors/auth_session.json, the Python reference's answers):
 * every answer byte for byte, silence where the reference is silent, the counters at the end. */
static void test_auth_vectors(void)
{
    unsigned k;
    uint32_t i;
#if IDL_REPLAY_SLOTS != VEC_AUTH_REPLAY_SLOTS
    printf("auth vectors skipped: built with %u replay slots, the vectors have %u\n",
           (unsigned)IDL_REPLAY_SLOTS, (unsigned)VEC_AUTH_REPLAY_SLOTS);
    return;
#endif
    for (k = 0; k < VEC_AUTH_NSTREAMS; k++) {
        const vec_auth_stream_t *v = &vec_auth_streams[k];
        idl_session_config_t cfg = { execute, &regs, "idemlink-sim", v->device_id, IDL_MAP_NAME,
                                     map_hash, 32u
#if IDL_BUS
                                     , 0u, NULL
#endif
        };
        port_keys = v->keys;
        port_nkeys = v->nkeys;
        port_tape = v->tape;
        port_tape_len = v->tape_len;
        port_tape_at = 0;
        idl_regs_init(&regs, 2000u, NULL, NULL, NULL, 0u);
        idl_session_init(&session, &cfg, v->epoch);
        for (i = v->first; i < v->first + v->count; i++) {
            const vec_auth_step_t *st = &vec_auth_steps[i];
            uint16_t j;
            size_t out = 0;
            int same = 1;
            for (j = 0; j < st->in_len; j++) {
                size_t n = idl_session_feed(&session, st->in[j], 0u);
                if (n != 0u) {
                    same = same && out == 0u && n == st->out_len
                           && memcmp(session.tx, st->out, n) == 0;
                    out = n;
                }
            }
            if (!(same && out == st->out_len)) {
                printf("auth stream %s, step %s: another answer\n", v->name, st->name);
            }
            CHECK(same && out == st->out_len);
        }
        for (i = v->first_count; i < v->first_count + v->counts; i++) {
            const vec_auth_count_t *c = &vec_auth_counts[i];
            uint32_t got = c->decoder ? session.decoder.counters[c->counter]
                                      : session.counters[c->counter];
            if (got != c->value) {
                printf("auth stream %s: counter %u%s is %u, not %u\n", v->name, c->counter,
                       c->decoder ? " (decoder)" : "", (unsigned)got, (unsigned)c->value);
            }
            CHECK(got == c->value);
        }
        CHECK(port_tape_at == port_tape_len); /* every nonce drawn, none more */
    }
    port_nkeys = 0u; /* the other tests' devices are unkeyed */
}
#endif

static void test_hello_bound(void)
{
    static char name[300];
    static char id[IDL_MAX_DEVICE_ID_LEN + 1u];
    static char map_name[300];
#if IDL_BUS
    /* with an address: the bus extension too, the longest HELLO_REPLY */
    idl_session_config_t cfg = { execute, &regs, name, id, map_name, map_hash, 32u, 7u,
                                 broadcast_ok };
#else
    idl_session_config_t cfg = { execute, &regs, name, id, map_name, map_hash, 32u };
#endif
    idl_frame_t f;
    memset(name, 'n', sizeof name - 1u);
    memset(id, 'i', sizeof id - 1u);
    memset(map_name, 'm', sizeof map_name - 1u);
    idl_regs_init(&regs, 1000u, NULL, NULL, NULL, 0u);
#if IDL_AUTH
    /* keyed: the auth extension too */
    port_keys = map_hash_key;
    port_nkeys = 1u;
#endif
    idl_session_init(&session, &cfg, 0x55u);
    CHECK(exchange(IDL_FT_HELLO, 0u, 1u, NULL, 0u, &f) && f.type == IDL_FT_HELLO_REPLY);
    CHECK(f.length == IDL_SESSION_HELLO_MAX);
    CHECK(IDL_FRAME_WIRE_LEN(IDL_HEADER_LEN + IDL_SESSION_HELLO_MAX + IDL_CRC_LEN)
          <= sizeof session.tx);
#if IDL_AUTH
    port_nkeys = 0u;
#endif
}

static idl_rtu_t rtu;

static size_t rtu_bytes(const uint8_t *p, size_t n)
{
    size_t i;
    size_t out = 0;
    for (i = 0; i < n; i++) {
        size_t k = idl_rtu_feed(&rtu, p[i], 0u);
        if (k != 0u) {
            out = k;
        }
    }
    return out;
}

static void test_rtu(void)
{
    static const uint8_t digits[] = "123456789";
    static const uint8_t read_mode[] = { 0x01, 0x03, 0x00, 0x05, 0x00, 0x01, 0x94, 0x0B };
    static const uint8_t other_unit[] = { 0x02, 0x03, 0x00, 0x05, 0x00, 0x01, 0x94, 0x38 };
    static const uint8_t unknown[] = { 0x01, 0x2B, 0x0E, 0x01, 0x00, 0x70, 0x77 };
    /* shared bus, one burst: unit 2's FC03 request, its answer, its exception answer, our read */
    static const uint8_t bus[] = {
        0x02, 0x03, 0x00, 0x00, 0x00, 0x02, 0xC4, 0x38, 0x02, 0x03, 0x04, 0x00,
        0xFA, 0x01, 0xC2, 0x69, 0x03, 0x02, 0x83, 0x02, 0x30, 0xF1, 0x01, 0x03,
        0x00, 0x05, 0x00, 0x01, 0x94, 0x0B
    };
    uint16_t crc;
    CHECK(idl_crc16_modbus(digits, 9u) == 0x4B37u);
    crc = idl_crc16_modbus(unknown, 5u);
    CHECK(unknown[5] == (uint8_t)crc && unknown[6] == (uint8_t)(crc >> 8));
    idl_regs_init(&regs, 1000u, NULL, NULL, NULL, 0u);
    idl_rtu_init(&rtu, &regs, 1u);
    CHECK(rtu_bytes(read_mode, sizeof read_mode) == 7u);
    CHECK(rtu.out[0] == 1u && rtu.out[1] == 3u && rtu.out[2] == 2u && rtu.out[4] == 1u);
    CHECK(rtu_bytes(other_unit, sizeof other_unit) == 0u && rtu.counters[IDL_RTU_OTHER_UNIT] == 1u);
    CHECK(rtu_bytes(unknown, sizeof unknown) == 0u);         /* framed by the pause */
    CHECK(idl_rtu_pause(&rtu, 0u) == 5u && rtu.out[1] == 0xABu && rtu.out[2] == 1u);
    CHECK(rtu_bytes(read_mode, 5u) == 0u && idl_rtu_pause(&rtu, 0u) == 0u); /* cut by a pause */
    CHECK(rtu_bytes(read_mode, sizeof read_mode) == 7u);     /* the next head is sure again */
    CHECK(rtu_bytes(bus, sizeof bus) == 7u && rtu.out[0] == 1u && rtu.out[4] == 1u);
    CHECK(rtu.counters[IDL_RTU_OTHER_ANSWER] == 2u && rtu.counters[IDL_RTU_BAD_CRC] == 0u);
}

static void test_names(void)
{
    static const uint8_t ok[] = "a.txt";
    static const uint8_t overlong[] = { 0xC0, 0xAF };
    static const uint8_t zwsp[] = { 'a', 0xE2, 0x80, 0x8B, 'b' };
    static const uint8_t com_sup[] = { 'C', 'o', 'M', 0xC2, 0xB9, ' ', '.', 'x' };
    static const uint8_t info[] = { 0x45, 0x05, 'a', '.', 't', 'x', 't' };
    static const uint8_t info_bad[] = { 0x45, 0x02, '.', '.' };
    uint8_t out[IDL_MB_FILE_INFO_ANSWER_LEN];
    CHECK(idl_name_check(ok, 5u, 255u) == IDL_NAME_OK);
    CHECK(idl_name_check(ok, 0u, 255u) == IDL_NAME_EMPTY);
    CHECK(idl_name_check(ok, 5u, 4u) == IDL_NAME_TOO_LONG);
    CHECK(idl_name_check(overlong, 2u, 255u) == IDL_NAME_NOT_UTF8);
    CHECK(idl_name_check(zwsp, 5u, 255u) == IDL_NAME_FORMAT_CHAR);
    CHECK(idl_name_check(com_sup, 8u, 255u) == IDL_NAME_RESERVED_DEVICE);
    CHECK(idl_name_check((const uint8_t *)"a:b", 3u, 255u) == IDL_NAME_DRIVE_LETTER);
    CHECK(idl_name_check((const uint8_t *)"a/b", 3u, 255u) == IDL_NAME_PATH_SEPARATOR);
    CHECK(idl_name_check((const uint8_t *)"a. ", 3u, 255u) == IDL_NAME_TRAILING_DOT_SPACE);
    CHECK(idl_file_info_execute(info, sizeof info, out, NULL, NULL) == 10u);
    CHECK(out[0] == 0x45u && out[1] == IDL_MB_FILE_ABSENT && out[5] == 0u && out[9] == 0u);
    CHECK(idl_file_info_execute(info_bad, sizeof info_bad, out, NULL, NULL) == 2u);
    CHECK(out[0] == 0xC5u && out[1] == IDL_MB_EXC_ILLEGAL_DATA_VALUE);
}

int main(void)
{
    test_crc();
    test_frames();
    test_frame_vectors();
    test_refusals();
    test_bulk_feed();
    test_encode_in_place();
    test_replay();
    test_registers();
    test_session();
#if IDL_BUS
    test_bus_vectors();
#endif
#if IDL_AUTH
    test_blake2s();
    test_auth_vectors();
#endif
    test_hello_bound();
    test_rtu();
    test_names();
    printf("idl core: %u checks, %u failures (K=%u, crc table %d, bus %d, auth %d)\n", checks,
           failures, (unsigned)IDL_REPLAY_SLOTS, IDL_CRC32C_TABLE, IDL_BUS, IDL_AUTH);
    return failures == 0u ? 0 : 1;
}
