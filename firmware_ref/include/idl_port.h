/**
 * @file idl_port.h
 * @brief What an integrator provides to run the idemlink device core, and the one-call glue
 *        (idl_device_*) that wires the modules together.
 *
 * Provide these functions (port/posix/ is a complete example):
 *
 * | function                    | what                                        | context       |
 * |-----------------------------|---------------------------------------------|---------------|
 * | idl_port_write              | send bytes (UART TX: may block or queue)    | main loop     |
 * | idl_port_millis             | free-running ms clock, wraps modulo 2^32    | main loop (*) |
 * | idl_port_flash_load         | the saved configuration, if any             | init only     |
 * | idl_port_flash_save         | save a configuration (persist first)        | main loop     |
 * | idl_port_unique_id          | the MCU's unique id as text (1..64 chars of | init only     |
 * |                             | [A-Za-z0-9_.:-])                            |               |
 * | idl_port_entropy32          | 32 random bits for the boot epoch (TRNG,    | init only     |
 * |                             | ADC noise, uninitialised RAM hashed...)     |               |
 * | idl_port_fault_conditions   | live conditions of a FAULT register's bits  | main loop     |
 * | idl_port_file_info          | size and CRC-32C of a stored file (0x45)    | main loop     |
 * | idl_port_ymodem_block       | the YMODEM block buffer (1 KiB), or NULL    | main loop     |
 * | idl_port_file_begin/write/  | FILE_RECEIVE (0x44) storage: open, write a  | main loop     |
 * |   commit/abort              | block, make visible, drop (see below)       |               |
 *
 * Optional, compiled in only with IDL_PORT_EXECUTED=1 (otherwise neither called nor needed, and
 * the core costs nothing more):
 *
 * | idl_port_executed           | one execution: epoch, seq, request, answer  | main loop     |
 *
 * Compiled in only with IDL_BUS=1 (the bus: docs/BUS.md; otherwise neither called nor needed):
 *
 * | idl_port_bus_address        | the device's bus address 1..247, 0: none    | init only     |
 *
 * Compiled in only with IDL_AUTH=1 (authenticated frames: docs/SECURITY.md, idl_auth.h):
 *
 * | idl_port_auth_key           | the i-th long-term key accepted, NULL past  | main loop     |
 * |                             | the last (NULL for 0: unkeyed)              |               |
 * | idl_port_random             | n unpredictable bytes (a HELLO nonce)       | main loop     |
 *
 * Receiving: an RX interrupt only stores bytes in the integrator's ring buffer; the main loop
 * passes them to idl_device_rx(). No core function is ISR-safe; none allocates, none blocks
 * (except through idl_port_write / idl_port_flash_save).
 *
 * (*) The core calls every port function from the main loop only. idl_port_millis is the one a
 * port usually feeds from an interrupt (a SysTick counter): reading it must then be atomic (one
 * aligned 32-bit load on a Cortex-M is).
 */
#ifndef IDL_PORT_H
#define IDL_PORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idl_checkreturn.h"
#include "idl_modbus.h"
#include "idl_regs.h"
#include "idl_session.h"
#include "idl_ymodem.h"

/* ---- provided by the integrator ---------------------------------------------------------- */

void idl_port_write(const uint8_t *data, size_t n);
IDL_CHECKRETURN uint32_t idl_port_millis(void);
/** Fill `values` (indexed like IDL_REGMAP; HOLDING entries) and `generation`; false: none saved. */
IDL_CHECKRETURN bool idl_port_flash_load(uint16_t *values, uint16_t *generation);
/** Save durably before returning true (the write is answered only after this). */
IDL_CHECKRETURN bool idl_port_flash_save(const uint16_t *values, uint16_t generation);
/** Write the id (no terminator needed) into `buf` of `cap` bytes; returns its length. */
IDL_CHECKRETURN size_t idl_port_unique_id(char *buf, size_t cap);
IDL_CHECKRETURN uint32_t idl_port_entropy32(void);
IDL_CHECKRETURN uint16_t idl_port_fault_conditions(const idl_regs_t *r, uint16_t address);
/** FILE_INFO (IDL_FILE_INFO=1): the committed file `name` (checked: one plain component, `len` bytes of UTF-8, no
 *  terminator): 0 present (*size, *crc = CRC-32C of its bytes), 1 absent, -1 failed. A device
 *  without file storage returns 1. */
IDL_CHECKRETURN int idl_port_file_info(const uint8_t *name, uint8_t len, uint32_t *size, uint32_t *crc);

/* FILE_RECEIVE (0x44): after answering `44 00` the device hands its line to the YMODEM receiver
 * (idl_ymodem.h) for one batch, then returns to frames. The receiver writes as a bootloader would:
 * begin (the name is checked; refuse an existing file unless `overwrite`, and a file that cannot
 * be stored) -> write (each block's bytes, in order, never beyond the declared size) -> commit
 * (make the file visible, atomically: FILE_INFO must never see a half file) or abort (drop it).
 * A false return cancels the batch (CAN). The glue enforces IDL_FILE_QUOTA bytes per batch. */
/** The receiver's IDL_YM_BLOCK_LARGE-byte block buffer (static RAM of the port), or NULL for a
 *  device without file storage: 0x44 then answers exception 01. */
IDL_CHECKRETURN uint8_t *idl_port_ymodem_block(void);
IDL_CHECKRETURN bool idl_port_file_begin(const uint8_t *name, size_t len, bool overwrite);
IDL_CHECKRETURN bool idl_port_file_write(uint32_t offset, const uint8_t *data, size_t n);
IDL_CHECKRETURN bool idl_port_file_commit(uint32_t size);
void idl_port_file_abort(void);

#ifndef IDL_PORT_EXECUTED
#define IDL_PORT_EXECUTED 0
#endif
#if IDL_PORT_EXECUTED
/** Optional (IDL_PORT_EXECUTED=1): called once for every request the device runs (the EXECUTED
 *  disposition; never for a replayed answer or a refusal), right after it ran and before its
 *  number is committed and its answer sent: the boot epoch, the sequence number, the request PDU
 *  and the response PDU (the answer's payload without its status byte), and `now`, the
 *  idl_port_millis() value the request ran at. For a record of executions (the posix port's
 *  --effects file): write it before returning, and a stop that lets the main loop finish the
 *  frame it is on never leaves an effect without its record. */
void idl_port_executed(uint32_t epoch, uint32_t seq, const uint8_t *request, uint16_t request_len,
                       const uint8_t *response, uint16_t response_len, uint32_t now);
#endif

#if IDL_BUS
/** Optional (IDL_BUS=1): the device's bus address, 1..IDL_MAX_ADDRESS, from its configuration
 *  (DIP switches, a flash record, the posix port's flash directory); 0: none, the device
 *  answers only unaddressed frames (a point-to-point device). Another value counts as 0. A
 *  broadcast execution reaches idl_port_executed with epoch 0 and its broadcast number. */
IDL_CHECKRETURN uint8_t idl_port_bus_address(void);
#endif

/* ---- glue ----------------------------------------------------------------------------------- */

#ifndef IDL_DEVICE_NAME
#define IDL_DEVICE_NAME "idemlink-c"
#endif
#ifndef IDL_TRIGGER_MS
#define IDL_TRIGGER_MS 5000u
#endif
/* FILE_INFO (0x45): 0 leaves it out (0x45 then answers 01, like any function the register core
 * does not serve; idl_port_file_info is not needed, nor idl_name.c and idl_files.c). */
#ifndef IDL_FILE_INFO
#define IDL_FILE_INFO 1
#endif
/* FILE_RECEIVE (0x44) and the YMODEM receiver: 0 leaves them out (0x44 then answers 01, and
 * the idl_port_ymodem_block / idl_port_file_begin... functions are not needed). */
#ifndef IDL_FILE_RECEIVE
#define IDL_FILE_RECEIVE 1
#endif
#ifndef IDL_FILE_QUOTA
#define IDL_FILE_QUOTA (16u * 1024u * 1024u) /**< bytes one YMODEM batch may store */
#endif

typedef struct {
    idl_regs_t regs;
    idl_session_config_t cfg;
    char device_id[IDL_MAX_DEVICE_ID_LEN + 1u];
    idl_session_t session;
#if IDL_FILE_RECEIVE
    idl_ym_rx_t ym;       /**< the YMODEM receiver while the line is handed over */
    uint32_t ym_used;     /**< bytes committed in this batch (IDL_FILE_QUOTA) */
    uint8_t ym_mode;      /**< 0 frames, 1 hand-over answered, 2 YMODEM */
    uint8_t ym_overwrite;
#endif
} idl_device_t;

/** Boot: registers from the map and the saved configuration, a fresh epoch, an empty window. */
void idl_device_init(idl_device_t *d);

/** Received bytes: answers go out through idl_port_write. */
void idl_device_rx(idl_device_t *d, const uint8_t *data, size_t n);

/** Call at least every few tens of ms when idle: finishes triggers, latches faults on time,
 *  runs the YMODEM receiver's timers during a hand-over. */
void idl_device_poll(idl_device_t *d);

/** Shutting down: a YMODEM batch in progress is cancelled (CAN, the uncommitted file dropped). */
void idl_device_stop(idl_device_t *d);

#endif /* IDL_PORT_H */
