/* The YMODEM receiver: see idl_ymodem.h. Mirrors protocol/ymodem.py Receiver line by line. */
#include "idl_ymodem.h"

#include <string.h>

#include "idl_crc32c.h"
#include "idl_name.h"
#include "idl_tables.h"

#define BS 0x08u
#define SB_COUNT_AT 126u /* sb's block count in bytes 126-127 of a 128-byte block 0 */
#define ABSENT 0xFFu

/* actions, in the order of the table below */
enum {
    A_ACCEPT_HEADER, A_REFUSE_HEADER, A_END_BATCH, A_ASK_HEADER, A_CANCEL_SEQUENCE,
    A_PEER_CANCELLED, A_ACCEPT_BLOCK, A_REACK_HEADER, A_CANCEL_OTHER_HEADER, A_NAK_FIRST_BLOCK,
    A_ASK_FIRST_BLOCK, A_FIRST_EOT, A_PURGE, A_ACK_DUPLICATE, A_NAK, A_COMMIT, A_REACK_EOT,
    A_NAK_STALE_EOT, A_ASK_NEXT_HEADER, A_ACK_ONLY
};

#define E(next, action) (uint8_t)(((unsigned)(next) << 5) | (unsigned)(action))
#define X ABSENT

/* RX_TRANSITIONS: [state][input] -> (next state, action), generated from the Python table
 * (idl_tables.h, `idemlink contract`) */
static const uint8_t TABLE[IDL_YM_STATES - 1u][IDL_YM_INPUTS] = IDL_YM_RX_TABLE;

uint8_t idl_ym_rx_transition(unsigned state, unsigned input)
{
    if (state >= IDL_YM_STATES - 1u || input >= IDL_YM_INPUTS) {
        return ABSENT;
    }
    return TABLE[state][input];
}

/* ---- output -------------------------------------------------------------------------------- */

static void flush(idl_ym_rx_t *rx)
{
    if (rx->out_len != 0u && rx->io->send != NULL) {
        rx->io->send(rx->io->ctx, rx->out, rx->out_len);
    }
    rx->out_len = 0;
}

static void emit(idl_ym_rx_t *rx, uint8_t b)
{
    if (rx->out_len == IDL_YM_OUT_CAP) {
        flush(rx);
    }
    rx->out[rx->out_len++] = b;
}

static bool elapsed(uint32_t now, uint32_t since, uint32_t span) { return now - since >= span; }

/* ---- ending ---------------------------------------------------------------------------------- */

static void do_abort(idl_ym_rx_t *rx, idl_ym_end_t why, bool by_peer)
{
    rx->state = (uint8_t)IDL_YM_ABORTED;
    rx->end = (uint8_t)why;
    rx->flags &= (uint8_t) ~(IDL_YM_F_DEADLINE | IDL_YM_F_PURGING | IDL_YM_F_EOT_PENDING);
    rx->need = 0;
    if ((rx->flags & IDL_YM_F_FILE_OPEN) != 0u) {
        rx->flags &= (uint8_t)~IDL_YM_F_FILE_OPEN;
        if (rx->io->abort != NULL) {
            rx->io->abort(rx->io->ctx);
        }
    }
    if (!by_peer) {
        unsigned i;
        for (i = 0; i < IDL_YM_CAN_COUNT; i++) {
            emit(rx, (uint8_t)IDL_YM_CAN);
        }
    }
}

/* The shell refuses (storage failed, or stopping): unsent answers dropped, CAN x8 instead. */
static void refuse(idl_ym_rx_t *rx, idl_ym_end_t why)
{
    rx->out_len = 0;
    do_abort(rx, why, false);
}

/* ---- actions ------------------------------------------------------------------------------- */

/* What an action answers, unless it is special (0): an end (D_END | why, D_PEER: no CAN), or an
 * answer byte, 'C' after it, an error to count first, and the timer to arm (D_T(timer)). */
#define D_ACK 1u
#define D_NAK 2u
#define D_C 3u
#define D_WITH_C 0x04u
#define D_ERR 0x08u
#define D_T(t) (uint8_t)(((unsigned)(t) + 1u) << 4)
#define D_T_NAK 0x60u /* eot_confirm in WAIT_EOT_CONFIRM, else block */
#define D_END 0x80u
#define D_PEER 0x40u

static const uint8_t ACTION[] = {
    0u,                                           /* accept_header */
    D_END | IDL_YM_END_HEADER_REFUSED,            /* refuse_header */
    0u,                                           /* end_batch */
    0u,                                           /* ask_header */
    D_END | IDL_YM_END_OUT_OF_SEQUENCE,           /* cancel_sequence */
    D_END | D_PEER | IDL_YM_END_PEER_CANCELLED,   /* peer_cancelled */
    0u,                                           /* accept_block */
    D_ACK | D_WITH_C | D_T(IDL_YM_T_C_INTERVAL),  /* reack_header */
    D_END | IDL_YM_END_OTHER_HEADER,              /* cancel_other_header */
    D_ERR | D_NAK | D_T(IDL_YM_T_C_INTERVAL),     /* nak_first_block */
    D_ERR | D_C | D_T(IDL_YM_T_C_INTERVAL),       /* ask_first_block */
    0u,                                           /* first_eot */
    0u,                                           /* purge */
    D_ACK | D_T(IDL_YM_T_BLOCK),                  /* ack_duplicate */
    D_ERR | D_NAK | D_T_NAK,                      /* nak */
    0u,                                           /* commit */
    D_ACK | D_WITH_C | D_T(IDL_YM_T_C_INTERVAL),  /* reack_eot */
    D_ERR | D_NAK | D_T(IDL_YM_T_C_INTERVAL),     /* nak_stale_eot */
    0u,                                           /* ask_next_header */
    D_ACK                                         /* ack_only */
};

static const uint8_t ANSWER[4] = { 0u, (uint8_t)IDL_YM_ACK, (uint8_t)IDL_YM_NAK, (uint8_t)IDL_YM_C };

static void answer(idl_ym_rx_t *rx, unsigned d, uint32_t now)
{
    unsigned t = d >> 4;
    if ((d & D_ERR) != 0u) {
        rx->errors++;
        if (rx->errors >= rx->cfg->max_errors) {
            do_abort(rx, IDL_YM_END_TOO_MANY_ERRORS, false);
            return;
        }
    }
    if ((d & 3u) != 0u) {
        emit(rx, ANSWER[d & 3u]);
    }
    if ((d & D_WITH_C) != 0u) {
        emit(rx, (uint8_t)IDL_YM_C);
    }
    if (t == 6u) {
        t = 1u + (rx->state == (uint8_t)IDL_YM_WAIT_EOT_CONFIRM ? (unsigned)IDL_YM_T_EOT_CONFIRM
                                                                : (unsigned)IDL_YM_T_BLOCK);
    }
    if (t != 0u) {
        rx->deadline = now + rx->cfg->ms[t - 1u];
        rx->flags |= IDL_YM_F_DEADLINE;
    }
}

/* drop the line until it is quiet for T_PURGE, or for at most T_BLOCK (a line that never goes
 * quiet still counts an error per T_BLOCK and so ends the batch) */
static void purge(idl_ym_rx_t *rx, uint32_t now)
{
    rx->flags = (uint8_t)((rx->flags | IDL_YM_F_PURGING) & ~IDL_YM_F_PENDING_CAN);
    rx->last_byte_at = now;
    rx->deadline = now + rx->cfg->ms[IDL_YM_T_BLOCK];
}

static void accept_header(idl_ym_rx_t *rx, uint32_t now)
{
    rx->last_block = 0;
    rx->data_seen = 0;
    rx->delivered = 0;
    rx->errors = 0;
    if (rx->io->begin != NULL
        && !rx->io->begin(rx->io->ctx, rx->block, rx->name_len, rx->size,
                          (rx->flags & IDL_YM_F_SIZE_KNOWN) != 0u)) {
        refuse(rx, IDL_YM_END_STORAGE);
        return;
    }
    rx->flags |= IDL_YM_F_FILE_OPEN;
    answer(rx, D_ACK | D_WITH_C | D_T(IDL_YM_T_C_INTERVAL), now);
}

static void accept_block(idl_ym_rx_t *rx, uint32_t now)
{
    uint32_t room = rx->blen;
    rx->last_block++;
    rx->errors = 0;
    if ((rx->flags & IDL_YM_F_SIZE_KNOWN) != 0u && rx->size - rx->delivered < room) {
        room = rx->size - rx->delivered;
    }
    if (room != 0u) {
        if (rx->io->write != NULL
            && !rx->io->write(rx->io->ctx, rx->delivered, rx->block, (size_t)room)) {
            refuse(rx, IDL_YM_END_STORAGE);
            return;
        }
        rx->delivered += room;
    }
    rx->data_seen = 1;
    answer(rx, D_ACK | D_T(IDL_YM_T_BLOCK), now);
}

static void commit(idl_ym_rx_t *rx, uint32_t now)
{
    if (rx->commits != 0xFFu) {
        rx->commits++;
    }
    rx->errors = 0;
    rx->flags &= (uint8_t)~IDL_YM_F_MOVED_ON;
    if (rx->io->commit != NULL && !rx->io->commit(rx->io->ctx, rx->delivered)) {
        refuse(rx, IDL_YM_END_STORAGE);
        return;
    }
    rx->flags &= (uint8_t)~IDL_YM_F_FILE_OPEN;
    answer(rx, D_ACK | D_WITH_C | D_T(IDL_YM_T_C_INTERVAL), now);
}

static void input(idl_ym_rx_t *rx, idl_ym_input_t in, uint32_t now)
{
    uint8_t entry = idl_ym_rx_transition(rx->state, (unsigned)in);
    unsigned action = entry & 31u;
    unsigned d;
    if (entry == ABSENT) {
        return;
    }
    rx->state = (uint8_t)(entry >> 5);
    d = ACTION[action];
    if ((d & D_END) != 0u) {
        do_abort(rx, (idl_ym_end_t)(d & 15u), (d & D_PEER) != 0u);
        return;
    }
    if (d != 0u) {
        answer(rx, d, now);
        return;
    }
    switch (action) {
    case A_ACCEPT_HEADER:
        accept_header(rx, now);
        break;
    case A_END_BATCH:
        emit(rx, (uint8_t)IDL_YM_ACK);
        rx->flags &= (uint8_t)~IDL_YM_F_DEADLINE;
        rx->end = (uint8_t)IDL_YM_END_BATCH;
        break;
    case A_ASK_NEXT_HEADER: /* the sender moved on: an EOT is no longer a repeat */
        rx->flags |= IDL_YM_F_MOVED_ON;
        /* fall through */
    case A_ASK_HEADER:
        if (rx->state == (uint8_t)IDL_YM_WAIT_HEADER) { /* nobody has spoken yet: more patience */
            rx->c_sent++;
            if (rx->c_sent > rx->cfg->header_retries) {
                do_abort(rx, IDL_YM_END_NO_SENDER, false);
                break;
            }
            answer(rx, D_C | D_T(IDL_YM_T_C_INTERVAL), now);
        } else {
            answer(rx, D_ERR | D_C | D_T(IDL_YM_T_C_INTERVAL), now);
        }
        break;
    case A_ACCEPT_BLOCK:
        accept_block(rx, now);
        break;
    case A_FIRST_EOT:
        if ((rx->flags & IDL_YM_F_SIZE_KNOWN) != 0u && rx->delivered < rx->size) {
            /* the file is incomplete: an EOT here is noise or a short sender */
            rx->state = (uint8_t)IDL_YM_RECV_DATA;
            answer(rx, D_ERR | D_NAK | D_T(IDL_YM_T_BLOCK), now);
        } else {
            answer(rx, D_NAK | D_T(IDL_YM_T_EOT_CONFIRM), now);
        }
        break;
    case A_PURGE: /* drop the line until it is quiet, then NAK */
        purge(rx, now);
        break;
    default: /* A_COMMIT */
        commit(rx, now);
        break;
    }
}

/* ---- parsing ------------------------------------------------------------------------------- */

/* parse_header on the block buffer: 0 and rx->size / SIZE_KNOWN / name_len set, else why not */
static uint8_t parse_header(idl_ym_rx_t *rx)
{
    const uint8_t *p = rx->block;
    const uint8_t *nul = memchr(p, 0, rx->blen);
    const uint8_t *area;
    const uint8_t *end;
    const uint8_t *sp;
    size_t area_end = rx->blen;
    size_t alen;
    size_t flen;
    size_t i;
    uint32_t size = 0;
    bool big = false;
    idl_name_verdict_t v;
    if (nul == NULL) {
        return IDL_YM_REFUSE_NAME_NOT_TERMINATED;
    }
    v = idl_name_check(p, (size_t)(nul - p), rx->cfg->max_name);
    if (v != IDL_NAME_OK) {
        return (uint8_t)v;
    }
    if (rx->blen == IDL_YM_BLOCK_SMALL && p[SB_COUNT_AT - 1u] == 0u) {
        area_end = SB_COUNT_AT; /* 126-127: sb's block count, not metadata */
    }
    area = nul + 1;
    alen = area_end - (size_t)(area - p);
    if (alen < 2u) {
        return IDL_YM_REFUSE_SIZE_CUT; /* no room for even "0" and its end */
    }
    end = memchr(area, 0, alen);
    if (end == area) { /* no metadata only if nothing else stands in the area */
        for (i = 1; i < alen; i++) {
            if (area[i] != 0u) {
                return IDL_YM_REFUSE_SIZE_CUT;
            }
        }
        rx->flags &= (uint8_t)~IDL_YM_F_SIZE_KNOWN;
        rx->name_len = (uint8_t)(nul - p);
        return 0;
    }
    flen = end != NULL ? (size_t)(end - area) : alen;
    sp = memchr(area, ' ', flen);
    if (end == NULL && sp == NULL) {
        return IDL_YM_REFUSE_SIZE_CUT; /* the only field runs into the area's end */
    }
    if (sp != NULL) {
        flen = (size_t)(sp - area);
    }
    if (flen < 1u || flen > 20u) {
        return IDL_YM_REFUSE_BAD_SIZE;
    }
    for (i = 0; i < flen; i++) {
        uint32_t d = (uint32_t)area[i] - (uint32_t)'0';
        if (d > 9u) {
            return IDL_YM_REFUSE_BAD_SIZE;
        }
        big = big || size > (0xFFFFFFFFu - d) / 10u;
        size = size * 10u + d;
    }
    if (big || size > rx->cfg->max_file_size) {
        return IDL_YM_REFUSE_TOO_LARGE;
    }
    rx->size = size;
    rx->flags |= IDL_YM_F_SIZE_KNOWN;
    rx->name_len = (uint8_t)(nul - p);
    return 0;
}

static void classify(idl_ym_rx_t *rx, uint32_t now)
{
    uint32_t crc;
    uint8_t number = rx->number;
    uint8_t st = rx->state;
    if ((uint8_t)(number ^ rx->complement) != 0xFFu || rx->crc16 != 0u) {
        if ((rx->tail & IDL_YM_TAIL_CANCEL) != 0u) { /* the sender cancelled inside the block */
            input(rx, IDL_YM_IN_CANCEL, now);
            return;
        }
        purge(rx, now);
        return;
    }
    crc = idl_crc32c(rx->block, rx->blen);
    if (st == (uint8_t)IDL_YM_WAIT_HEADER || st == (uint8_t)IDL_YM_WAIT_NEXT_HEADER
        || st == (uint8_t)IDL_YM_DONE) {
        if (number != 0u) {
            /* after the commit only a byte-identical copy of the last block is a repeat */
            bool dup = st == (uint8_t)IDL_YM_WAIT_NEXT_HEADER && number == rx->last_block
                       && rx->blen == rx->last_len && crc == rx->last_crc;
            input(rx, dup ? IDL_YM_IN_BLOCK_DUP : IDL_YM_IN_BLOCK_OTHER, now);
        } else if (rx->block[0] == 0u) {
            input(rx, IDL_YM_IN_END_OF_BATCH, now);
        } else {
            uint8_t why = parse_header(rx);
            if (why == 0u) {
                rx->header_crc = crc;
                rx->header_len = rx->blen;
                input(rx, IDL_YM_IN_HEADER, now);
            } else {
                rx->refusal = why;
                input(rx, IDL_YM_IN_BAD_HEADER, now);
            }
        }
        return;
    }
    rx->last_crc = crc;
    rx->last_len = rx->blen;
    if (number == 0u && rx->data_seen == 0u
        && (rx->blen != rx->header_len || crc != rx->header_crc)) {
        input(rx, IDL_YM_IN_OTHER_HEADER, now); /* no data yet: block 0 can only be our header */
    } else if (number == (uint8_t)(rx->last_block + 1u)) {
        input(rx, IDL_YM_IN_BLOCK_NEXT, now);
    } else if (number == rx->last_block) {
        input(rx, IDL_YM_IN_BLOCK_DUP, now);
    } else {
        input(rx, IDL_YM_IN_BLOCK_OTHER, now);
    }
}

static void collect(idl_ym_rx_t *rx, uint8_t b, uint32_t now)
{
    if (b == (uint8_t)IDL_YM_CAN || b == BS) { /* a CAN CAN [CAN|BS]* tail: the sender cancels */
        uint8_t t = rx->tail;
        if (b == (uint8_t)IDL_YM_CAN && (t & IDL_YM_TAIL_CAN) != 0u) {
            t |= IDL_YM_TAIL_CANCEL;
        }
        rx->tail = (uint8_t)((t & IDL_YM_TAIL_CANCEL)
                             | (b == (uint8_t)IDL_YM_CAN ? IDL_YM_TAIL_CAN : 0u));
    } else {
        rx->tail = 0;
    }
    if (rx->pkt_len < 3u) {
        if (rx->pkt_len == 1u) {
            rx->number = b;
        } else {
            rx->complement = b;
        }
        rx->pkt_len++;
    } else {
        unsigned c = rx->crc16 ^ ((unsigned)b << 8);
        unsigned i;
        if (rx->got < rx->blen) {
            rx->block[rx->got++] = b;
        }
        for (i = 0; i < 8u; i++) { /* CRC-16/XMODEM over payload + CRC: 0 when intact */
            c = (c << 1) ^ ((c & 0x8000u) != 0u ? 0x1021u : 0u);
        }
        rx->crc16 = (uint16_t)c;
    }
    rx->need--;
    if (rx->need == 0u) {
        classify(rx, now);
    }
}

static void feed_byte(idl_ym_rx_t *rx, uint8_t b, uint32_t now)
{
    uint8_t st;
    rx->last_byte_at = now;
    rx->flags |= IDL_YM_F_HEARD;
    if ((rx->flags & IDL_YM_F_EOT_PENDING) != 0u) { /* a byte after an EOT: the EOT was noise */
        rx->flags &= (uint8_t)~IDL_YM_F_EOT_PENDING;
        input(rx, IDL_YM_IN_NOISE, now);
    }
    if ((rx->flags & IDL_YM_F_PURGING) != 0u || rx->need == 0u) {
        if (b == (uint8_t)IDL_YM_CAN) { /* CAN CAN, also while purging */
            if ((rx->flags & IDL_YM_F_PENDING_CAN) != 0u) {
                rx->flags &= (uint8_t)~IDL_YM_F_PENDING_CAN;
                input(rx, IDL_YM_IN_CANCEL, now);
            } else {
                rx->flags |= IDL_YM_F_PENDING_CAN;
            }
            return;
        }
        rx->flags &= (uint8_t)~IDL_YM_F_PENDING_CAN;
        if ((rx->flags & IDL_YM_F_PURGING) != 0u) {
            return;
        }
    } else {
        collect(rx, b, now);
        return;
    }
    st = rx->state;
    if (b == (uint8_t)IDL_YM_SOH || b == (uint8_t)IDL_YM_STX) {
        rx->blen = (uint16_t)(b == (uint8_t)IDL_YM_SOH ? IDL_YM_BLOCK_SMALL : IDL_YM_BLOCK_LARGE);
        rx->need = (uint16_t)(rx->blen + 4u);
        rx->pkt_len = 1;
        rx->got = 0;
        rx->crc16 = 0;
        rx->tail = 0;
    } else if (b == (uint8_t)IDL_YM_EOT) {
        if (st == (uint8_t)IDL_YM_WAIT_FIRST_BLOCK || st == (uint8_t)IDL_YM_RECV_DATA
            || st == (uint8_t)IDL_YM_WAIT_EOT_CONFIRM) {
            rx->flags |= IDL_YM_F_EOT_PENDING; /* counts only if it stays last in the burst */
        } else {
            input(rx,
                  st == (uint8_t)IDL_YM_WAIT_NEXT_HEADER && (rx->flags & IDL_YM_F_MOVED_ON) != 0u
                      ? IDL_YM_IN_STALE_EOT
                      : IDL_YM_IN_EOT,
                  now);
        }
    } else if (st == (uint8_t)IDL_YM_WAIT_EOT_CONFIRM) {
        input(rx, IDL_YM_IN_NOISE, now); /* only EOT #2 (or a resent block) may come now */
    }
    /* anything else between blocks is line noise: ignored */
}

/* ---- public -------------------------------------------------------------------------------- */

void idl_ym_rx_init(idl_ym_rx_t *rx, const idl_ym_config_t *cfg, const idl_ym_io_t *io,
                    uint8_t *block)
{
    memset(rx, 0, sizeof *rx);
    rx->cfg = cfg;
    rx->io = io;
    rx->block = block;
}

void idl_ym_rx_start(idl_ym_rx_t *rx, uint32_t now)
{
    answer(rx, D_C | D_T(IDL_YM_T_C_INTERVAL), now);
    flush(rx);
}

static void tick(idl_ym_rx_t *rx, uint32_t now)
{
    const idl_ym_config_t *cfg = rx->cfg;
    if (cfg->ms[IDL_YM_T_SILENCE] != 0u && (rx->flags & IDL_YM_F_HEARD) != 0u
        && rx->state < (uint8_t)IDL_YM_DONE && elapsed(now, rx->last_byte_at, cfg->ms[IDL_YM_T_SILENCE])) {
        do_abort(rx, IDL_YM_END_SILENT, false);
        return;
    }
    if ((rx->flags & IDL_YM_F_PURGING) != 0u) {
        if (elapsed(now, rx->last_byte_at, cfg->ms[IDL_YM_T_PURGE])
            || (int32_t)(now - rx->deadline) >= 0) {
            rx->flags &= (uint8_t)~IDL_YM_F_PURGING;
            input(rx, IDL_YM_IN_BAD_PACKET, now);
        }
        return;
    }
    if (rx->need != 0u) {
        if (elapsed(now, rx->last_byte_at, cfg->ms[IDL_YM_T_INTERBYTE])) {
            rx->need = 0;
            input(rx, (rx->tail & IDL_YM_TAIL_CANCEL) != 0u ? IDL_YM_IN_CANCEL : IDL_YM_IN_BAD_PACKET,
                  now);
        }
        return;
    }
    if ((rx->flags & IDL_YM_F_DEADLINE) != 0u && (int32_t)(now - rx->deadline) >= 0) {
        rx->flags &= (uint8_t)~IDL_YM_F_DEADLINE;
        input(rx, IDL_YM_IN_TIMEOUT, now);
    }
}

void idl_ym_rx_tick(idl_ym_rx_t *rx, uint32_t now)
{
    tick(rx, now);
    flush(rx);
}

void idl_ym_rx_feed(idl_ym_rx_t *rx, const uint8_t *data, size_t n, uint32_t now)
{
    size_t i;
    for (i = 0; i < n && rx->state != (uint8_t)IDL_YM_ABORTED; i++) {
        feed_byte(rx, data[i], now);
    }
    if ((rx->flags & IDL_YM_F_EOT_PENDING) != 0u) {
        rx->flags &= (uint8_t)~IDL_YM_F_EOT_PENDING;
        input(rx, IDL_YM_IN_EOT, now);
    }
    idl_ym_rx_tick(rx, now);
}

void idl_ym_rx_abort(idl_ym_rx_t *rx)
{
    if (!idl_ym_rx_finished(rx)) {
        refuse(rx, IDL_YM_END_STOPPED);
        flush(rx);
    }
}

bool idl_ym_rx_finished(const idl_ym_rx_t *rx) { return rx->state >= (uint8_t)IDL_YM_DONE; }
