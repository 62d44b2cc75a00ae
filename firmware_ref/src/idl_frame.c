/* Frames: COBS in place, streaming decoder. Rules and order: see idl_frame.h. */
#include "idl_frame.h"

#include <string.h>

#include "idl_crc32c.h"

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

void idl_frame_decoder_init(idl_frame_decoder_t *d) { memset(d, 0, sizeof *d); }

void idl_frame_decoder_reset(idl_frame_decoder_t *d)
{
    d->len = 0;
    d->discarding = 0;
}

int idl_cobs_decode_inplace(uint8_t *buf, size_t n)
{
    size_t i = 0;
    size_t o = 0;
    while (i < n) {
        size_t code = buf[i];
        size_t j = i + code;
        size_t k;
        if (code == 0u || j > n) {
            return -1;
        }
        for (k = i + 1u; k < j; k++) {
            if (buf[k] == 0u) {
                return -1;
            }
            buf[o++] = buf[k];
        }
        if (code != 0xFFu && j != n) { /* a block shorter than 254 ends at a zero */
            buf[o++] = 0u;
        }
        i = j;
    }
    return (int)o;
}

static int parse(idl_frame_decoder_t *d, idl_frame_t *out)
{
    const uint8_t *raw = d->buf;
    int n = idl_cobs_decode_inplace(d->buf, d->len);
    size_t start;
    uint8_t flags;
    if (n < 0 || (size_t)n < IDL_MIN_FRAME) {
        return IDL_DECODE_MALFORMED;
    }
    if (idl_crc32c_update(IDL_CRC_INIT, raw, (size_t)n) != IDL_CRC32C_RESIDUE_REG) {
        return IDL_DECODE_BAD_CRC;
    }
    if (raw[IDL_OFF_VERSION] != IDL_PROTOCOL_VERSION) {
        return IDL_DECODE_UNKNOWN_VERSION;
    }
    flags = raw[IDL_OFF_FLAGS];
    if ((flags & (uint8_t)~IDL_KNOWN_FLAGS) != 0u) {
        return IDL_DECODE_UNKNOWN_FLAGS;
    }
    if ((flags & (uint8_t)IDL_FLAG_AUTH_LONG) != 0u && (flags & (uint8_t)IDL_FLAG_AUTH) == 0u) {
        return IDL_DECODE_MALFORMED;
    }
    out->addressed = (flags & (uint8_t)IDL_FLAG_ADDRESSED) != 0u ? 1u : 0u;
    out->tag_len = (flags & (uint8_t)IDL_FLAG_AUTH) == 0u ? 0u
                   : (flags & (uint8_t)IDL_FLAG_AUTH_LONG) != 0u ? (uint8_t)IDL_AUTH_TAG_LONG_LEN
                   : (uint8_t)IDL_AUTH_TAG_LEN;
    start = IDL_HEADER_LEN + (out->addressed != 0u ? IDL_ADDRESS_LEN : 0u);
    out->length = rd16(raw + IDL_OFF_LENGTH);
    if (start + (size_t)out->length + out->tag_len + IDL_CRC_LEN != (size_t)n) {
        return IDL_DECODE_MALFORMED;
    }
    out->address = out->addressed != 0u ? raw[IDL_OFF_ADDRESS] : 0u;
    if (out->address > (uint8_t)IDL_MAX_ADDRESS) {
        return IDL_DECODE_BAD_ADDRESS;
    }
    out->type = raw[IDL_OFF_TYPE];
    if (out->type < (uint8_t)IDL_FT_HELLO || out->type > (uint8_t)IDL_FT_RESPONSE) {
        return IDL_DECODE_UNKNOWN_TYPE;
    }
    out->flags = flags;
    out->epoch = rd32(raw + IDL_OFF_EPOCH);
    out->seq = rd32(raw + IDL_OFF_SEQ);
    out->payload = raw + start;
    out->tag = out->tag_len != 0u ? raw + start + out->length : NULL;
    return IDL_FRAME_READY;
}

int idl_frame_decoder_feed(idl_frame_decoder_t *d, uint8_t byte, idl_frame_t *out)
{
    int ev;
    if (byte != 0u) {
        if (d->discarding) {
            return IDL_FRAME_NONE;
        }
        if (d->len >= IDL_MAX_ENCODED) {
            d->len = 0;
            d->discarding = 1u;
            d->counters[IDL_DECODE_OVERSIZE]++;
            return IDL_DECODE_OVERSIZE;
        }
        d->buf[d->len++] = byte;
        return IDL_FRAME_NONE;
    }
    if (d->discarding || d->len == 0u) {
        d->discarding = 0;
        return IDL_FRAME_NONE;
    }
    ev = parse(d, out);
    d->len = 0;
    d->counters[ev == IDL_FRAME_READY ? IDL_FRAME_COUNT_FRAMES : (unsigned)ev]++;
    return ev;
}

size_t idl_frame_encode_addressed(uint8_t *wire, uint16_t address, uint8_t type, uint8_t flags,
                                  uint32_t epoch, uint32_t seq, const uint8_t *payload,
                                  size_t len)
{
    /* The raw frame is assembled at the end of `wire` and COBS-encoded forwards in place: the
     * output after k input bytes is at most 1 + k + (k / 254 + 1), which stays behind the input
     * as long as the raw frame starts at offset >= 2 + IDL_MAX_FRAME / 254 (checked below). */
    size_t start = IDL_HEADER_LEN;
    size_t raw_len;
    size_t s;
    size_t i;
    size_t o;
    size_t code_at;
    uint8_t code;
    uint8_t *raw;
    uint32_t crc;
    if (len > IDL_MAX_PAYLOAD || (flags & (uint8_t)IDL_LAYOUT_FLAGS) != 0u) {
        return 0;
    }
    if (address != IDL_FRAME_NO_ADDRESS) {
        if (address > IDL_MAX_ADDRESS) {
            return 0;
        }
        start += IDL_ADDRESS_LEN;
        flags |= (uint8_t)IDL_FLAG_ADDRESSED;
    }
    raw_len = start + len + IDL_CRC_LEN;
    s = IDL_WIRE_MAX - raw_len;
    raw = wire + s;
    /* memmove by hand (no libc memmove): the payload may sit in `wire` before or after its
     * place, so copy away from the overlap; a byte loop, not a call */
    if ((uintptr_t)payload < (uintptr_t)(raw + start)) {
        for (i = len; i-- > 0u;) {
            raw[start + i] = payload[i];
        }
    } else {
        for (i = 0; i < len; i++) {
            raw[start + i] = payload[i];
        }
    }
    raw[IDL_OFF_VERSION] = (uint8_t)IDL_PROTOCOL_VERSION;
    raw[IDL_OFF_TYPE] = type;
    raw[IDL_OFF_FLAGS] = flags;
    wr32(raw + IDL_OFF_EPOCH, epoch);
    wr32(raw + IDL_OFF_SEQ, seq);
    raw[IDL_OFF_LENGTH] = (uint8_t)len;
    raw[IDL_OFF_LENGTH + 1u] = (uint8_t)(len >> 8);
    if (start != IDL_HEADER_LEN) {
        raw[IDL_OFF_ADDRESS] = (uint8_t)address;
    }
    crc = idl_crc32c(raw, start + len);
    wr32(raw + start + len, crc);

    wire[0] = 0u;
    code_at = 1u;
    o = 2u;
    code = 1u;
    for (i = 0; i < raw_len; i++) {
        uint8_t b = wire[s + i];
        if (b != 0u) {
            wire[o++] = b;
            code++;
        }
        if (b == 0u || code == 0xFFu) { /* a zero, or a full block of 254: close the block */
            wire[code_at] = code;
            code_at = o++;
            code = 1u;
        }
    }
    wire[code_at] = code;
    wire[o++] = 0u;
    return o;
}

typedef char idl_frame_inplace_room[(IDL_WIRE_MAX - IDL_MAX_FRAME >= 3u + IDL_MAX_FRAME / 254u)
                                    ? 1 : -1];
