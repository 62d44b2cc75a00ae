/* Modbus RTU slave: see idl_rtu.h. */
#include "idl_rtu.h"

#include <stdbool.h>

#define NEED_MORE (-1)
#define UNKNOWN_LENGTH (-2)
#define IMPLAUSIBLE (-3)
#define MIN_FRAME 4u

uint16_t idl_crc16_modbus(const uint8_t *data, size_t n)
{
    uint16_t crc = 0xFFFFu;
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned k;
        crc = (uint16_t)(crc ^ data[i]);
        for (k = 0; k < 8u; k++) {
            crc = (uint16_t)((crc >> 1) ^ (0xA001u & (0u - (crc & 1u))));
        }
    }
    return crc;
}

void idl_rtu_init(idl_rtu_t *r, idl_regs_t *regs, uint8_t unit)
{
    unsigned i;
    r->regs = regs;
    for (i = 0; i < 5u; i++) {
        r->counters[i] = 0;
    }
    r->len = 0;
    r->unit = unit;
    r->hunting = 0;
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

static void drop(idl_rtu_t *r, bool hunt)
{
    r->counters[IDL_RTU_DROPPED] += r->len;
    r->len = 0;
    r->hunting = hunt ? 1u : 0u;
}

/* The frame buf[0..n): CRC, unit, execute; returns the answer length. */
static size_t take(idl_rtu_t *r, uint16_t n, uint32_t now)
{
    uint8_t unit = r->buf[0];
    uint16_t crc = idl_crc16_modbus(r->buf, (size_t)n - 2u);
    uint16_t pdu_len;
    if (r->buf[n - 2u] != (uint8_t)crc || r->buf[n - 1u] != (uint8_t)(crc >> 8)) {
        r->counters[IDL_RTU_BAD_CRC]++;
        drop(r, true);
        return 0;
    }
    r->len = 0;
    if (unit != r->unit && unit != IDL_RTU_BROADCAST) {
        r->counters[IDL_RTU_OTHER_UNIT]++;
        return 0;
    }
    pdu_len = idl_modbus_execute(r->regs, r->buf + 1, (uint16_t)(n - 3u), r->out + 1, now);
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

size_t idl_rtu_feed(idl_rtu_t *r, uint8_t byte, uint32_t now)
{
    int need;
    if (r->hunting) {
        r->counters[IDL_RTU_DROPPED]++;
        return 0;
    }
    if (r->len >= IDL_RTU_MAX_FRAME && request_length(r->buf, r->len) == UNKNOWN_LENGTH) {
        drop(r, true);
        r->counters[IDL_RTU_DROPPED]++;
        return 0;
    }
    r->buf[r->len++] = byte;
    need = request_length(r->buf, r->len);
    if (need == IMPLAUSIBLE || need > (int)IDL_RTU_MAX_REQUEST) {
        drop(r, true);
        return 0;
    }
    if (need == (int)r->len) {
        return take(r, r->len, now);
    }
    return 0;
}

size_t idl_rtu_pause(idl_rtu_t *r, uint32_t now)
{
    int need = request_length(r->buf, r->len);
    r->hunting = 0;
    if (r->len == 0u) {
        return 0;
    }
    if (need == UNKNOWN_LENGTH && r->len >= MIN_FRAME) {
        size_t out = take(r, r->len, now);
        r->hunting = 0; /* a bad frame ends here: the pause is the next start */
        return out;
    }
    drop(r, false);
    return 0;
}
