/**
 * @file idl_ymodem.h
 * @brief The YMODEM batch receiver (protocol/ymodem.py Receiver) in C99: the same answers
 *        ('C', ACK, NAK, CAN x8), the same idempotent EOT handshake, the same header and name
 *        policy (idl_name_check), the same limits and timeouts, with the time passed in (ms).
 *
 * Transitions: one table indexed by (state, input), the same as RX_TRANSITIONS (docs/YMODEM.md);
 * a pair absent there is ignored. In short: first EOT -> NAK, the next EOT -> ACK 'C' and the
 * commit (once); an EOT after the commit -> ACK 'C' again, no second commit; a repeat of the last
 * accepted block -> ACK, not delivered again; any other out-of-sequence block -> CAN. An EOT
 * counts only when nothing follows it in the same idl_ym_rx_feed() call (a burst).
 *
 * Differences from the Python receiver, by design of a device without a heap:
 * - "byte-identical to the accepted header / to the last block" is decided on the length and
 *   CRC-32C of the payload (the receiver keeps no copy: one block buffer only);
 * - sizes are 32-bit: a declared size above cfg.max_file_size (at most 0xFFFFFFFF) is refused at
 *   the header (HeaderRefusal.TOO_LARGE), so there is always a limit;
 * - the file's mtime and mode are not parsed (they change no answer);
 * - a failing storage callback cancels at the frame that caused it (the Python driver handles the
 *   receiver's events after the whole read): the same unless one read holds several frames.
 *
 * Storage (as a bootloader writes flash): begin(name) when a header is accepted (false: CAN, the
 * batch ends), write(offset, data) for each new block's bytes up to the declared size, commit(size)
 * on the confirming EOT (false: CAN), abort() whenever an uncommitted file is dropped. A failing
 * callback ends the batch like DirectorySink's SinkRefused: the answers of this call not yet
 * handed to `send` are dropped and CAN x8 goes out instead.
 *
 * Output: answers collect in `out` and go to `send` at the end of each feed/tick/start (or when
 * IDL_YM_OUT_CAP bytes are waiting). Memory: idl_ym_rx_t (below) + the caller's block buffer of
 * IDL_YM_BLOCK_LARGE bytes. No malloc; not ISR-safe.
 */
#ifndef IDL_YMODEM_H
#define IDL_YMODEM_H

#include "idl_checkreturn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idemlink_proto.h"

#define IDL_YM_OUT_CAP 24u /**< answer bytes buffered before `send` is called */
#define IDL_YM_CAN_COUNT 8u

/** Receiver states (RxState). */
typedef enum {
    IDL_YM_WAIT_HEADER = 0,
    IDL_YM_WAIT_FIRST_BLOCK = 1,
    IDL_YM_RECV_DATA = 2,
    IDL_YM_WAIT_EOT_CONFIRM = 3,
    IDL_YM_WAIT_NEXT_HEADER = 4,
    IDL_YM_DONE = 5,
    IDL_YM_ABORTED = 6
} idl_ym_state_t;

/** Inputs of the transition table (RxIn). */
typedef enum {
    IDL_YM_IN_HEADER = 0,
    IDL_YM_IN_BAD_HEADER = 1,
    IDL_YM_IN_END_OF_BATCH = 2,
    IDL_YM_IN_BLOCK_NEXT = 3,
    IDL_YM_IN_BLOCK_DUP = 4,
    IDL_YM_IN_BLOCK_OTHER = 5,
    IDL_YM_IN_OTHER_HEADER = 6,
    IDL_YM_IN_BAD_PACKET = 7,
    IDL_YM_IN_EOT = 8,
    IDL_YM_IN_STALE_EOT = 9,
    IDL_YM_IN_NOISE = 10,
    IDL_YM_IN_CANCEL = 11,
    IDL_YM_IN_TIMEOUT = 12
} idl_ym_input_t;

#define IDL_YM_STATES 7u
#define IDL_YM_INPUTS 13u

/** Why the batch ended (`end`); IDL_YM_END_NONE while it runs. */
typedef enum {
    IDL_YM_END_NONE = 0,
    IDL_YM_END_BATCH = 1,          /**< the empty header: success */
    IDL_YM_END_PEER_CANCELLED = 2, /**< CAN CAN from the sender */
    IDL_YM_END_NO_SENDER = 3,      /**< header_retries 'C's without an answer */
    IDL_YM_END_TOO_MANY_ERRORS = 4,
    IDL_YM_END_OUT_OF_SEQUENCE = 5,
    IDL_YM_END_OTHER_HEADER = 6, /**< a different block 0 before this file's data */
    IDL_YM_END_HEADER_REFUSED = 7, /**< `refusal` says why */
    IDL_YM_END_SILENT = 8,         /**< the sender went quiet for silence_ms */
    IDL_YM_END_STORAGE = 9,        /**< a storage callback failed */
    IDL_YM_END_STOPPED = 10        /**< idl_ym_rx_abort() */
} idl_ym_end_t;

/** Header refusals besides the name's (HeaderRefusal); names use idl_name_verdict_t 1..11. */
#define IDL_YM_REFUSE_NAME_NOT_TERMINATED 100u
#define IDL_YM_REFUSE_BAD_SIZE 101u
#define IDL_YM_REFUSE_SIZE_CUT 102u
#define IDL_YM_REFUSE_TOO_LARGE 103u

typedef struct {
    /** A header was accepted: open a file `name` (`len` bytes, checked); size_known false when the
     *  header gave none. false refuses it. */
    bool (*begin)(void *ctx, const uint8_t *name, size_t len, uint32_t size, bool size_known);
    /** Write `n` bytes at `offset` (never beyond the declared size, never twice). */
    bool (*write)(void *ctx, uint32_t offset, const uint8_t *data, size_t n);
    /** Make the file visible with `size` bytes. */
    bool (*commit)(void *ctx, uint32_t size);
    /** Drop the uncommitted file. */
    void (*abort)(void *ctx);
    /** Send answer bytes on the line. */
    void (*send)(void *ctx, const uint8_t *data, size_t n);
    void *ctx;
} idl_ym_io_t;

/** Timeouts of idl_ym_config_t.ms (ReceiverConfig), in ms. */
typedef enum {
    IDL_YM_T_C_INTERVAL = 0, /**< 'C' while waiting for a header / the first block (3000) */
    IDL_YM_T_BLOCK = 1,      /**< silence while expecting a block -> NAK (10000) */
    IDL_YM_T_INTERBYTE = 2,  /**< silence inside a block -> bad packet (1000) */
    IDL_YM_T_PURGE = 3,      /**< after a bad block, this much silence before NAK (250) */
    IDL_YM_T_EOT_CONFIRM = 4, /**< no second EOT -> NAK again (5000) */
    IDL_YM_T_SILENCE = 5     /**< once heard, the longest silence, then CAN (60000; 0: none) */
} idl_ym_timer_t;

/** Limits and timeouts (ReceiverConfig). */
typedef struct {
    uint32_t ms[6];             /**< indexed by idl_ym_timer_t */
    uint32_t max_file_size;     /**< declared sizes above this are refused */
    uint8_t header_retries;     /**< 'C's for the first header before giving up (20) */
    uint8_t max_errors;         /**< consecutive errors before CAN (10) */
    uint8_t max_name;           /**< longest name (bytes), at most 255 */
} idl_ym_config_t;

typedef struct {
    const idl_ym_config_t *cfg;
    const idl_ym_io_t *io;
    uint8_t *block;          /**< caller's IDL_YM_BLOCK_LARGE-byte payload buffer */
    uint32_t last_byte_at;
    uint32_t deadline;
    uint32_t delivered;      /**< bytes given to write() for this file */
    uint32_t size;           /**< declared size (if size_known) */
    uint32_t header_crc;     /**< CRC-32C of the accepted block 0 */
    uint32_t last_crc;       /**< CRC-32C of the last valid block in a data state */
    uint16_t need;           /**< bytes still missing of the block being collected (0: none) */
    uint16_t blen;           /**< payload length of that block (128 or 1024) */
    uint16_t got;            /**< payload bytes collected */
    uint16_t c_sent;         /**< 'C's sent for the first header */
    uint16_t header_len;     /**< length of the accepted block 0 (0: none) */
    uint16_t last_len;
    uint16_t crc16;          /**< running CRC-16/XMODEM over payload + CRC */
    uint8_t pkt_len;         /**< packet bytes seen (lead, number, complement) up to 3 */
    uint8_t number;
    uint8_t complement;
    uint8_t state;           /**< idl_ym_state_t */
    uint8_t end;             /**< idl_ym_end_t */
    uint8_t refusal;         /**< header refusal when end == IDL_YM_END_HEADER_REFUSED */
    uint8_t last_block;
    uint8_t errors;
    uint8_t commits;
    uint8_t name_len;        /**< the accepted header's name length */
    uint8_t data_seen;       /**< a data block was accepted for this file */
    uint8_t tail;            /**< IDL_YM_TAIL_*: the packet's CAN/BS tail so far */
    uint8_t out_len;
    uint8_t flags;           /**< IDL_YM_F_* below */
    uint8_t out[IDL_YM_OUT_CAP];
} idl_ym_rx_t;

/* flags */
#define IDL_YM_F_DEADLINE 0x01u
#define IDL_YM_F_PURGING 0x02u
#define IDL_YM_F_PENDING_CAN 0x04u
#define IDL_YM_F_EOT_PENDING 0x08u
#define IDL_YM_F_MOVED_ON 0x10u
#define IDL_YM_F_HEARD 0x20u
#define IDL_YM_F_SIZE_KNOWN 0x40u
#define IDL_YM_F_FILE_OPEN 0x80u
/* tail: the last packet byte was CAN / the CAN and BS run ending the packet so far holds CAN CAN
 * (the sender cancelling inside a block: lrzsz sends CAN x10 then BS x10) */
#define IDL_YM_TAIL_CAN 0x01u
#define IDL_YM_TAIL_CANCEL 0x02u

/** Set up a receiver (state WAIT_HEADER); nothing is sent yet. */
void idl_ym_rx_init(idl_ym_rx_t *rx, const idl_ym_config_t *cfg, const idl_ym_io_t *io,
                    uint8_t *block);

/** Send the first 'C' at `now`. */
void idl_ym_rx_start(idl_ym_rx_t *rx, uint32_t now);

/** A burst of received bytes at `now`, then the timers (ReceiverDriver.feed): answers go out. */
void idl_ym_rx_feed(idl_ym_rx_t *rx, const uint8_t *data, size_t n, uint32_t now);

/** The timers alone (call every few tens of ms while idle). */
void idl_ym_rx_tick(idl_ym_rx_t *rx, uint32_t now);

/** The shell stops the batch (device shutting down): CAN x8, an uncommitted file dropped. */
void idl_ym_rx_abort(idl_ym_rx_t *rx);

/** True once the batch is over (DONE or ABORTED): the line goes back to the caller. */
IDL_CHECKRETURN bool idl_ym_rx_finished(const idl_ym_rx_t *rx);

/** The transition table entry for (state, input): (next << 5) | action, 0xFF when absent. */
IDL_CHECKRETURN uint8_t idl_ym_rx_transition(unsigned state, unsigned input);

#endif /* IDL_YMODEM_H */
