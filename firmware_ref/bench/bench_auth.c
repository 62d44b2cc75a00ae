/* The cost of a MAC on the device (make bench-auth): one short frame's tag (a 6-byte FC03
 * request: direction, 13-byte header, payload; two compressions: the key block and the data
 * block), such a frame encoded and signed, and a keyed HELLO through the session (decoded, the
 * key id, the device nonce, the session key, the HELLO_REPLY built and signed), each
 * between two marker calls. Built for a Cortex-M0+ and run on QEMU's mps2-an385 with an
 * instruction trace: tools/cycle_model.py counts the instructions between the markers and
 * prices them with the Cortex-M0+ timings (docs in that file). Test-only. */
#include <stdint.h>
#include <stdio.h>

#include "idl_auth.h"
#include "idl_frame.h"
#include "idl_session.h"

void idl_mark_begin(void);
void idl_mark_end(void);
/* out-of-line and visible: the trace finds them by name */
__attribute__((noinline)) void idl_mark_begin(void) { __asm__ volatile(""); }
__attribute__((noinline)) void idl_mark_end(void) { __asm__ volatile(""); }

/* the port's keys and randomness, fixed (only the costs matter here) */
static const uint8_t KEY[IDL_KEY_LEN] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                         17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
                                         31, 32 };
const uint8_t *idl_port_auth_key(unsigned i) { return i == 0u ? KEY : NULL; }
void idl_port_random(uint8_t *buf, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        buf[i] = (uint8_t)(i * 37u + 1u);
    }
}

static uint16_t execute(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *resp, uint32_t now,
                        uint32_t seq)
{
    (void)ctx;
    (void)pdu;
    (void)len;
    (void)resp;
    (void)now;
    (void)seq;
    return 0;
}

int main(void)
{
    static const uint8_t pdu[6] = { 0x03, 0x00, 0x00, 0x00, 0x04, 0x00 };
    static uint8_t raw[13 + 6];
    static uint8_t tag[IDL_AUTH_TAG_LEN];
    static uint8_t wire[IDL_WIRE_MAX];
    static idl_session_t session;
    static const uint8_t map_hash[IDL_MAP_HASH_LEN] = { 0 };
    static const idl_session_config_t cfg = { execute, NULL, "bench", "bench-id", "bench-map",
                                              map_hash, 8u };
    static const uint8_t contract[IDL_CONTRACT_HASH_LEN] = IDL_CONTRACT_HASH_BYTES;
    static uint8_t hello[1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN + 4u];
    size_t reply;
    size_t used;
    static const uint8_t dir = (uint8_t)IDL_DIR_HOST_TO_DEVICE;
    idl_piece_t pieces[2];
    size_t i;
    size_t n;
    for (i = 0; i < sizeof raw; i++) {
        raw[i] = (uint8_t)(i < 13u ? i : pdu[i - 13u]);
    }
    pieces[0].p = &dir;
    pieces[0].n = 1u;
    pieces[1].p = raw;
    pieces[1].n = sizeof raw;
    idl_mark_begin(); /* case tag: one short frame's tag */
    (void)idl_blake2s(tag, IDL_AUTH_TAG_LEN, KEY, pieces, 2u);
    idl_mark_end();
    idl_mark_begin(); /* case sign: the same frame encoded, signed, CRC and COBS included */
    n = idl_frame_encode_signed(wire, IDL_FRAME_NO_ADDRESS, KEY, (uint8_t)IDL_FT_RESPONSE, 0u,
                                1u, 2u, pdu, sizeof pdu);
    idl_mark_end();
    hello[0] = (uint8_t)IDL_PROTOCOL_VERSION;
    for (i = 0; i < IDL_CONTRACT_HASH_LEN; i++) {
        hello[1u + i] = contract[i];
    }
    idl_auth_key_id(hello + 1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN, KEY);
    idl_session_init(&session, &cfg, 1u);
    n = idl_frame_encode(wire, (uint8_t)IDL_FT_HELLO, 0u, 0u, 1u, hello, sizeof hello);
    idl_mark_begin(); /* case hello: a keyed HELLO through the session, its reply signed */
    reply = idl_session_feed_buf(&session, wire, n, &used, 0u);
    idl_mark_end();
    printf("bench_auth wire=%u tag=%02x%02x reply=%u session=%d\n", (unsigned)n, tag[0], tag[1],
           (unsigned)reply, session.keyed == 2u);
    return 0;
}
