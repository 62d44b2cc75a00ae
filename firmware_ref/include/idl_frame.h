/**
 * @file idl_frame.h
 * @brief idemlink frames: COBS encoder and streaming decoder, the same rules as
 *        protocol/frame.py and protocol/cobs.py.
 *
 * Frame (little-endian): version u8 | type u8 | flags u8 | epoch u32 | seq u32 | length u16 |
 * payload | crc32c u32, sent as 00 COBS(frame) 00.
 *
 * Decoder: one fixed buffer of IDL_MAX_ENCODED bytes, fed one byte at a time. A 0x00 ends a
 * segment; an empty segment is ignored; a segment that would exceed IDL_MAX_ENCODED is refused
 * OVERSIZE once and the bytes up to the next 0x00 are dropped. A finished segment is checked in
 * this order (the first failing rule is the refusal, counted in `counters`):
 * invalid COBS -> MALFORMED; shorter than header + CRC -> MALFORMED; CRC -> BAD_CRC;
 * version -> UNKNOWN_VERSION; flags outside IDL_KNOWN_FLAGS -> UNKNOWN_FLAGS; length field not
 * equal to the frame's size -> MALFORMED; type -> UNKNOWN_TYPE. The length field is read only
 * after the CRC passed. A decoded frame's payload points into the decoder's buffer and is valid
 * until the next byte is fed.
 */
#ifndef IDL_FRAME_H
#define IDL_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idemlink_proto.h"

#if IDL_HEADER_LEN != 13u || IDL_CRC_LEN != 4u
#error "idl_frame.c implements the 13-byte header and the 4-byte CRC of protocol version 1"
#endif
#if IDL_MAX_ENCODED < IDL_MAX_FRAME + 1u || IDL_MAX_ENCODED > 65535u
#error "IDL_MAX_ENCODED must hold one COBS-encoded frame and fit in 16 bits"
#endif

/** Bytes of one frame on the wire: delimiter, COBS(frame), delimiter. */
#define IDL_WIRE_MAX (IDL_MAX_ENCODED + 2u)
/** Smallest frame: header and CRC, no payload. */
#define IDL_MIN_FRAME (IDL_HEADER_LEN + IDL_CRC_LEN)

/** Decoder events: 0 nothing yet, IDL_DECODE_* (1..6) a refusal, IDL_FRAME_READY a frame. */
#define IDL_FRAME_NONE 0
#define IDL_FRAME_READY 7
/** Index of the frames counter in idl_frame_decoder_t.counters (the others: IDL_DECODE_*). */
#define IDL_FRAME_COUNT_FRAMES 0u

/** A checked frame. `payload` points into the decoder (valid until the next byte). */
typedef struct {
    uint8_t type;
    uint8_t flags;
    uint16_t length;
    uint32_t epoch;
    uint32_t seq;
    const uint8_t *payload;
} idl_frame_t;

/** Streaming decoder state (caller-owned; one per port). */
typedef struct {
    uint32_t counters[7]; /**< [0] frames, [IDL_DECODE_*] refusals */
    uint16_t len;         /**< bytes held */
    uint8_t discarding;   /**< dropping bytes until the next 0x00 */
    uint8_t buf[IDL_MAX_ENCODED];
} idl_frame_decoder_t;

void idl_frame_decoder_init(idl_frame_decoder_t *d);

/** Forget a partial frame (counters kept). */
void idl_frame_decoder_reset(idl_frame_decoder_t *d);

/** Feed one byte: IDL_FRAME_NONE, a refusal IDL_DECODE_*, or IDL_FRAME_READY with *out filled. */
int idl_frame_decoder_feed(idl_frame_decoder_t *d, uint8_t byte, idl_frame_t *out);

/**
 * Encode a frame into `wire` (capacity IDL_WIRE_MAX): 00 COBS(header | payload | crc) 00.
 * `payload` may point into `wire` itself at or after offset IDL_WIRE_MAX - IDL_CRC_LEN - len
 * (it is moved into place first). Returns the wire length, 0 if len > IDL_MAX_PAYLOAD.
 */
size_t idl_frame_encode(uint8_t *wire, uint8_t type, uint8_t flags, uint32_t epoch,
                        uint32_t seq, const uint8_t *payload, size_t len);

/** COBS decode in place (out <= in); returns the decoded length or -1 for invalid COBS. */
int idl_cobs_decode_inplace(uint8_t *buf, size_t n);

#endif /* IDL_FRAME_H */
