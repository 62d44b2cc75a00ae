/**
 * @file idl_session.h
 * @brief The device side of the framed protocol (protocol/device_session.py): frames in,
 *        exactly-once execution, answers out.
 *
 * | REQUEST with another epoch     | EPOCH_MISMATCH (payload: status, request epoch u32 LE);   |
 * |                                | nothing runs, nothing committed                           |
 * | window NEW / ACCEPT_OLD        | execute, commit the number, store the answer, send it     |
 * | DUPLICATE, same digest         | resend the stored answer with the REPLAY flag             |
 * | DUPLICATE, other digest        | IDEMPOTENCY_CONFLICT                                      |
 * | DUPLICATE, answer evicted      | ANSWER_EVICTED                                            |
 * | TOO_OLD                        | TOO_OLD                                                   |
 * | HELLO                          | HELLO_REPLY (device info incl. map hash, device id, map   |
 * |                                | name), our epoch; only the hand-out floor moves            |
 * | anything else / decode refusal | counted, no answer                                        |
 *
 * On a bus (IDL_BUS=1, docs/BUS.md; the rule of protocol/device_session.py address_verdict):
 * | no address in the frame        | the table above, answered unaddressed                     |
 * | the configured address         | the table above, answered with the same address            |
 * | another device's address       | counted IDL_DISP_OTHER_ADDRESS, no answer                 |
 * | broadcast (0), a REQUEST whose | run at most once per number of the broadcast window (its  |
 * | PDU `broadcast_ok` allows      | own; the epoch is not checked), never answered            |
 * | broadcast, anything else       | counted IDL_DISP_BROADCAST_REFUSED / _REPEATED, no answer |
 * | addressed, no address set (0)  | counted IDL_DISP_UNEXPECTED, no answer (as without BUS)   |
 * A keyed device (IDL_AUTH=1 and idl_port_auth_key(0) not NULL; idl_auth.h, docs/SECURITY.md)
 * decides one thing more, before both tables (protocol/device_session.py): the decoder verifies
 * every tag right after the CRC (BAD_MAC, counted, no answer); a frame other than HELLO without
 * a verified tag is counted IDL_DISP_UNAUTHENTICATED and never run: a REQUEST to this device
 * without a tag gets AUTHENTICATION_REQUIRED, unsigned; one with a tag while no session key
 * exists and of another epoch gets EPOCH_MISMATCH, unsigned (the news of a reboot). A HELLO
 * naming a key the device holds derives a new session key; its HELLO_REPLY and every answer to
 * a verified frame are signed. It runs no broadcast, not even a verified one: counted
 * IDL_DISP_UNAUTHENTICATED.
 * A device with an address advertises capability ADDRESSED, its address and broadcast_next in
 * HELLO_REPLY. Without IDL_BUS (the default) every ADDRESSED frame is ignored, and the code and
 * state are those of the point-to-point core.
 *
 * The digest is the CRC-32C of the request payload. An executed answer is status OK + the PDU
 * the `execute` callback wrote. Not ISR-safe: feed bytes from one context (an ISR pushes received
 * bytes into the integrator's ring, the main loop feeds them here).
 */
#ifndef IDL_SESSION_H
#define IDL_SESSION_H

#include "idl_checkreturn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idl_frame.h"
#include "idl_replay.h"
#include "idl_window.h"

/* IDL_BUS: 1 compiles the bus support in (the device's address, broadcast); 0 (default) leaves
 * it out: an M0+ build with YMODEM has almost no flash to spare. */
#ifndef IDL_BUS
#define IDL_BUS 0
#endif

#if IDL_WINDOW_SIZE > 65535u || IDL_MAX_PAYLOAD > 65535u
#error "DEVICE_INFO carries the window and the payload limit as u16"
#endif

/* IDL_HANDOUT_SPAN (idemlink_proto.h, generated): how far ahead of the highest number seen a
 * HELLO may hand out a start, so a start and the numbers after it are always NEW to the window. */
#ifndef IDL_HANDOUT_SPAN
#error "idemlink_proto.h is older than this core: regenerate it with `idemlink contract`"
#endif

/** The largest payload the session answers with: DEVICE_INFO (HELLO_REPLY), 20 fixed bytes
 *  (version, window, payload limit, replay slots, in-flight, contract hash, next_seq), then the
 *  name (at most 128 + 1), the map hash, the device id (at most 64 + 1), the map name (at most
 *  255 + 1) and the extension: capabilities and bus address (3 bytes), with IDL_BUS or IDL_AUTH
 *  the bus extension's broadcast next_seq too (4 more), with IDL_AUTH the auth extension (key id
 *  and device nonce, 20 more); a stored answer is smaller. */
#define IDL_SESSION_HELLO_MAX (12u + IDL_CONTRACT_HASH_LEN + 129u + IDL_MAP_HASH_LEN \
                               + IDL_MAX_DEVICE_ID_LEN + 1u + 256u + 3u \
                               + (IDL_BUS || IDL_AUTH ? 4u : 0u) + (IDL_AUTH ? 20u : 0u))
/** The TX buffer: the wire size of the largest answer the session sends, with room for the
 *  address byte and the long MAC tag of the frame layouts (ADDRESSED, AUTH_LONG). Sized for what
 *  the device sends rather than for any frame (IDL_WIRE_MAX): 31 bytes less of RAM. */
#define IDL_SESSION_TX_MAX IDL_FRAME_WIRE_LEN(IDL_HEADER_LEN + IDL_ADDRESS_LEN \
                                              + IDL_SESSION_HELLO_MAX + IDL_AUTH_TAG_LONG_LEN \
                                              + IDL_CRC_LEN)
#if IDL_SESSION_HELLO_MAX > IDL_MAX_PAYLOAD || IDL_REPLAY_MAX_ANSWER > IDL_SESSION_HELLO_MAX \
    || IDL_SESSION_TX_MAX > IDL_WIRE_MAX
#error "DEVICE_INFO must fit a payload, and the TX buffer every answer"
#endif

/** Run one request PDU, numbered `seq` in the session's epoch, at `now` (ms); write the response
 *  PDU (at most 253 bytes) to `resp` and return its length. Called at most once per (epoch,
 *  sequence number), before the number is committed and the answer stored or sent. */
typedef uint16_t (*idl_execute_fn)(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *resp,
                                   uint32_t now, uint32_t seq);

#if IDL_BUS
/** Whether a request PDU may run as a broadcast: a set-only write (protocol/device_core.py
 *  broadcast_allowed; idl_modbus_broadcast_ok). */
typedef bool (*idl_broadcast_ok_fn)(void *ctx, const uint8_t *pdu, uint16_t len);
#endif

/** What a session advertises and runs (caller-owned, must outlive the session). */
typedef struct {
    idl_execute_fn execute;
    void *ctx;
    const char *name;      /**< device name (at most 255 bytes of UTF-8) */
    const char *device_id; /**< stable id, 1..IDL_MAX_DEVICE_ID_LEN bytes */
    const char *map_name;  /**< the register map's name */
    const uint8_t *map_hash; /**< IDL_MAP_HASH_LEN bytes */
    uint8_t max_inflight;  /**< advertised pipelining depth (clamped to the replay slots) */
#if IDL_BUS
    uint8_t address;       /**< bus address 1..IDL_MAX_ADDRESS; 0: none (point-to-point) */
    idl_broadcast_ok_fn broadcast_ok; /**< NULL: every broadcast refused */
#endif
} idl_session_config_t;

/** Request dispositions, counted in idl_session_t.counters. */
typedef enum {
    IDL_DISP_EXECUTED = 0,
    IDL_DISP_REPLAYED = 1,
    IDL_DISP_CONFLICT = 2,
    IDL_DISP_EVICTED = 3,
    IDL_DISP_TOO_OLD = 4,
    IDL_DISP_EPOCH_MISMATCH = 5,
    IDL_DISP_HELLO = 6,
    IDL_DISP_UNEXPECTED = 7,
    IDL_DISP_DECODE_ERRORS = 8,
#if IDL_BUS
    IDL_DISP_OTHER_ADDRESS = 9,      /**< another device's frame */
    IDL_DISP_BROADCAST_EXECUTED = 10,
    IDL_DISP_BROADCAST_REPEATED = 11, /**< a broadcast number already run */
    IDL_DISP_BROADCAST_REFUSED = 12,  /**< not a REQUEST, or not a set-only write */
#endif
#if IDL_AUTH
    /** a keyed device: a frame other than HELLO without a verified tag (never run) */
    IDL_DISP_UNAUTHENTICATED = IDL_BUS ? 13 : 9,
#endif
    IDL_DISP_COUNT = 9 + (IDL_BUS ? 4 : 0) + (IDL_AUTH ? 1 : 0)
} idl_disposition_t;

typedef struct {
    const idl_session_config_t *cfg;
    uint32_t epoch;
    uint32_t handed_out;     /**< last next_seq handed out (valid if has_handed_out) */
    uint8_t has_handed_out;
#if IDL_AUTH
    uint8_t keyed;            /**< 0 no key (idl_port_auth_key(0) NULL), 1 keyed, 2 keyed with a
                                   session key */
#endif
    uint32_t counters[IDL_DISP_COUNT];
    idl_window_t window;
#if IDL_BUS
    idl_window_t broadcast_window; /**< broadcast numbers run this boot (a space of their own) */
    uint16_t to;         /**< the frame being answered: its address, or IDL_FRAME_NO_ADDRESS */
    uint8_t broadcasting; /**< 1 while `execute` runs a broadcast (recorded under epoch 0) */
#endif
#if IDL_AUTH
    idl_auth_t auth;          /**< the nonces and the session key (idl_auth.h) */
#endif
    idl_replay_t cache;
    idl_frame_decoder_t decoder;
#if IDL_AUTH
    /* 4 bytes that put tx 16-aligned from the session's start in the keyed point-to-point build
     * (K = 8): its offset loads as MOVS + LSLS rather than from a literal (6 bytes of Cortex-M0+
     * code for 4 of RAM, measured by make bench-auth; nothing reads them) */
    uint8_t tx_align[4];
#endif
    uint8_t tx[IDL_SESSION_TX_MAX]; /**< the answer being sent */
} idl_session_t;

/** A new boot: `epoch` (non-zero, random: see idl_port.h), empty window and cache. */
void idl_session_init(idl_session_t *s, const idl_session_config_t *cfg, uint32_t epoch);

/** Feed `n` received bytes at `now` in one scan (the decoder's idl_frame_decoder_feed_buf): stops
 *  after the byte that ends a frame (or a refusal), with *used the bytes consumed, and returns
 *  the length of its answer in s->tx (0: none). Send the answer, then feed the rest
 *  (data + *used) until none is left. */
IDL_CHECKRETURN size_t idl_session_feed_buf(idl_session_t *s, const uint8_t *data, size_t n,
                                            size_t *used, uint32_t now);

/** Feed one received byte at `now`; returns the length of the answer now in s->tx (0: none).
 *  Send it before feeding the next byte. */
IDL_CHECKRETURN static inline size_t idl_session_feed(idl_session_t *s, uint8_t byte,
                                                      uint32_t now)
{
    size_t used;
    return idl_session_feed_buf(s, &byte, 1u, &used, now);
}

#if IDL_BUS
/** broadcast_next of HELLO_REPLY's bus extension: 1 when no broadcast ran this boot, else one
 *  window beyond the highest that did. */
IDL_CHECKRETURN uint32_t idl_session_broadcast_next(const idl_session_t *s);
#endif

/** next_seq of DEVICE_INFO (protocol/device_session.py first_seq): 1 on a fresh boot; else one
 *  window beyond the later of the highest number seen and the last start handed out, but never
 *  more than IDL_HANDOUT_SPAN ahead of the highest (HELLOs without requests then cycle). */
IDL_CHECKRETURN uint32_t idl_session_first_seq(const idl_session_t *s);

#endif /* IDL_SESSION_H */
