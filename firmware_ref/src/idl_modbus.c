/* Modbus PDU handler: see idl_modbus.h. */
#include "idl_modbus.h"

#include <stdbool.h>

static uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static uint16_t exception(uint8_t *resp, uint8_t fc, uint8_t code)
{
    resp[0] = (uint8_t)(fc | IDL_MB_EXCEPTION_FLAG);
    resp[1] = code;
    return 2u;
}

/* count in 1..limit (else 03), address + count <= 0x10000 (else 02); 0 if fine */
static uint8_t check_range(uint16_t address, uint16_t count, uint16_t limit)
{
    if (count < 1u || count > limit) {
        return IDL_MB_EXC_ILLEGAL_DATA_VALUE;
    }
    if ((uint32_t)address + count > 0x10000u) {
        return IDL_MB_EXC_ILLEGAL_DATA_ADDRESS;
    }
    return 0;
}

static uint16_t read_regs(idl_regs_t *r, const uint8_t *pdu, uint16_t len, uint8_t *resp)
{
    uint16_t address;
    uint16_t count;
    uint8_t exc;
    if (len != 5u) {
        return exception(resp, pdu[0], IDL_MB_EXC_ILLEGAL_DATA_VALUE);
    }
    address = be16(pdu + 1);
    count = be16(pdu + 3);
    exc = check_range(address, count, IDL_MB_MAX_READ);
    if (exc == 0u) {
        exc = idl_regs_read(r, address, count, resp + 2);
    }
    if (exc != 0u) {
        return exception(resp, pdu[0], exc);
    }
    resp[0] = pdu[0];
    resp[1] = (uint8_t)(2u * count);
    return (uint16_t)(2u + 2u * count);
}

/* FC16 (head 5) and 0x41 (head 7): count at head - 2, byte count at head, values after it */
static uint16_t write_regs(idl_regs_t *r, const uint8_t *pdu, uint16_t len, uint8_t *resp,
                           uint16_t head, uint16_t limit)
{
    bool guarded = head == 7u;
    uint16_t address;
    uint16_t count;
    uint8_t exc;
    int res;
    if (len < head + 1u) {
        return exception(resp, pdu[0], IDL_MB_EXC_ILLEGAL_DATA_VALUE);
    }
    address = be16(pdu + head - 4u);
    count = be16(pdu + head - 2u);
    exc = check_range(address, count, limit);
    if (exc == 0u && (pdu[head] != 2u * count || len != head + 1u + pdu[head])) {
        exc = IDL_MB_EXC_ILLEGAL_DATA_VALUE;
    }
    if (exc != 0u) {
        return exception(resp, pdu[0], exc);
    }
    res = idl_regs_write(r, address, count, pdu + head + 1u, guarded, guarded ? be16(pdu + 1) : 0u);
    if (res != 0 && res != IDL_REGS_GUARD_FAILED) {
        return exception(resp, pdu[0], (uint8_t)res);
    }
    resp[0] = pdu[0];
    if (guarded) {
        resp[1] = res == 0 ? (uint8_t)IDL_STATUS_OK : (uint8_t)IDL_STATUS_GUARD_FAILED;
        put16(resp + 2, r->generation);
        return 4u;
    }
    put16(resp + 1, address);
    put16(resp + 3, count);
    return 5u;
}

uint16_t idl_modbus_execute(idl_regs_t *r, const uint8_t *pdu, uint16_t len, uint8_t *resp,
                            uint32_t now)
{
    uint8_t fc;
    uint8_t exc;
    uint16_t code = 0;
    unsigned i;
    idl_regs_tick(r, now);
    if (len == 0u) {
        return exception(resp, 0u, IDL_MB_EXC_ILLEGAL_DATA_VALUE);
    }
    fc = pdu[0];
    switch (fc) {
    case IDL_MB_FC_READ_HOLDING_REGISTERS:
    case IDL_MB_FC_READ_INPUT_REGISTERS:
        return read_regs(r, pdu, len, resp);
    case IDL_MB_FC_WRITE_MULTIPLE_REGISTERS:
        return write_regs(r, pdu, len, resp, 5u, IDL_MB_MAX_WRITE);
    case IDL_MB_FC_WRITE_IF_GENERATION:
#if defined(IDL_REGMAP_NO_GENERATION) && IDL_REGMAP_NO_GENERATION
        /* a map without a generation register serves no conditional write (DeviceCore.serves) */
        return exception(resp, fc, IDL_MB_EXC_ILLEGAL_FUNCTION);
#else
        return write_regs(r, pdu, len, resp, 7u, IDL_MB_MAX_COND_WRITE);
#endif
    case IDL_MB_FC_WRITE_SINGLE_REGISTER:
    case IDL_MB_FC_TRIGGER:
        break;
    default:
        return exception(resp, fc, IDL_MB_EXC_ILLEGAL_FUNCTION);
    }
    if (len != 5u) {
        return exception(resp, fc, IDL_MB_EXC_ILLEGAL_DATA_VALUE);
    }
    if (fc == (uint8_t)IDL_MB_FC_TRIGGER) {
        exc = idl_regs_trigger(r, be16(pdu + 1), be16(pdu + 3), &code);
    } else {
        exc = (uint8_t)idl_regs_write(r, be16(pdu + 1), 1u, pdu + 3, false, 0u);
    }
    if (exc != 0u) {
        return exception(resp, fc, exc);
    }
    /* both answers echo function, address and value; 0x42 then puts its status code there */
    for (i = 0; i < 5u; i++) {
        resp[i] = pdu[i];
    }
    if (fc == (uint8_t)IDL_MB_FC_TRIGGER) {
        put16(resp + 3, code);
    }
    return 5u;
}

#if defined(IDL_BUS) && IDL_BUS
bool idl_modbus_broadcast_ok(const uint8_t *pdu, uint16_t len)
{
    /* decoded as idl_modbus_execute decodes FC06 and FC16: anything it refuses is refused */
    uint16_t count = 1u;
    if (len < 5u) {
        return false;
    }
    if (pdu[0] == (uint8_t)IDL_MB_FC_WRITE_MULTIPLE_REGISTERS) {
        count = be16(pdu + 3);
        if (len < 6u || count > IDL_MB_MAX_WRITE || pdu[5] != 2u * count
            || len != 6u + pdu[5]) {
            return false;
        }
    } else if (pdu[0] != (uint8_t)IDL_MB_FC_WRITE_SINGLE_REGISTER || len != 5u) {
        return false;
    }
    /* count 0 and a run past 0xFFFF are no run of holdings */
    return idl_regs_all_holding(be16(pdu + 1), count);
}
#endif
