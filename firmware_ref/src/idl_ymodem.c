/* The YMODEM receiver: see idl_ymodem.h. Mirrors protocol/ymodem.py Receiver line by line. */
#include "idl_ymodem.h"

#include <string.h>

#include "idl_crc32c.h"
#include "idl_name.h"

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

/* RX_TRANSITIONS: [state][input] -> (next state, action); inputs in idl_ym_input_t order:
 * HEADER BAD_HEADER END_OF_BATCH BLOCK_NEXT BLOCK_DUP BLOCK_OTHER OTHER_HEADER BAD_PACKET EOT
 * STALE_EOT NOISE CANCEL TIMEOUT */
static const uint8_t TABLE[IDL_YM_STATES - 1u][IDL_YM_INPUTS] = {
    /* WAIT_HEADER */
    { E(1, A_ACCEPT_HEADER), E(6, A_REFUSE_HEADER), E(5, A_END_BATCH), X, X,
      E(6, A_CANCEL_SEQUENCE), X, E(0, A_ASK_HEADER), X, X, X, E(6, A_PEER_CANCELLED),
      E(0, A_ASK_HEADER) },
    /* WAIT_FIRST_BLOCK */
    { X, X, X, E(2, A_ACCEPT_BLOCK), E(1, A_REACK_HEADER), E(6, A_CANCEL_SEQUENCE),
      E(6, A_CANCEL_OTHER_HEADER), E(1, A_NAK_FIRST_BLOCK), E(3, A_FIRST_EOT), X, E(1, A_PURGE),
      E(6, A_PEER_CANCELLED), E(1, A_ASK_FIRST_BLOCK) },
    /* RECV_DATA */
    { X, X, X, E(2, A_ACCEPT_BLOCK), E(2, A_ACK_DUPLICATE), E(6, A_CANCEL_SEQUENCE),
      E(6, A_CANCEL_OTHER_HEADER), E(2, A_NAK), E(3, A_FIRST_EOT), X, E(2, A_PURGE),
      E(6, A_PEER_CANCELLED), E(2, A_NAK) },
    /* WAIT_EOT_CONFIRM */
    { X, X, X, E(2, A_ACCEPT_BLOCK), E(2, A_ACK_DUPLICATE), E(6, A_CANCEL_SEQUENCE),
      E(6, A_CANCEL_OTHER_HEADER), E(3, A_NAK), E(4, A_COMMIT), X, E(2, A_PURGE),
      E(6, A_PEER_CANCELLED), E(3, A_NAK) },
    /* WAIT_NEXT_HEADER */
    { E(1, A_ACCEPT_HEADER), E(6, A_REFUSE_HEADER), E(5, A_END_BATCH), X, E(4, A_ACK_ONLY),
      E(6, A_CANCEL_SEQUENCE), X, E(4, A_ASK_NEXT_HEADER), E(4, A_REACK_EOT),
      E(4, A_NAK_STALE_EOT), X, E(6, A_PEER_CANCELLED), E(4, A_ASK_HEADER) },
    /* DONE */
    { X, X, E(5, A_ACK_ONLY), X, X, X, X, X, X, X, X, X, X },
};

uint8_t idl_ym_rx_transition(unsigned state, unsigned input)
{
    if (state >= IDL_YM_STATES - 1u || input >= IDL_YM_INPUTS) {
        return ABSENT;
    }
    return TABLE[state][input];
}

void idl_ym_default_config(idl_ym_config_t *cfg, uint32_t max_file_size)
{
    cfg->c_interval_ms = 3000u;
    cfg->block_ms = 10000u;
    cfg->interbyte_ms = 1000u;
    cfg->purge_quiet_ms = 250u;
    cfg->eot_confirm_ms = 5000u;
    cfg->silence_ms = 60000u;
    cfg->max_file_size = max_file_size;
    cfg->header_retries = 20u;
    cfg->max_errors = 10u;
    cfg->max_name = (uint8_t)IDL_YM_MAX_NAME;
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

static void emit_ack_c(idl_ym_rx_t *rx)
{
    emit(rx, (uint8_t)IDL_YM_ACK);
    emit(rx, (uint8_t)IDL_YM_C);
}

static void arm(idl_ym_rx_t *rx, uint32_t now, uint32_t delay)
{
    rx->deadline = now + delay;
    rx->flags |= IDL_YM_F_DEADLINE;
}

static bool elapsed(uint32_t now, uint32_t since, uint32_t span) { return now - since >= span; }

/* ---- ending ---------------------------------------------------------------------------------- */

static void do_abort(idl_ym_rx_t *rx, idl_ym_end_t why, bool by_peer)
{
    unsigned i;
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

static bool error(idl_ym_rx_t *rx)
{
    rx->errors++;
    if (rx->errors >= rx->cfg->max_errors) {
        do_abort(rx, IDL_YM_END_TOO_MANY_ERRORS, false);
        return true;
    }
    return false;
}

/* ---- actions ------------------------------------------------------------------------------- */

static void ask_header(idl_ym_rx_t *rx, uint32_t now)
{
    if (rx->state == (uint8_t)IDL_YM_WAIT_HEADER) { /* nobody has spoken yet: longer patience */
        rx->c_sent++;
        if (rx->c_sent > rx->cfg->header_retries) {
            do_abort(rx, IDL_YM_END_NO_SENDER, false);
            return;
        }
    } else if (error(rx)) {
        return;
    }
    emit(rx, (uint8_t)IDL_YM_C);
    arm(rx, now, rx->cfg->c_interval_ms);
}

/* answer `b` and wait `delay` unless the error limit is reached */
static void answer_error(idl_ym_rx_t *rx, uint32_t now, uint8_t b, uint32_t delay)
{
    if (!error(rx)) {
        emit(rx, b);
        arm(rx, now, delay);
    }
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
    emit_ack_c(rx);
    arm(rx, now, rx->cfg->c_interval_ms);
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
    emit(rx, (uint8_t)IDL_YM_ACK);
    arm(rx, now, rx->cfg->block_ms);
}

static void first_eot(idl_ym_rx_t *rx, uint32_t now)
{
    if ((rx->flags & IDL_YM_F_SIZE_KNOWN) != 0u && rx->delivered < rx->size) {
        /* the file is incomplete: an EOT here is noise or a short sender */
        rx->state = (uint8_t)IDL_YM_RECV_DATA;
        answer_error(rx, now, (uint8_t)IDL_YM_NAK, rx->cfg->block_ms);
        return;
    }
    emit(rx, (uint8_t)IDL_YM_NAK);
    arm(rx, now, rx->cfg->eot_confirm_ms);
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
    emit_ack_c(rx);
    arm(rx, now, rx->cfg->c_interval_ms);
}

static void input(idl_ym_rx_t *rx, idl_ym_input_t in, uint32_t now)
{
    uint8_t entry = idl_ym_rx_transition(rx->state, (unsigned)in);
    const idl_ym_config_t *cfg = rx->cfg;
    if (entry == ABSENT) {
        return;
    }
    rx->state = (uint8_t)(entry >> 5);
    switch (entry & 31u) {
    case A_ACCEPT_HEADER:
        accept_header(rx, now);
        break;
    case A_REFUSE_HEADER:
        do_abort(rx, IDL_YM_END_HEADER_REFUSED, false);
        break;
    case A_END_BATCH:
        emit(rx, (uint8_t)IDL_YM_ACK);
        rx->flags &= (uint8_t)~IDL_YM_F_DEADLINE;
        rx->end = (uint8_t)IDL_YM_END_BATCH;
        break;
    case A_ASK_NEXT_HEADER: /* the sender moved on: an EOT is no longer a repeat */
        rx->flags |= IDL_YM_F_MOVED_ON;
        ask_header(rx, now);
        break;
    case A_ASK_HEADER:
        ask_header(rx, now);
        break;
    case A_CANCEL_SEQUENCE:
        do_abort(rx, IDL_YM_END_OUT_OF_SEQUENCE, false);
        break;
    case A_CANCEL_OTHER_HEADER:
        do_abort(rx, IDL_YM_END_OTHER_HEADER, false);
        break;
    case A_PEER_CANCELLED:
        do_abort(rx, IDL_YM_END_PEER_CANCELLED, true);
        break;
    case A_ACCEPT_BLOCK:
        accept_block(rx, now);
        break;
    case A_REACK_HEADER:
    case A_REACK_EOT:
        emit_ack_c(rx);
        arm(rx, now, cfg->c_interval_ms);
        break;
    case A_NAK_FIRST_BLOCK:
        answer_error(rx, now, (uint8_t)IDL_YM_NAK, cfg->c_interval_ms);
        break;
    case A_ASK_FIRST_BLOCK:
        answer_error(rx, now, (uint8_t)IDL_YM_C, cfg->c_interval_ms);
        break;
    case A_FIRST_EOT:
        first_eot(rx, now);
        break;
    case A_PURGE: /* drop the line until it is quiet, then NAK */
        rx->flags = (uint8_t)((rx->flags | IDL_YM_F_PURGING) & ~IDL_YM_F_PENDING_CAN);
        rx->last_byte_at = now;
        break;
    case A_ACK_DUPLICATE:
        emit(rx, (uint8_t)IDL_YM_ACK);
        arm(rx, now, cfg->block_ms);
        break;
    case A_NAK:
        answer_error(rx, now, (uint8_t)IDL_YM_NAK,
                     rx->state == (uint8_t)IDL_YM_WAIT_EOT_CONFIRM ? cfg->eot_confirm_ms
                                                                  : cfg->block_ms);
        break;
    case A_COMMIT:
        commit(rx, now);
        break;
    case A_NAK_STALE_EOT:
        answer_error(rx, now, (uint8_t)IDL_YM_NAK, cfg->c_interval_ms);
        break;
    default: /* A_ACK_ONLY */
        emit(rx, (uint8_t)IDL_YM_ACK);
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
        rx->flags = (uint8_t)((rx->flags | IDL_YM_F_PURGING) & ~IDL_YM_F_PENDING_CAN);
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
    unsigned i;
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
        if (rx->got < rx->blen) {
            rx->block[rx->got++] = b;
        }
        unsigned c = rx->crc16 ^ ((unsigned)b << 8);
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
    emit(rx, (uint8_t)IDL_YM_C);
    arm(rx, now, rx->cfg->c_interval_ms);
    flush(rx);
}

static void tick(idl_ym_rx_t *rx, uint32_t now)
{
    const idl_ym_config_t *cfg = rx->cfg;
    if (cfg->silence_ms != 0u && (rx->flags & IDL_YM_F_HEARD) != 0u
        && rx->state < (uint8_t)IDL_YM_DONE && elapsed(now, rx->last_byte_at, cfg->silence_ms)) {
        do_abort(rx, IDL_YM_END_SILENT, false);
        return;
    }
    if ((rx->flags & IDL_YM_F_PURGING) != 0u) {
        if (elapsed(now, rx->last_byte_at, cfg->purge_quiet_ms)) {
            rx->flags &= (uint8_t)~IDL_YM_F_PURGING;
            input(rx, IDL_YM_IN_BAD_PACKET, now);
        }
        return;
    }
    if (rx->need != 0u) {
        if (elapsed(now, rx->last_byte_at, cfg->interbyte_ms)) {
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
    tick(rx, now);
    flush(rx);
}

void idl_ym_rx_tick(idl_ym_rx_t *rx, uint32_t now)
{
    tick(rx, now);
    flush(rx);
}

void idl_ym_rx_abort(idl_ym_rx_t *rx)
{
    if (!idl_ym_rx_finished(rx)) {
        refuse(rx, IDL_YM_END_STOPPED);
        flush(rx);
    }
}

bool idl_ym_rx_finished(const idl_ym_rx_t *rx) { return rx->state >= (uint8_t)IDL_YM_DONE; }
