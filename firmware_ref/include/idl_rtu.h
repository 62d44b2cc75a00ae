/**
 * @file idl_rtu.h
 * @brief Modbus RTU slave face of the register core: unit id + PDU + CRC-16/MODBUS (poly 0x8005
 *        reflected, init 0xFFFF, low byte first), as device_sim/rtu_server.py serves it.
 *
 * Framing (Modbus over serial line V1.02 2.5.1.1, the subset a point-to-point slave needs):
 * - A request is read at its head by its declared length: 8 bytes for FC01-06 and 0x42; the
 *   byte count at offset 6 (FC0F, FC10), 8 (0x41) or 10 (FC17) plus 3 more; a counted head whose
 *   byte count disagrees with its quantity (or a quantity of 0) cannot be a request. Any other
 *   function code is framed by the next pause.
 * - A complete frame with the right CRC for our unit is executed and answered; unit 0
 *   (broadcast) is executed without an answer; another unit is skipped silently. Parsing goes on
 *   right after it (back-to-back frames are fine).
 * - A bad CRC, an implausible head, or more than 256 bytes of a function framed by the pause:
 *   everything up to the next pause is
 *   dropped (counted). A pause (the line silent for t3.5: 3.5 character times up to 19200 Bd,
 *   1.75 ms above; the integrator detects it with a timer or the UART's idle-line interrupt)
 *   ends a frame of unknown length and drops an incomplete one.
 * - Shared bus: a head for another unit is also read as another slave's answer, by the length
 *   its function code declares (exception 5; FC01-04/17 byte count + 5; FC05/06/0F/10/0x42 8;
 *   0x41 7; read answers with an implausible byte count are no answers). A complete CRC-valid
 *   answer is skipped whole (counted) once the request reading is no longer waiting for its own
 *   length, and parsing goes on right after it, as protocol/modbus_rtu.py RtuDecoder does.
 * Limits: the port must report every pause (timer or idle-line interrupt): the Python RtuDecoder, which sees
 * pauses only at read boundaries, has extra rules for pauses hidden inside a read that a port
 * with exact pauses does not need.
 * Not ISR-safe: call from one context.
 */
#ifndef IDL_RTU_H
#define IDL_RTU_H

#include "idl_checkreturn.h"

#include <stddef.h>
#include <stdint.h>

#include "idl_modbus.h"

/** Largest frame Modbus allows (the answer buffer). */
#define IDL_RTU_MAX_FRAME 256u
/** Largest plausible request: FC17 with a byte count of 254 (unit + 10 + 1 + 254 + CRC). Requests
 *  longer than 256 bytes are read whole and answered (exception 03: too many registers). */
#define IDL_RTU_MAX_REQUEST 267u
#define IDL_RTU_BROADCAST 0u

/** Counters in idl_rtu_t.counters. */
typedef enum {
    IDL_RTU_ANSWERED = 0,  /**< requests for our unit, answered */
    IDL_RTU_BROADCASTS = 1, /**< unit 0 requests, executed without an answer */
    IDL_RTU_OTHER_UNIT = 2, /**< valid frames for another unit, skipped */
    IDL_RTU_BAD_CRC = 3,    /**< complete frames with a wrong CRC */
    IDL_RTU_DROPPED = 4,    /**< bytes dropped (implausible, too long, cut by a pause, hunting) */
    IDL_RTU_OTHER_ANSWER = 5 /**< other slaves' answers (shared bus), skipped by their length */
} idl_rtu_counter_t;
#define IDL_RTU_COUNTERS 6u

typedef struct {
    idl_regs_t *regs;
    uint32_t counters[IDL_RTU_COUNTERS];
    uint16_t len;
    uint8_t unit;
    uint8_t hunting; /**< dropping bytes until the next pause */
    uint8_t views;   /**< what is known of the head's two readings (internal) */
    uint8_t buf[IDL_RTU_MAX_REQUEST];
    uint8_t out[IDL_RTU_MAX_FRAME]; /**< the answer being sent */
} idl_rtu_t;

/** CRC-16/MODBUS of n bytes. */
IDL_CHECKRETURN uint16_t idl_crc16_modbus(const uint8_t *data, size_t n);

void idl_rtu_init(idl_rtu_t *r, idl_regs_t *regs, uint8_t unit);

/** One received byte at `now` (ms); returns the length of an answer now in r->out (0: none).
 *  Bytes that follow a request for us without a pause are framed at the next call. */
IDL_CHECKRETURN size_t idl_rtu_feed(idl_rtu_t *r, uint8_t byte, uint32_t now);

/** The line was silent for t3.5; returns the length of an answer now in r->out (0: none). */
IDL_CHECKRETURN size_t idl_rtu_pause(idl_rtu_t *r, uint32_t now);

/** Bits in one character: start + data + parity + stop (8E1 and 8N2: 11, 8N1: 10). */
#define IDL_RTU_CHAR_BITS(bytesize, has_parity, stopbits) (1u + (bytesize) + (has_parity) + (stopbits))
/** Above this rate t1.5 and t3.5 are fixed (Modbus over serial line V1.02 2.5.1.1). */
#define IDL_RTU_FAST_LINE 19200u
#define IDL_RTU_T15_FAST_US 750u
#define IDL_RTU_T35_FAST_US 1750u

/** One character's time on the line in microseconds (rounded up) at `baudrate` (> 0) for a
 *  character of `char_bits` bits. */
IDL_CHECKRETURN uint32_t idl_rtu_char_us(uint32_t baudrate, uint32_t char_bits);
/** t1.5: 1.5 character times up to 19200 Bd, 750 us above (rounded up). The port's timer for
 *  "a gap inside a frame". */
IDL_CHECKRETURN uint32_t idl_rtu_t15_us(uint32_t baudrate, uint32_t char_bits);
/** t3.5: 3.5 character times up to 19200 Bd, 1750 us above (rounded up). The port's timer for
 *  the pause that ends a frame: call idl_rtu_pause() when it expires. Same numbers as
 *  protocol/modbus_rtu.py rtu_timing() (tests/test_c_rtu_timing.py compares them). */
IDL_CHECKRETURN uint32_t idl_rtu_t35_us(uint32_t baudrate, uint32_t char_bits);

#endif /* IDL_RTU_H */
