/* Frames: COBS in place, streaming decoder. Rules and order: see idl_frame.h. */
#include "idl_frame.h"

#include <string.h>

#include "idl_crc32c.h"
#include "idl_small.h"

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

/* COBS decode of a whole segment in place, in one pass over it, block by block: a segment holds no
 * zero (the zeros delimit it), so only the block lengths can be wrong. -1 for invalid COBS. */
static int cobs_segment(uint8_t *buf, size_t n)
{
    size_t i = 0;
    size_t o = 0;
    while (i < n) {
        size_t code = buf[i];
        size_t j = i + code;
        if (j > n) {
            return -1;
        }
        for (i++; i < j; i++) {
            buf[o++] = buf[i];
        }
        if (code != 0xFFu && j != n) { /* a block shorter than 254 ends at a zero */
            buf[o++] = 0u;
        }
    }
    return (int)o;
}

static int parse(idl_frame_decoder_t *d, idl_frame_t *out)
{
    uint8_t *raw = d->buf;
    int n = cobs_segment(d->buf, d->len);
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
    out->payload = raw + start;
    out->tag = out->tag_len != 0u ? raw + start + out->length : NULL;
#if IDL_AUTH
    out->signer = NULL;
    if (d->mac_key != NULL && out->tag != NULL) { /* the MAC, before anything else is read */
        /* BLAKE2s-64 keyed with the session key over the direction and every byte before the
         * tag (protocol/frame.py frame_mac), written over the tag received and compared with it
         * in passing */
        static const uint8_t DIR_IN = (uint8_t)IDL_DIR_HOST_TO_DEVICE;
        idl_piece_t covered[2];
        covered[0].p = &DIR_IN;
        covered[0].n = 1u;
        covered[1].p = raw;
        covered[1].n = start + out->length;
        if (out->tag_len != IDL_AUTH_TAG_LEN
            || idl_blake2s(raw + start + out->length, IDL_AUTH_TAG_LEN, d->mac_key, covered,
                           2u) != 0u) {
            return IDL_DECODE_BAD_MAC;
        }
        out->signer = d->mac_key;
    }
#endif
    out->type = raw[IDL_OFF_TYPE];
    if (out->type < (uint8_t)IDL_FT_HELLO || out->type > (uint8_t)IDL_FT_RESPONSE) {
        return IDL_DECODE_UNKNOWN_TYPE;
    }
    out->flags = flags;
    out->epoch = rd32(raw + IDL_OFF_EPOCH);
    out->seq = rd32(raw + IDL_OFF_SEQ);
    return IDL_FRAME_READY;
}

/* A finished segment (its delimiter seen): the event, counted. */
static int segment_end(idl_frame_decoder_t *d, idl_frame_t *out)
{
    int ev = parse(d, out);
    d->len = 0;
    d->counters[ev == IDL_FRAME_READY ? IDL_FRAME_COUNT_FRAMES : (unsigned)ev]++;
    return ev;
}

/* One byte more than the buffer holds: refused once, the rest up to the next 00 dropped. */
static int oversize(idl_frame_decoder_t *d, size_t i, size_t *used)
{
    d->len = 0;
    d->discarding = 1u;
    d->counters[IDL_DECODE_OVERSIZE]++;
    *used = i;
    return IDL_DECODE_OVERSIZE;
}

int idl_frame_decoder_feed_buf(idl_frame_decoder_t *d, const uint8_t *data, size_t n,
                               size_t *used, idl_frame_t *out)
{
    size_t i = 0;
    while (i < n) {
#if IDL_SMALL_CODE
        /* the byte rule in a loop: the least code */
        uint8_t b = data[i++];
        if (b != 0u) {
            if (d->discarding) {
                continue;
            }
            if (d->len >= IDL_MAX_ENCODED) {
                return oversize(d, i, used);
            }
            d->buf[d->len++] = b;
            continue;
        }
#else
        /* one scan: copy up to the delimiter or until the buffer is full (while discarding,
         * skip to the delimiter) */
        if (d->discarding) {
            while (i < n && data[i] != 0u) {
                i++;
            }
        } else {
            size_t room = (size_t)IDL_MAX_ENCODED - d->len;
            size_t end = n - i < room ? n : i + room;
            uint8_t *dst = d->buf + d->len - i;
            size_t k = i;
            while (k < end && data[k] != 0u) {
                dst[k] = data[k];
                k++;
            }
            d->len = (uint16_t)(d->len + (k - i));
            i = k;
        }
        if (i == n) {
            break;
        }
        if (data[i++] != 0u) {
            return oversize(d, i, used);
        }
#endif
        /* a delimiter */
        if (d->discarding || d->len == 0u) { /* the end of a discard, or an empty segment */
            d->discarding = 0;
            continue;
        }
        *used = i;
        return segment_end(d, out);
    }
    *used = n;
    return IDL_FRAME_NONE;
}

/* COBS encoding, streamed from several pieces into one output: a block's code byte is reserved
 * at `code_at` and filled when the block closes (at a zero, or after 254 non-zero bytes). */
typedef struct {
    uint8_t *wire;
    size_t o;
    size_t code_at;
    uint8_t code;
} cobs_out_t;

static void cobs_put(cobs_out_t *c, const uint8_t *p, size_t n)
{
    uint8_t *wire = c->wire;
    size_t o = c->o;
    size_t code_at = c->code_at;
    uint8_t code = c->code;
    size_t i;
    for (i = 0; i < n; i++) {
        uint8_t b = p[i];
        if (b != 0u) {
            wire[o++] = b;
            if (++code != 0xFFu) {
                continue;
            }
        }
        wire[code_at] = code; /* a zero, or a full block of 254: close the block */
        code_at = o++;
        code = 1u;
    }
    c->o = o;
    c->code_at = code_at;
    c->code = code;
}

#if IDL_AUTH
size_t idl_frame_encode_signed(uint8_t *wire, uint16_t address, const uint8_t *key,
                               uint8_t type, uint8_t flags, uint32_t epoch, uint32_t seq,
                               const uint8_t *payload, size_t len)
#else
size_t idl_frame_encode_addressed(uint8_t *wire, uint16_t address, uint8_t type, uint8_t flags,
                                  uint32_t epoch, uint32_t seq, const uint8_t *payload,
                                  size_t len)
#endif
{
    /* The header (and address) and the CRC are built apart and COBS-encoded with the payload
     * straight into `wire`: each byte is read once and written once, no frame assembled first.
     * The output after k input bytes is at most 2 + k + k / 254, so a payload in `wire` at or
     * after IDL_FRAME_INPLACE_MIN is read before it is overwritten. With IDL_AUTH the header
     * follows the direction byte the tag covers first (one piece with it). */
    uint8_t dir_head[IDL_AUTH + IDL_HEADER_LEN + IDL_ADDRESS_LEN];
    uint8_t *head = dir_head + IDL_AUTH;
#if IDL_AUTH
    uint8_t trailer[IDL_AUTH_TAG_LEN + IDL_CRC_LEN]; /* the tag, then the CRC */
    size_t tag = 0;
#else
    uint8_t trailer[IDL_CRC_LEN];
    enum { tag = 0 };
#endif
    size_t start = IDL_HEADER_LEN;
    uint32_t crc;
    cobs_out_t c;
    if (len > IDL_MAX_PAYLOAD || (flags & (uint8_t)IDL_LAYOUT_FLAGS) != 0u) {
        return 0;
    }
    if (address != IDL_FRAME_NO_ADDRESS) {
        if (address > IDL_MAX_ADDRESS) {
            return 0;
        }
        start += IDL_ADDRESS_LEN;
        flags |= (uint8_t)IDL_FLAG_ADDRESSED;
        head[IDL_OFF_ADDRESS] = (uint8_t)address;
    }
#if IDL_AUTH
    if (key != NULL) {
        flags |= (uint8_t)IDL_FLAG_AUTH;
        tag = IDL_AUTH_TAG_LEN;
    }
#endif
    head[IDL_OFF_VERSION] = (uint8_t)IDL_PROTOCOL_VERSION;
    head[IDL_OFF_TYPE] = type;
    head[IDL_OFF_FLAGS] = flags;
    wr32(head + IDL_OFF_EPOCH, epoch);
    wr32(head + IDL_OFF_SEQ, seq);
    head[IDL_OFF_LENGTH] = (uint8_t)len;
    head[IDL_OFF_LENGTH + 1u] = (uint8_t)(len >> 8);
#if IDL_AUTH
    if (tag != 0u) { /* the tag over dir | head | payload, read where they lie */
        idl_piece_t pieces[2];
        dir_head[0] = IDL_FRAME_DIR(type);
        pieces[0].p = dir_head;
        pieces[0].n = 1u + start;
        pieces[1].p = payload;
        pieces[1].n = len;
        (void)idl_blake2s(trailer, IDL_AUTH_TAG_LEN, key, pieces, 2u);
    }
#endif
    crc = idl_crc32c_update(idl_crc32c_update(IDL_CRC_INIT, head, start), payload, len);
#if IDL_AUTH
    crc = idl_crc32c_update(crc, trailer, tag); /* the CRC covers the tag */
#endif
    wr32(trailer + tag, crc ^ IDL_CRC_XOROUT);
    wire[0] = 0u;
    c.wire = wire;
    c.code_at = 1u;
    c.o = 2u;
    c.code = 1u;
    cobs_put(&c, head, start);
    cobs_put(&c, payload, len);
    cobs_put(&c, trailer, tag + IDL_CRC_LEN);
    wire[c.code_at] = c.code;
    wire[c.o] = 0u;
    return c.o + 1u;
}

/* the in-place rule above: 2 + header + address + the largest payload's extra code bytes */
typedef char idl_frame_inplace_min[(IDL_FRAME_INPLACE_MIN
                                    >= 2u + IDL_HEADER_LEN + IDL_ADDRESS_LEN
                                           + (IDL_HEADER_LEN + IDL_ADDRESS_LEN + IDL_MAX_PAYLOAD)
                                                 / 254u)
                                   ? 1 : -1];
typedef char idl_frame_wire_len_is_the_contracts[(IDL_FRAME_WIRE_LEN(IDL_MAX_FRAME) == IDL_WIRE_MAX)
                                                ? 1 : -1];
