/* The cost of a MAC on the device (make bench-auth): one short frame's tag (a 6-byte FC03
 * request: direction, 13-byte header, payload; two compressions: the key block and the data
 * block), such a frame encoded and signed, and a keyed HELLO (the key id, the device nonce,
 * the session key), each
 * between two marker calls. Built for a Cortex-M0+ and run on QEMU's mps2-an385 with an
 * instruction trace: tools/cycle_model.py counts the instructions between the markers and
 * prices them with the Cortex-M0+ timings (docs in that file). Test-only. */
#include <stdint.h>
#include <stdio.h>

#include "idl_auth.h"
#include "idl_frame.h"

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

int main(void)
{
    static const uint8_t pdu[6] = { 0x03, 0x00, 0x00, 0x00, 0x04, 0x00 };
    static uint8_t raw[13 + 6];
    static uint8_t tag[IDL_AUTH_TAG_LEN];
    static uint8_t wire[IDL_WIRE_MAX];
    static idl_auth_t auth;
    static const uint8_t id[] = { 8, 'b', 'e', 'n', 'c', 'h', '-', 'i', 'd' };
    static uint8_t hello[1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN + 4u];
    int fresh;
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
    idl_blake2s(tag, IDL_AUTH_TAG_LEN, KEY, pieces, 2u);
    idl_mark_end();
    idl_mark_begin(); /* case sign: the same frame encoded, signed, CRC and COBS included */
    n = idl_frame_encode_signed(wire, IDL_FRAME_NO_ADDRESS, KEY, (uint8_t)IDL_FT_RESPONSE, 0u,
                                1u, 2u, pdu, sizeof pdu);
    idl_mark_end();
    idl_auth_init(&auth);
    idl_auth_key_id(hello + 1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN, KEY);
    idl_mark_begin(); /* case hello: a keyed HELLO (the key id, the device nonce, the KDF) */
    fresh = idl_auth_hello(&auth, hello, (uint16_t)sizeof hello, id, 0xFFu);
    idl_mark_end();
    printf("bench_auth wire=%u tag=%02x%02x fresh=%d\n", (unsigned)n, tag[0], tag[1], fresh);
    return 0;
}
