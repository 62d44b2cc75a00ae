/* Modbus RTU slave: see idl_rtu.h. */
#include "idl_rtu.h"

#include <stdbool.h>
#include <string.h>

#define NEED_MORE (-1)
#define UNKNOWN_LENGTH (-2)
#define IMPLAUSIBLE (-3)
#define MIN_FRAME 4u

/* What a view of the head (read as a request, or as another slave's answer) is now: a complete
 * CRC-valid length (> 0), or one of these. */
#define VIEW_DEAD 0
#define VIEW_WAIT (-1)  /* its declared length is not reached yet */
#define VIEW_PAUSE (-2) /* its function tells no length: the next pause ends it */

/* r->views: what is known of the head's views (cleared when the head moves) */
#define REQ_DEAD 1u
#define REQ_BAD_CRC 2u
#define ANS_DEAD 4u

/* CRC-16/MODBUS of each nibble (reflected polynomial 0xA001): two lookups a byte instead of eight
 * shifts, for 32 bytes of table */
static const uint16_t CRC16_NIBBLE[16] = {
    0x0000u, 0xCC01u, 0xD801u, 0x1400u, 0xF001u, 0x3C00u, 0x2800u, 0xE401u,
    0xA001u, 0x6C00u, 0x7800u, 0xB401u, 0x5000u, 0x9C01u, 0x8801u, 0x4400u
};

uint16_t idl_crc16_modbus(const uint8_t *data, size_t n)
{
    unsigned crc = 0xFFFFu;
    size_t i;
    for (i = 0; i < n; i++) {
        crc ^= data[i];
        crc = (crc >> 4) ^ CRC16_NIBBLE[crc & 15u];
        crc = (crc >> 4) ^ CRC16_NIBBLE[crc & 15u];
    }
    return (uint16_t)crc;
}

void idl_rtu_init(idl_rtu_t *r, idl_regs_t *regs, uint8_t unit)
{
    unsigned i;
    r->regs = regs;
    for (i = 0; i < IDL_RTU_COUNTERS; i++) {
        r->counters[i] = 0;
    }
    r->len = 0;
    r->unit = unit;
    r->hunting = 0;
    r->views = 0;
}

/* Declared length of the request at the head, NEED_MORE, UNKNOWN_LENGTH or IMPLAUSIBLE. */
static int request_length(const uint8_t *b, uint16_t len)
{
    uint16_t at;
    uint16_t quantity;
    uint16_t need;
    if (len < 2u) {
        return NEED_MORE;
    }
    switch (b[1]) {
    case 0x01: case 0x02: case 0x03: case 0x04: case 0x05: case 0x06: case IDL_MB_FC_TRIGGER:
        return 8;
    case 0x0F: case 0x10: at = 6u; break;
    case IDL_MB_FC_WRITE_IF_GENERATION: at = 8u; break;
    case 0x17: at = 10u; break;
    default:
        return UNKNOWN_LENGTH;
    }
    if (len <= at) {
        return NEED_MORE;
    }
    quantity = (uint16_t)((b[at - 2u] << 8) | b[at - 1u]);
    need = b[1] == 0x0Fu ? (uint16_t)((quantity + 7u) >> 3) : (uint16_t)(2u * quantity);
    if (quantity == 0u || b[at] != need) {
        return IMPLAUSIBLE;
    }
    return (int)(b[at] + at + 3u);
}

/* Declared length of another slave's answer at the head (protocol/modbus_rtu.py
 * response_frame_length with _answer_head_plausible): NEED_MORE, UNKNOWN_LENGTH or IMPLAUSIBLE. */
static int answer_length(const uint8_t *b, uint16_t len)
{
    if (len < 2u) {
        return NEED_MORE;
    }
    if ((b[1] & 0x80u) != 0u) {
        return 5; /* exception answer */
    }
    switch (b[1]) {
    case 0x01: case 0x02: case 0x03: case 0x04: case 0x17:
        if (len < 3u) {
            return NEED_MORE;
        }
        if (b[2] < 1u || b[2] > 250u || (b[1] > 0x02u && (b[2] < 2u || (b[2] & 1u) != 0u))) {
            return IMPLAUSIBLE;
        }
        return (int)b[2] + 5;
    case 0x05: case 0x06: case 0x0F: case 0x10: case IDL_MB_FC_TRIGGER:
        return 8;
    case IDL_MB_FC_WRITE_IF_GENERATION:
        return 7;
    default:
        return UNKNOWN_LENGTH;
    }
}

static bool crc_ok(const uint8_t *b, uint16_t n)
{
    uint16_t crc = idl_crc16_modbus(b, (size_t)n - 2u);
    return b[n - 2u] == (uint8_t)crc && b[n - 1u] == (uint8_t)(crc >> 8);
}

/* The view of declared length n (or a code of the length functions) over the bytes buffered;
 * `cut`: a pause follows them, so a view still waiting is dead. A complete view with a wrong CRC
 * stays dead (flag `dead`) until the head moves. */
static int view(idl_rtu_t *r, int n, uint16_t max, uint8_t dead, bool cut)
{
    if ((r->views & dead) != 0u || n == IMPLAUSIBLE || n == UNKNOWN_LENGTH || n > (int)max) {
        return VIEW_DEAD;
    }
    if (n == NEED_MORE || n > (int)r->len) {
        return cut ? VIEW_DEAD : VIEW_WAIT;
    }
    if ((unsigned)n < MIN_FRAME) {
        r->views = (uint8_t)(r->views | dead);
        return VIEW_DEAD;
    }
    if (crc_ok(r->buf, (uint16_t)n)) {
        return n;
    }
    r->views = (uint8_t)(r->views | dead | (dead == REQ_DEAD ? REQ_BAD_CRC : 0u));
    return VIEW_DEAD;
}

/* The first n bytes are done with: the byte after them is the next head. */
static void consume(idl_rtu_t *r, uint16_t n)
{
    r->len = (uint16_t)(r->len - n);
    memmove(r->buf, r->buf + n, r->len);
    r->views = 0;
}

static void drop(idl_rtu_t *r, bool hunt)
{
    r->counters[IDL_RTU_DROPPED] += r->len;
    r->len = 0;
    r->views = 0;
    r->hunting = hunt ? 1u : 0u;
}

/* The CRC-valid request buf[0..n): unit filter, execute; returns the answer length. */
static size_t take(idl_rtu_t *r, uint16_t n, uint32_t now)
{
    uint8_t unit = r->buf[0];
    uint16_t pdu_len;
    uint16_t crc;
    if (unit != r->unit && unit != IDL_RTU_BROADCAST) {
        r->counters[IDL_RTU_OTHER_UNIT]++;
        consume(r, n);
        return 0;
    }
    pdu_len = idl_modbus_execute(r->regs, r->buf + 1, (uint16_t)(n - 3u), r->out + 1, now);
    consume(r, n);
    if (unit == IDL_RTU_BROADCAST) {
        r->counters[IDL_RTU_BROADCASTS]++;
        return 0;
    }
    r->out[0] = unit;
    crc = idl_crc16_modbus(r->out, (size_t)pdu_len + 1u);
    r->out[pdu_len + 1u] = (uint8_t)crc;
    r->out[pdu_len + 2u] = (uint8_t)(crc >> 8);
    r->counters[IDL_RTU_ANSWERED]++;
    return (size_t)pdu_len + 3u;
}

/* Frame what is buffered (`cut`: a pause follows it): requests are taken, other slaves' answers
 * skipped, a failed head dropped. Stops at the first answer to send; bytes after it stay. */
static size_t advance(idl_rtu_t *r, uint32_t now, bool cut)
{
    while (r->len != 0u) {
        int req;
        int ans = VIEW_DEAD;
        int n = request_length(r->buf, r->len);
        if (n != UNKNOWN_LENGTH) {
            req = view(r, n, IDL_RTU_MAX_REQUEST, REQ_DEAD, cut);
        } else if (r->len > IDL_RTU_MAX_FRAME) {
            req = VIEW_DEAD;
        } else if (!cut) {
            req = VIEW_PAUSE;
        } else {
            req = view(r, (int)r->len, IDL_RTU_MAX_FRAME, REQ_DEAD, true);
        }
        if (r->buf[0] != r->unit) {
            ans = view(r, answer_length(r->buf, r->len), IDL_RTU_MAX_FRAME, ANS_DEAD, cut);
        }
        if (req > 0) {
            size_t out = take(r, (uint16_t)req, now);
            if (out != 0u) {
                return out;
            }
        } else if (ans > 0 && req != VIEW_WAIT) {
            r->counters[IDL_RTU_OTHER_ANSWER]++;
            consume(r, (uint16_t)ans);
        } else if (req == VIEW_WAIT || req == VIEW_PAUSE || ans != VIEW_DEAD) {
            return 0;
        } else {
            if ((r->views & REQ_BAD_CRC) != 0u) {
                r->counters[IDL_RTU_BAD_CRC]++;
            }
            drop(r, !cut); /* up to the next pause */
        }
    }
    return 0;
}

size_t idl_rtu_feed(idl_rtu_t *r, uint8_t byte, uint32_t now)
{
    if (r->hunting) {
        r->counters[IDL_RTU_DROPPED]++;
        return 0;
    }
    if (r->len >= sizeof r->buf) {
        drop(r, true);
        r->counters[IDL_RTU_DROPPED]++;
        return 0;
    }
    r->buf[r->len++] = byte;
    return advance(r, now, false);
}

size_t idl_rtu_pause(idl_rtu_t *r, uint32_t now)
{
    size_t out = advance(r, now, true);
    drop(r, false); /* bytes behind an answer in the same burst: cut by this pause */
    return out;
}

/* ---- line timing: done once at start-up, so a 32-bit division is fine on an M0+ ------------- */

static uint32_t ceil_div(uint32_t num, uint32_t den) { return num / den + (num % den != 0u ? 1u : 0u); }

uint32_t idl_rtu_char_us(uint32_t baudrate, uint32_t char_bits)
{
    return ceil_div(char_bits * 1000000u, baudrate);
}

uint32_t idl_rtu_t15_us(uint32_t baudrate, uint32_t char_bits)
{
    return baudrate > IDL_RTU_FAST_LINE ? IDL_RTU_T15_FAST_US : ceil_div(15u * char_bits * 100000u, baudrate);
}

uint32_t idl_rtu_t35_us(uint32_t baudrate, uint32_t char_bits)
{
    return baudrate > IDL_RTU_FAST_LINE ? IDL_RTU_T35_FAST_US : ceil_div(35u * char_bits * 100000u, baudrate);
}
