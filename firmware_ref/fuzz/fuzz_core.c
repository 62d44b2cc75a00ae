/* libFuzzer target: arbitrary bytes into a whole device (framed session + Modbus + registers),
 * and (first byte 0xFE) into the YMODEM receiver: bursts and time steps from the input, checking
 * that the storage calls keep their contract (begin before write, writes in order and never past
 * the declared size, commit or abort once per file) and every answer is one of the receiver's;
 * (0xFD) into the plain Modbus RTU face: chunks of bytes, each followed by a pause, half of them
 * closed with a valid CRC-16; (0xFF) into the name rules and FILE_INFO.
 * The first bytes of the input steer the frames, the rest is split into chunks; the target checks
 * that nothing crashes or reads out of bounds (ASan/UBSan), that every answer is one delimited
 * frame within IDL_WIRE_MAX, and that the decoder never holds more than IDL_MAX_ENCODED bytes.
 * Half of the inputs are wrapped as valid REQUEST frames so the fuzzer reaches the registers (each
 * frame fed as one buffer); of the rest, half are fed in chunks of 1..64 bytes through
 * idl_session_feed_buf (the bulk scan on any split), half byte by byte.
 * Built with IDL_BUS=1 (make fuzz-core does) the device has address 5 and the wrapped frames go
 * to it, to another device, to every device (broadcast) or to none, steered by the input.
 * Built with IDL_AUTH=1 (make fuzz-core does), a first byte 0xFC makes the device keyed: a HELLO
 * with the auth extension (the host nonce from the input, the right key id or another) opens a
 * session, then each chunk becomes a frame signed with the session key (the MAC check passes, the
 * request runs), with another key (the MAC check refuses it), unsigned (AUTHENTICATION_REQUIRED)
 * or another HELLO (the same or a new nonce): the handshake and the MAC check under the
 * sanitizers, every answer one delimited frame. */
#include <stdlib.h>
#include <string.h>

#include "idl_files.h"
#include "idl_modbus.h"
#include "idl_name.h"
#include "idl_rtu.h"
#include "idl_session.h"
#include "idl_ymodem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint16_t execute(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *resp,
                        uint32_t now, uint32_t seq)
{
    (void)seq;
    return idl_modbus_execute((idl_regs_t *)ctx, pdu, len, resp, now);
}

#if IDL_BUS
static bool broadcast_ok(void *ctx, const uint8_t *pdu, uint16_t len)
{
    (void)ctx;
    return idl_modbus_broadcast_ok(pdu, len);
}
#endif

static void check_answer(const idl_session_t *s, size_t n)
{
    if (n == 0u) {
        return;
    }
    if (n < 2u + IDL_MIN_FRAME || n > IDL_WIRE_MAX || s->tx[0] != 0u || s->tx[n - 1u] != 0u
        || memchr(s->tx + 1, 0, n - 2u) != NULL) {
        abort();
    }
}

#if IDL_AUTH
/* the keyed mode's port: one key while `keyed`, nonces from a counter */
static int keyed;
static const uint8_t KEY[IDL_KEY_LEN] = { 0x4B, 0x45, 0x59 };
static uint8_t nonce_counter;

const uint8_t *idl_port_auth_key(unsigned i) { return keyed && i == 0u ? KEY : NULL; }

void idl_port_random(uint8_t *buf, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        buf[i] = nonce_counter++;
    }
}

/* A HELLO with the auth extension: nonce byte `nonce`, the device's key id or (wrong) another */
static size_t keyed_hello(uint8_t *wire, uint32_t seq, uint8_t nonce, int wrong)
{
    uint8_t p[1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN + 4u];
    memset(p, nonce, sizeof p);
    p[0] = (uint8_t)IDL_PROTOCOL_VERSION;
    idl_auth_key_id(p + 1u + IDL_CONTRACT_HASH_LEN + IDL_NONCE_LEN, KEY);
    p[sizeof p - 1u] ^= (uint8_t)(wrong ? 1u : 0u);
    return idl_frame_encode(wire, IDL_FT_HELLO, 0u, 0u, seq, p, sizeof p);
}

/* 0xFC: the keyed device (see the top) */
static void fuzz_keyed(idl_session_t *s, const idl_session_config_t *cfg, uint8_t *wire,
                       const uint8_t *data, size_t size)
{
    static const uint8_t OTHER[IDL_KEY_LEN] = { 0x4F };
    size_t i = 0;
    uint32_t now = 0;
    keyed = 1;
    idl_session_init(s, cfg, 7u);
    while (i + 2u <= size) {
        size_t len = data[i] % 64u;
        uint8_t how = data[i + 1u];
        uint32_t seq = how >> 3;
        size_t n;
        size_t k;
        i += 2u;
        if (len > size - i) {
            len = size - i;
        }
        switch (how & 7u) {
        case 0:
        case 1:
            n = keyed_hello(wire, seq, (uint8_t)(len != 0u ? data[i] : 0u), how & 1u);
            break;
        case 2:
        case 3:
        case 4: /* signed with the session key (what a keyed host sends) */
            n = idl_frame_encode_signed(wire, IDL_FRAME_NO_ADDRESS,
                                        s->keyed > 1u ? s->auth.session : OTHER,
                                        IDL_FT_REQUEST, 0u, (how & 1u) ? 7u : 8u, seq, data + i,
                                        len);
            break;
        case 5: /* another key: refused by the MAC check */
            n = idl_frame_encode_signed(wire, IDL_FRAME_NO_ADDRESS, OTHER, IDL_FT_REQUEST, 0u, 7u,
                                        seq, data + i, len);
            break;
        default: /* unsigned */
            n = idl_frame_encode(wire, (how & 1u) ? IDL_FT_REQUEST : IDL_FT_RESPONSE, 0u, 7u, seq,
                                 data + i, len);
            break;
        }
        i += len;
        now += 40u;
        for (k = 0; k < n;) {
            size_t used = 0;
            check_answer(s, idl_session_feed_buf(s, wire + k, n - k, &used, now));
            if (used == 0u || used > n - k) {
                abort();
            }
            k += used;
        }
    }
    keyed = 0;
}
#endif

/* ---- the YMODEM receiver ---------------------------------------------------------------- */

static struct {
    bool open;
    bool known;
    uint32_t size;
    uint32_t next; /* the next offset written */
} fz;

static bool fz_begin(void *ctx, const uint8_t *name, size_t len, uint32_t size, bool known)
{
    (void)ctx;
    if (fz.open || len == 0u || len > IDL_YM_MAX_NAME || memchr(name, 0, len) != NULL) {
        abort();
    }
    fz.open = true;
    fz.known = known;
    fz.size = size;
    fz.next = 0;
    return name[0] != 'R'; /* some names refused by the storage */
}

static bool fz_write(void *ctx, uint32_t offset, const uint8_t *data, size_t n)
{
    (void)ctx;
    if (!fz.open || offset != fz.next || n == 0u || n > IDL_YM_BLOCK_LARGE
        || (fz.known && offset + n > fz.size)) {
        abort();
    }
    fz.next = offset + (uint32_t)n;
    return data[0] != 0xEEu || n != 7u;
}

static bool fz_commit(void *ctx, uint32_t size)
{
    (void)ctx;
    if (!fz.open || size != fz.next || (fz.known && size != fz.size)) {
        abort();
    }
    fz.open = false;
    return true;
}

static void fz_abort(void *ctx)
{
    (void)ctx;
    if (!fz.open) {
        abort();
    }
    fz.open = false;
}

static void fz_send(void *ctx, const uint8_t *data, size_t n)
{
    size_t i;
    (void)ctx;
    if (n == 0u || n > IDL_YM_OUT_CAP) {
        abort();
    }
    for (i = 0; i < n; i++) {
        if (data[i] != IDL_YM_ACK && data[i] != IDL_YM_NAK && data[i] != IDL_YM_C
            && data[i] != IDL_YM_CAN) {
            abort();
        }
    }
}

static uint16_t crc16(const uint8_t *p, size_t n)
{
    unsigned c = 0;
    size_t i;
    unsigned k;
    for (i = 0; i < n; i++) {
        c ^= (unsigned)p[i] << 8;
        for (k = 0; k < 8u; k++) {
            c = ((c << 1) ^ ((c & 0x8000u) != 0u ? 0x1021u : 0u)) & 0xFFFFu;
        }
    }
    return (uint16_t)c;
}

/* When the first byte of a burst says so, make its leading block valid (complement and CRC), so
 * the fuzzer reaches headers, data and the EOT machine instead of NAKs */
static void repair(uint8_t *b, size_t n)
{
    size_t len = b[0] == IDL_YM_SOH ? IDL_YM_BLOCK_SMALL : IDL_YM_BLOCK_LARGE;
    uint16_t c;
    if ((b[0] != IDL_YM_SOH && b[0] != IDL_YM_STX) || n < len + 5u) {
        return;
    }
    b[2] = (uint8_t)~b[1];
    c = crc16(b + 3, len);
    b[3 + len] = (uint8_t)(c >> 8);
    b[4 + len] = (uint8_t)c;
}

/* [time step (bit 7: repair the block), burst length / 8, bytes...]... into a receiver with small
 * limits */
static void fuzz_ymodem(const uint8_t *data, size_t size)
{
    static const idl_ym_config_t cfg = { { 1000u, 10000u, 1000u, 250u, 5000u, 60000u }, 5000u,
                                         4u, 4u, 64u };
    static const idl_ym_io_t io = { fz_begin, fz_write, fz_commit, fz_abort, fz_send, NULL };
    static idl_ym_rx_t rx;
    static uint8_t block[IDL_YM_BLOCK_LARGE];
    static uint8_t burst[255u * 8u];
    uint32_t now = 0;
    size_t i = 0;
    memset(&fz, 0, sizeof fz);
    idl_ym_rx_init(&rx, &cfg, &io, block);
    idl_ym_rx_start(&rx, now);
    while (i + 2u <= size) {
        size_t n = (size_t)data[i + 1u] * 8u;
        bool fix = (data[i] & 0x80u) != 0u;
        now += (uint32_t)(data[i] & 0x7Fu) * 125u;
        i += 2u;
        if (n > size - i) {
            n = size - i;
        }
        if (n == 0u) {
            idl_ym_rx_tick(&rx, now);
        } else {
            memcpy(burst, data + i, n);
            if (fix) {
                repair(burst, n);
            }
            idl_ym_rx_feed(&rx, burst, n, now);
        }
        i += n;
    }
    if (data[0] & 1u) {
        idl_ym_rx_abort(&rx);
    }
    if (idl_ym_rx_finished(&rx) && fz.open) {
        abort(); /* a finished batch leaves no file open */
    }
}

static int present(void *ctx, const uint8_t *name, uint8_t len, uint32_t *size, uint32_t *crc)
{
    (void)ctx;
    *size = len;
    *crc = len != 0u ? name[0] : 0u;
    return len & 1u; /* odd-length names exist */
}

/* [len, bytes...] chunks: each is fed to the RTU face (with a CRC when len is odd), then a pause. */
static void fuzz_rtu(idl_regs_t *regs, const uint8_t *data, size_t size)
{
    static idl_rtu_t rtu;
    static uint8_t frame[IDL_RTU_MAX_REQUEST + 2u];
    size_t i = 0;
    uint32_t now = 0;
    idl_rtu_init(&rtu, regs, (uint8_t)(size > 0u ? data[0] % 4u : 1u));
    while (i < size) {
        size_t len = data[i] % (IDL_RTU_MAX_REQUEST + 1u);
        bool with_crc = (data[i] & 1u) != 0u;
        size_t k;
        i++;
        if (len > size - i) {
            len = size - i;
        }
        memcpy(frame, data + i, len);
        i += len;
        if (with_crc && len >= 2u) {
            uint16_t crc = idl_crc16_modbus(frame, len);
            frame[len++] = (uint8_t)crc;
            frame[len++] = (uint8_t)(crc >> 8);
        }
        now += 10u;
        for (k = 0; k < len; k++) {
            if (idl_rtu_feed(&rtu, frame[k], now) > IDL_RTU_MAX_FRAME
                || rtu.len > sizeof rtu.buf) {
                abort();
            }
        }
        if (idl_rtu_pause(&rtu, now) > IDL_RTU_MAX_FRAME || rtu.len != 0u) {
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static idl_regs_t regs;
    static idl_session_t session;
    static const uint8_t hash[IDL_MAP_HASH_LEN] = IDL_MAP_HASH_BYTES;
    static uint8_t wire[IDL_WIRE_MAX];
    static const idl_session_config_t cfg = { execute, &regs, "fuzz", "f-1", IDL_MAP_NAME, hash,
                                              32u
#if IDL_BUS
                                              , 5u, broadcast_ok
#endif
    };
    size_t i;
    uint32_t now = 0;
    if (size > 1u && data[0] == 0xFEu) {
        fuzz_ymodem(data + 1, size - 1u);
        return 0;
    }
    if (size > 1u && data[0] == 0xFFu) { /* the name rules and FILE_INFO on raw bytes */
        uint8_t answer[IDL_MB_FILE_INFO_ANSWER_LEN];
        if (idl_name_check(data + 1, size - 1u, 255u) > IDL_NAME_TRAILING_DOT_SPACE) {
            abort(); /* a verdict outside its enum */
        }
        uint16_t len = (uint16_t)(size - 1u > 300u ? 300u : size - 1u);
        if (idl_file_info_execute(data + 1, len, answer, NULL, NULL) > sizeof answer
            || idl_file_info_execute(data + 1, len, answer, present, NULL) > sizeof answer) {
            abort();
        }
        return 0;
    }
    idl_regs_init(&regs, 100u, NULL, NULL, NULL, 0u);
    if (size > 1u && data[0] == 0xFDu) {
        fuzz_rtu(&regs, data + 1, size - 1u);
        return 0;
    }
#if IDL_AUTH
    if (size > 1u && data[0] == 0xFCu) {
        fuzz_keyed(&session, &cfg, wire, data + 1, size - 1u);
        return 0;
    }
#endif
    idl_session_init(&session, &cfg, 7u);
    if (size > 0u && (data[0] & 1u) != 0u) {
        /* each chunk [len, seq, bytes...] becomes one valid REQUEST frame */
        i = 1;
        while (i + 2u <= size) {
            size_t len = data[i] % 64u;
            uint32_t seq = data[i + 1u] % 16u;
            size_t n;
            size_t k;
            i += 2u;
            if (len > size - i) {
                len = size - i;
            }
#if IDL_BUS
            {
                static const uint16_t to[4] = { IDL_FRAME_NO_ADDRESS, 5u, 6u, 0u };
                n = idl_frame_encode_addressed(wire, to[(data[i - 1u] >> 4) & 3u],
                                               IDL_FT_REQUEST, 0u, 7u, seq, data + i, len);
            }
#else
            n = idl_frame_encode(wire, IDL_FT_REQUEST, 0u, 7u, seq, data + i, len);
#endif
            i += len;
            now += 40u;
            for (k = 0; k < n;) { /* the frame as one buffer: the bulk scan */
                size_t used = 0;
                check_answer(&session, idl_session_feed_buf(&session, wire + k, n - k, &used, now));
                if (used == 0u || used > n - k) {
                    abort();
                }
                k += used;
            }
        }
    } else if (size > 0u && (data[0] & 2u) != 0u) {
        /* raw bytes in chunks of 1..64 (the chunk length from the data): the bulk scan on any
         * split, the decoder bounded */
        i = 1;
        while (i < size) {
            size_t chunk = 1u + data[i] % 64u;
            size_t end = chunk < size - i ? i + chunk : size;
            while (i < end) {
                size_t used = 0;
                size_t out = idl_session_feed_buf(&session, data + i, end - i, &used, now);
                check_answer(&session, out);
                if (used == 0u || used > end - i || session.decoder.len > IDL_MAX_ENCODED) {
                    abort();
                }
                i += used;
            }
        }
    } else {
        for (i = 0; i < size; i++) {
            check_answer(&session, idl_session_feed(&session, data[i], now));
            if (session.decoder.len > IDL_MAX_ENCODED) {
                abort();
            }
        }
    }
    return 0;
}
