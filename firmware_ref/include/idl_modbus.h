/**
 * @file idl_modbus.h
 * @brief The Modbus PDU face of the register core (protocol/modbus.py decode_request +
 *        protocol/device_core.py execute): FC03, FC04, FC06, FC16, 0x41 WRITE_IF_GENERATION,
 *        0x42 TRIGGER.
 *
 * A request is decoded whole before anything runs: empty, short, trailing bytes, a byte count
 * that disagrees, a count outside 1..125 (read) / 123 (FC16) / 122 (0x41) -> exception 03;
 * address + count past 0xFFFF -> 02; any other function code (0x44 and 0x45 included) -> 01.
 * Then the register core answers (see idl_regs.h). An exception answer is
 * (function | 0x80, code); for an empty PDU the function is 0.
 */
#ifndef IDL_MODBUS_H
#define IDL_MODBUS_H

#include "idl_checkreturn.h"

#include <stdbool.h>
#include <stdint.h>

#include "idl_regs.h"

/** Largest response PDU. */
#define IDL_MB_MAX_PDU 253u

/** Tick the core to `now`, run one request PDU, write the response PDU (at most IDL_MB_MAX_PDU
 *  bytes) to `resp`; returns its length. */
IDL_CHECKRETURN uint16_t idl_modbus_execute(idl_regs_t *r, const uint8_t *pdu, uint16_t len, uint8_t *resp,
                            uint32_t now);

#if defined(IDL_BUS) && IDL_BUS
/** Whether `pdu` may run as a broadcast (protocol/device_core.py broadcast_allowed): a
 *  well-formed FC06, or FC16 (decoded as idl_modbus_execute does), whose every register is
 *  HOLDING in the map. A trigger, a fault clear, a guarded write or a read never is. */
IDL_CHECKRETURN bool idl_modbus_broadcast_ok(const uint8_t *pdu, uint16_t len);
#endif

#endif /* IDL_MODBUS_H */
