/**
 * @file idl_frame.h
 * @brief idemlink frames: COBS encoder and streaming decoder, the same rules as
 *        protocol/frame.py and protocol/cobs.py.
 *
 * Frame (little-endian): version u8 | type u8 | flags u8 | epoch u32 | seq u32 | length u16 |
 * [address u8 if IDL_FLAG_ADDRESSED] | payload | [tag 8 or 16 if IDL_FLAG_AUTH] | crc32c u32,
 * sent as 00 COBS(frame) 00. Without ADDRESSED and AUTH, the first contract's frame exactly.
 *
 * Decoder: one fixed buffer of IDL_MAX_ENCODED bytes, fed a byte or a buffer at a time (one scan
 * for the delimiter; a finished segment is COBS-decoded in place in one pass). A 0x00 ends a
 * segment; an empty segment is ignored; a segment that would exceed IDL_MAX_ENCODED is refused
 * OVERSIZE once and the bytes up to the next 0x00 are dropped. A finished segment is checked in
 * this order (the first failing rule is the refusal, counted in `counters`):
 * invalid COBS -> MALFORMED; shorter than header + CRC -> MALFORMED; CRC -> BAD_CRC;
 * version -> UNKNOWN_VERSION; flags outside IDL_KNOWN_FLAGS -> UNKNOWN_FLAGS; AUTH_LONG without
 * AUTH, or the length field (plus address and tag) not equal to the frame's size -> MALFORMED;
 * address 248..255 -> BAD_ADDRESS; type -> UNKNOWN_TYPE. The length field is read only after
 * the CRC passed. A decoded frame's payload (and tag) points into the decoder's buffer and is
 * valid until the next byte is fed.
 *
 * The MAC: with IDL_AUTH=1 and a session key set (`mac_key`, idl_session does it after a keyed
 * HELLO), the tag of every AUTH frame is verified after the address check and before the type
 * (protocol/frame.py parse_raw's order): a tag of another length than IDL_AUTH_TAG_LEN or a wrong
 * one is BAD_MAC; a verified frame has `signer`, the key it verified under (else NULL). Otherwise the tag is exposed, unverified,
 * and idl_session ignores every AUTH frame silently (an unkeyed device), and every ADDRESSED
 * frame unless it is built with IDL_BUS=1 and has an address (idl_session.h, docs/BUS.md).
 */
#ifndef IDL_FRAME_H
#define IDL_FRAME_H

#include "idl_checkreturn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idemlink_proto.h"
#include "idl_auth.h"

#if IDL_HEADER_LEN != 13u || IDL_CRC_LEN != 4u || IDL_OFF_ADDRESS != IDL_HEADER_LEN
#error "idl_frame.c implements the 13-byte header and the 4-byte CRC of protocol version 1"
#endif
#if IDL_MAX_ENCODED < IDL_MAX_FRAME + 1u || IDL_MAX_ENCODED > 65535u
#error "IDL_MAX_ENCODED must hold one COBS-encoded frame and fit in 16 bits"
#endif

/** Bytes of one frame on the wire: delimiter, COBS(frame), delimiter. */
#define IDL_WIRE_MAX (IDL_MAX_ENCODED + 2u)
/** Smallest frame: header and CRC, no payload. */
#define IDL_MIN_FRAME (IDL_HEADER_LEN + IDL_CRC_LEN)

/** Decoder events: 0 nothing yet, IDL_DECODE_* (1..IDL_DECODE_COUNTERS-1) a refusal,
 * IDL_FRAME_READY a frame. IDL_FRAME_READY keeps the value of the first C API (7): the refusals
 * added since (BAD_ADDRESS 8, BAD_MAC 9) skip it, and counters[7] stays unused. */
#define IDL_FRAME_NONE 0
#define IDL_FRAME_READY 7
/* C99 has no static_assert: an array of size -1 stops the build if a refusal takes 7. */
typedef char idl_frame_dir_by_type[(IDL_FT_HELLO == 1 && IDL_FT_HELLO_REPLY == 2
                                    && IDL_FT_REQUEST == 3 && IDL_FT_RESPONSE == 4
                                    && IDL_DIR_HOST_TO_DEVICE == 1 && IDL_DIR_DEVICE_TO_HOST == 2)
                                   ? 1 : -1];
typedef char idl_frame_ready_is_no_refusal[(IDL_DECODE_MALFORMED < IDL_FRAME_READY
                                            && IDL_DECODE_BAD_ADDRESS > IDL_FRAME_READY
                                            && IDL_DECODE_BAD_MAC > IDL_FRAME_READY
                                            && IDL_DECODE_COUNTERS == IDL_DECODE_BAD_MAC + 1)
                                           ? 1 : -1];
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
    uint8_t addressed; /**< 1 if flags & IDL_FLAG_ADDRESSED: `address` is meaningful */
    uint8_t address;   /**< 0 broadcast, 1..247 a device (when addressed) */
    uint8_t tag_len;   /**< 0 without AUTH, else IDL_AUTH_TAG_LEN or IDL_AUTH_TAG_LONG_LEN */
    const uint8_t *tag; /**< the MAC tag (NULL without AUTH) */
#if IDL_AUTH
    const uint8_t *signer; /**< the key the tag verified under (the decoder's mac_key); NULL */
#endif
} idl_frame_t;

/** Streaming decoder state (caller-owned; one per port). */
typedef struct {
    uint32_t counters[IDL_DECODE_COUNTERS]; /**< [0] frames, [IDL_DECODE_*] refusals */
    uint16_t len;         /**< bytes held */
    uint8_t discarding;   /**< dropping bytes until the next 0x00 */
#if IDL_AUTH
    const uint8_t *mac_key; /**< the session key tags are verified with (NULL: none) */
#endif
    uint8_t buf[IDL_MAX_ENCODED];
} idl_frame_decoder_t;

void idl_frame_decoder_init(idl_frame_decoder_t *d);

/** Forget a partial frame (counters kept). */
static inline void idl_frame_decoder_reset(idl_frame_decoder_t *d)
{
    d->len = 0;
    d->discarding = 0;
}

/** Feed `n` bytes at once, in one scan: stops after the byte that makes an event, returned: a
 *  refusal IDL_DECODE_*, or IDL_FRAME_READY with *out filled; *used is the bytes consumed (that
 *  byte included). IDL_FRAME_NONE with *used == n when none came. Feed the rest (data + *used)
 *  after handling the event. Any split of a stream gives the same events at the same bytes. */
IDL_CHECKRETURN int idl_frame_decoder_feed_buf(idl_frame_decoder_t *d, const uint8_t *data,
                                               size_t n, size_t *used, idl_frame_t *out);

/** Feed one byte: IDL_FRAME_NONE, a refusal IDL_DECODE_*, or IDL_FRAME_READY with *out filled. */
IDL_CHECKRETURN static inline int idl_frame_decoder_feed(idl_frame_decoder_t *d, uint8_t byte,
                                                         idl_frame_t *out)
{
    size_t used;
    return idl_frame_decoder_feed_buf(d, &byte, 1u, &used, out);
}

/** `address` of idl_frame_encode_addressed for a point-to-point frame (no ADDRESSED). */
#define IDL_FRAME_NO_ADDRESS 0xFFFFu

/** Bytes on the wire of a frame of `raw` bytes (header, address, payload, tag, CRC) at most: COBS
 *  adds one code byte plus one per full block of 254, then the two delimiters. */
#define IDL_FRAME_WIRE_LEN(raw) ((raw) + (raw) / 254u + 3u)

/** The lowest offset in `wire` a payload may start at and still be encoded in place. */
#define IDL_FRAME_INPLACE_MIN 20u

/**
 * Encode a frame into `wire` (capacity IDL_FRAME_WIRE_LEN of the frame; IDL_WIRE_MAX holds any):
 * 00 COBS(header | [address] | payload | [tag] | crc) 00, with ADDRESSED and the address byte
 * unless `address` is IDL_FRAME_NO_ADDRESS (0 broadcast, 1..247 a device). Each payload byte is
 * read once and written once (no frame assembled first); `payload` may point into `wire` itself
 * at or after offset IDL_FRAME_INPLACE_MIN (it is read before it is overwritten). Returns the wire
 * length, 0 if len > IDL_MAX_PAYLOAD, the address is 248..IDL_FRAME_NO_ADDRESS-1 or `flags` holds
 * a layout flag (ADDRESSED, AUTH, AUTH_LONG: they follow from the address and the key).
 */
#if IDL_AUTH
/** With IDL_AUTH=1: signed with `key` (IDL_KEY_LEN bytes; NULL: unsigned): flag AUTH and the
 *  IDL_AUTH_TAG_LEN-byte tag over direction | header | address | payload. The direction is the
 *  type's: HELLO and REQUEST go from the host to the device, HELLO_REPLY and RESPONSE back
 *  (IDL_FRAME_DIR). */
IDL_CHECKRETURN size_t idl_frame_encode_signed(uint8_t *wire, uint16_t address,
                                               const uint8_t *key, uint8_t type, uint8_t flags,
                                               uint32_t epoch, uint32_t seq,
                                               const uint8_t *payload, size_t len);

/** The direction byte a frame of `type` is signed with: the host's types (HELLO 1, REQUEST 3)
 *  IDL_DIR_HOST_TO_DEVICE, the device's (HELLO_REPLY 2, RESPONSE 4) IDL_DIR_DEVICE_TO_HOST. */
#define IDL_FRAME_DIR(type) ((uint8_t)(2u - ((unsigned)(type) & 1u)))

IDL_CHECKRETURN static inline size_t idl_frame_encode_addressed(uint8_t *wire, uint16_t address,
                                                                uint8_t type, uint8_t flags,
                                                                uint32_t epoch, uint32_t seq,
                                                                const uint8_t *payload,
                                                                size_t len)
{
    return idl_frame_encode_signed(wire, address, NULL, type, flags, epoch, seq, payload, len);
}
#else
IDL_CHECKRETURN size_t idl_frame_encode_addressed(uint8_t *wire, uint16_t address, uint8_t type, uint8_t flags,
                                                  uint32_t epoch, uint32_t seq,
                                                  const uint8_t *payload, size_t len);
#endif

/** A point-to-point frame (the first contract's layout): idl_frame_encode_addressed without an
 * address. */
IDL_CHECKRETURN static inline size_t idl_frame_encode(uint8_t *wire, uint8_t type, uint8_t flags,
                                      uint32_t epoch, uint32_t seq, const uint8_t *payload,
                                      size_t len)
{
    return idl_frame_encode_addressed(wire, IDL_FRAME_NO_ADDRESS, type, flags, epoch, seq,
                                      payload, len);
}


#endif /* IDL_FRAME_H */
