/* The device core for the ctypes tests (tests/test_c_device.py): one self-contained instance per
 * caller-allocated buffer (size from idl_shim_sizeof), with the thermal map's over-temperature
 * rule, settable external fault conditions and a recording, optionally failing, persist hook.
 * Not part of the firmware API. */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "idl_files.h"
#include "idl_modbus.h"
#include "idl_name.h"
#include "posix_files.h"
#include "idl_rtu.h"
#include "idl_session.h"

typedef struct {
    idl_regs_t regs;
    idl_session_config_t cfg;
    char device_id[IDL_MAX_DEVICE_ID_LEN + 1u];
    uint16_t external;
    uint8_t persist_fail;
    uint32_t persist_calls;
    uint16_t saved[IDL_REG_COUNT];
    uint16_t saved_generation;
    idl_session_t session;
    idl_rtu_t rtu;
} idl_shim_t;

static const uint8_t MAP_HASH[IDL_MAP_HASH_LEN] = IDL_MAP_HASH_BYTES;

size_t idl_shim_sizeof(void);
int idl_shim_restore(idl_shim_t *s, const uint16_t *values, uint16_t generation, uint32_t now);
void idl_shim_init(idl_shim_t *s, uint32_t epoch, uint32_t trigger_ms, const char *device_id,
                   uint32_t now);
size_t idl_shim_feed(idl_shim_t *s, const uint8_t *data, size_t n, uint32_t now, uint8_t *out,
                     size_t cap);
uint16_t idl_shim_execute(idl_shim_t *s, const uint8_t *pdu, uint16_t n, uint32_t now,
                          uint8_t *out);
void idl_shim_tick(idl_shim_t *s, uint32_t now);
int idl_shim_set_input(idl_shim_t *s, uint16_t address, uint16_t value, uint32_t now);
void idl_shim_set_external(idl_shim_t *s, uint16_t bits, uint32_t now);
int32_t idl_shim_get(const idl_shim_t *s, uint16_t address);
int idl_shim_force_trigger(idl_shim_t *s, uint16_t address, uint16_t raw);
void idl_shim_persist_fail(idl_shim_t *s, int fail);
uint32_t idl_shim_persist_calls(const idl_shim_t *s);
int32_t idl_shim_saved(const idl_shim_t *s, uint16_t address);
uint32_t idl_shim_first_seq(const idl_shim_t *s);
uint32_t idl_shim_decoder_counter(const idl_shim_t *s, unsigned kind);

static uint16_t conditions(void *ctx, const idl_regs_t *r, uint16_t address)
{
    const idl_shim_t *s = (const idl_shim_t *)ctx;
    uint16_t cond = 0;
    (void)r;
#if defined(IDL_REG_FAULTS) && defined(IDL_REG_TEMPERATURE) && defined(IDL_REG_THRESHOLD) \
    && defined(IDL_FAULT_OVER_TEMPERATURE)
    if (address == IDL_REG_FAULTS) {
        uint16_t t = 0;
        uint16_t limit = 0;
        cond = s->external;
        if (idl_regs_get(r, IDL_REG_TEMPERATURE, &t) && idl_regs_get(r, IDL_REG_THRESHOLD, &limit)
            && t > limit) {
            cond |= (uint16_t)IDL_FAULT_OVER_TEMPERATURE;
        }
    }
#else
    (void)address;
    cond = s->external;
#endif
    return cond;
}

static bool persist(void *ctx, const idl_regs_t *r, const uint16_t *planned, uint16_t generation)
{
    idl_shim_t *s = (idl_shim_t *)ctx;
    (void)r;
    s->persist_calls++;
    if (s->persist_fail) {
        return false;
    }
    memcpy(s->saved, planned, sizeof s->saved);
    s->saved_generation = generation;
    return true;
}

static uint16_t execute(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *resp, uint32_t now,
                        uint32_t seq)
{
    idl_shim_t *s = (idl_shim_t *)ctx;
    (void)seq;
    return idl_modbus_execute(&s->regs, pdu, len, resp, now);
}

size_t idl_shim_sizeof(void) { return sizeof(idl_shim_t); }

/* a saved configuration (one value per map row) taken or refused as idl_device_init would */
int idl_shim_restore(idl_shim_t *s, const uint16_t *values, uint16_t generation, uint32_t now)
{
    return idl_regs_restore(&s->regs, values, generation, now) ? 1 : 0;
}

void idl_shim_init(idl_shim_t *s, uint32_t epoch, uint32_t trigger_ms, const char *device_id,
                   uint32_t now)
{
    memset(s, 0, sizeof *s);
    strncpy(s->device_id, device_id, IDL_MAX_DEVICE_ID_LEN);
    idl_regs_init(&s->regs, trigger_ms, conditions, persist, s, now);
    s->cfg.execute = execute;
    s->cfg.ctx = s;
    s->cfg.name = "idemlink-sim";
    s->cfg.device_id = s->device_id;
    s->cfg.map_name = IDL_MAP_NAME;
    s->cfg.map_hash = MAP_HASH;
    s->cfg.max_inflight = 32u;
    idl_session_init(&s->session, &s->cfg, epoch);
    idl_rtu_init(&s->rtu, &s->regs, 1u);
}

size_t idl_shim_feed(idl_shim_t *s, const uint8_t *data, size_t n, uint32_t now, uint8_t *out,
                     size_t cap)
{
    size_t used = 0;
    idl_regs_tick(&s->regs, now);
    while (n != 0u) { /* the chunk in one scan, as idl_device_rx feeds it */
        size_t took;
        size_t k = idl_session_feed_buf(&s->session, data, n, &took, now);
        if (k != 0u && used + k <= cap) {
            memcpy(out + used, s->session.tx, k);
            used += k;
        }
        data += took;
        n -= took;
    }
    return used;
}

uint16_t idl_shim_execute(idl_shim_t *s, const uint8_t *pdu, uint16_t n, uint32_t now,
                          uint8_t *out)
{
    return idl_modbus_execute(&s->regs, pdu, n, out, now);
}

void idl_shim_tick(idl_shim_t *s, uint32_t now) { idl_regs_tick(&s->regs, now); }

int idl_shim_set_input(idl_shim_t *s, uint16_t address, uint16_t value, uint32_t now)
{
    return idl_regs_set_input(&s->regs, address, value, now) ? 1 : 0;
}

void idl_shim_set_external(idl_shim_t *s, uint16_t bits, uint32_t now)
{
    idl_regs_tick(&s->regs, now);
    s->external = bits;
    idl_regs_tick(&s->regs, now);
}

int32_t idl_shim_get(const idl_shim_t *s, uint16_t address)
{
    uint16_t v = 0;
    return idl_regs_get(&s->regs, address, &v) ? (int32_t)v : -1;
}

int idl_shim_force_trigger(idl_shim_t *s, uint16_t address, uint16_t raw)
{
    return idl_regs_force_trigger(&s->regs, address, raw) ? 1 : 0;
}

void idl_shim_persist_fail(idl_shim_t *s, int fail) { s->persist_fail = fail ? 1u : 0u; }

uint32_t idl_shim_persist_calls(const idl_shim_t *s) { return s->persist_calls; }

int32_t idl_shim_saved(const idl_shim_t *s, uint16_t address)
{
    int32_t i = idl_regs_index(address);
    return i < 0 ? -1 : (int32_t)s->saved[i];
}

uint32_t idl_shim_first_seq(const idl_shim_t *s) { return idl_session_first_seq(&s->session); }

uint32_t idl_shim_decoder_counter(const idl_shim_t *s, unsigned kind)
{
    return kind < IDL_DECODE_COUNTERS ? s->session.decoder.counters[kind] : 0u;
}

uint32_t idl_shim_saved_generation(const idl_shim_t *s);
int idl_shim_bus(idl_shim_t *s, uint8_t address);
uint32_t idl_shim_counter(const idl_shim_t *s, unsigned which);

#if IDL_BUS
static bool broadcast_ok(void *ctx, const uint8_t *pdu, uint16_t len)
{
    (void)ctx;
    return idl_modbus_broadcast_ok(pdu, len);
}
#endif

/* Put the device on a bus at `address` (0: none) right after init; 0 if built without IDL_BUS. */
int idl_shim_bus(idl_shim_t *s, uint8_t address)
{
#if IDL_BUS
    s->cfg.address = address;
    s->cfg.broadcast_ok = broadcast_ok;
    return 1;
#else
    (void)s;
    (void)address;
    return 0;
#endif
}

uint32_t idl_shim_counter(const idl_shim_t *s, unsigned which)
{
    return which < (unsigned)IDL_DISP_COUNT ? s->session.counters[which] : 0u;
}

uint32_t idl_shim_saved_generation(const idl_shim_t *s) { return s->saved_generation; }

size_t idl_shim_rtu_feed(idl_shim_t *s, const uint8_t *data, size_t n, int pause_after,
                         uint32_t now, uint8_t *out, size_t cap);
uint32_t idl_shim_rtu_counter(const idl_shim_t *s, unsigned which);

/* RTU: bytes of one read (the core ticked first), then optionally a pause of t3.5. */
size_t idl_shim_rtu_feed(idl_shim_t *s, const uint8_t *data, size_t n, int pause_after,
                         uint32_t now, uint8_t *out, size_t cap)
{
    size_t i;
    size_t used = 0;
    size_t k;
    idl_regs_tick(&s->regs, now);
    for (i = 0; i < n; i++) {
        k = idl_rtu_feed(&s->rtu, data[i], now);
        if (k != 0u && used + k <= cap) {
            memcpy(out + used, s->rtu.out, k);
            used += k;
        }
    }
    if (pause_after) {
        k = idl_rtu_pause(&s->rtu, now);
        if (k != 0u && used + k <= cap) {
            memcpy(out + used, s->rtu.out, k);
            used += k;
        }
    }
    return used;
}

uint32_t idl_shim_rtu_counter(const idl_shim_t *s, unsigned which)
{
    return which < IDL_RTU_COUNTERS ? s->rtu.counters[which] : 0u;
}

int idl_shim_check_name(const uint8_t *name, size_t n, size_t max);
uint16_t idl_shim_file_info(const char *dir, const uint8_t *pdu, uint16_t n, uint8_t *out);

int idl_shim_check_name(const uint8_t *name, size_t n, size_t max)
{
    return (int)idl_name_check(name, n, max);
}

static int lookup(void *ctx, const uint8_t *name, uint8_t len, uint32_t *size, uint32_t *crc)
{
    return idl_posix_file_info((const char *)ctx, name, len, size, crc);
}

/* FILE_INFO over the files in `dir` (as the posix device answers it) */
uint16_t idl_shim_file_info(const char *dir, const uint8_t *pdu, uint16_t n, uint8_t *out)
{
    return idl_file_info_execute(pdu, n, out, lookup, (void *)(uintptr_t)dir);
}

/* ---- the YMODEM receiver (idl_ymodem.h) for the differential test ------------------------- */

#include "idl_ymodem.h"

/* Storage and line of one receiver: answers go to `out` (per call), storage calls are logged as
 * records ('B' known size:u32le len name | 'W' offset:u32le n:u16le data | 'K' size:u32le |
 * 'A'); `refuse` makes begin (1), the first write (2) or commit (3) fail. */
typedef struct {
    idl_ym_rx_t rx;
    idl_ym_config_t cfg;
    idl_ym_io_t io;
    uint8_t block[IDL_YM_BLOCK_LARGE];
    uint8_t *out;
    size_t out_cap;
    size_t out_len;
    uint8_t log[1u << 16];
    size_t log_len;
    int refuse;
} idl_shim_ym_t;

size_t idl_shim_ym_sizeof(void);
void idl_shim_ym_init(idl_shim_ym_t *s, const uint32_t *ms, const uint32_t *limits, int refuse);
size_t idl_shim_ym_start(idl_shim_ym_t *s, uint32_t now, uint8_t *out, size_t cap);
size_t idl_shim_ym_feed(idl_shim_ym_t *s, const uint8_t *data, size_t n, uint32_t now,
                        uint8_t *out, size_t cap);
size_t idl_shim_ym_tick(idl_shim_ym_t *s, uint32_t now, uint8_t *out, size_t cap);
size_t idl_shim_ym_abort(idl_shim_ym_t *s, uint8_t *out, size_t cap);
void idl_shim_ym_status(const idl_shim_ym_t *s, uint32_t *st);
size_t idl_shim_ym_log(idl_shim_ym_t *s, uint8_t *out, size_t cap);
unsigned idl_shim_ym_transition(unsigned state, unsigned input);

static void ym_record(idl_shim_ym_t *s, const uint8_t *rec, size_t n)
{
    if (s->log_len + n <= sizeof s->log) {
        memcpy(s->log + s->log_len, rec, n);
        s->log_len += n;
    }
}

static void le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static bool ym_begin(void *ctx, const uint8_t *name, size_t len, uint32_t size, bool known)
{
    idl_shim_ym_t *s = (idl_shim_ym_t *)ctx;
    uint8_t rec[7];
    rec[0] = 'B';
    rec[1] = known ? 1u : 0u;
    le32(rec + 2, size);
    rec[6] = (uint8_t)len;
    ym_record(s, rec, sizeof rec);
    ym_record(s, name, len);
    return s->refuse != 1;
}

static bool ym_write(void *ctx, uint32_t offset, const uint8_t *data, size_t n)
{
    idl_shim_ym_t *s = (idl_shim_ym_t *)ctx;
    uint8_t rec[7];
    rec[0] = 'W';
    le32(rec + 1, offset);
    rec[5] = (uint8_t)n;
    rec[6] = (uint8_t)(n >> 8);
    ym_record(s, rec, sizeof rec);
    ym_record(s, data, n);
    return s->refuse != 2;
}

static bool ym_commit(void *ctx, uint32_t size)
{
    idl_shim_ym_t *s = (idl_shim_ym_t *)ctx;
    uint8_t rec[5];
    rec[0] = 'K';
    le32(rec + 1, size);
    ym_record(s, rec, sizeof rec);
    return s->refuse != 3;
}

static void ym_abort(void *ctx)
{
    static const uint8_t rec[1] = { 'A' };
    ym_record((idl_shim_ym_t *)ctx, rec, sizeof rec);
}

static void ym_send(void *ctx, const uint8_t *data, size_t n)
{
    idl_shim_ym_t *s = (idl_shim_ym_t *)ctx;
    if (s->out != NULL && s->out_len + n <= s->out_cap) {
        memcpy(s->out + s->out_len, data, n);
        s->out_len += n;
    }
}

size_t idl_shim_ym_sizeof(void) { return sizeof(idl_shim_ym_t); }

/* ms: c_interval block interbyte purge_quiet eot_confirm silence; limits: max_file_size
 * header_retries max_errors max_name */
void idl_shim_ym_init(idl_shim_ym_t *s, const uint32_t *ms, const uint32_t *limits, int refuse)
{
    memset(s, 0, sizeof *s);
    memcpy(s->cfg.ms, ms, sizeof s->cfg.ms);
    s->cfg.max_file_size = limits[0];
    s->cfg.header_retries = (uint8_t)limits[1];
    s->cfg.max_errors = (uint8_t)limits[2];
    s->cfg.max_name = (uint8_t)limits[3];
    s->io.begin = ym_begin;
    s->io.write = ym_write;
    s->io.commit = ym_commit;
    s->io.abort = ym_abort;
    s->io.send = ym_send;
    s->io.ctx = s;
    s->refuse = refuse;
    idl_ym_rx_init(&s->rx, &s->cfg, &s->io, s->block);
}

static void ym_out(idl_shim_ym_t *s, uint8_t *out, size_t cap)
{
    s->out = out;
    s->out_cap = cap;
    s->out_len = 0;
}

size_t idl_shim_ym_start(idl_shim_ym_t *s, uint32_t now, uint8_t *out, size_t cap)
{
    ym_out(s, out, cap);
    idl_ym_rx_start(&s->rx, now);
    return s->out_len;
}

size_t idl_shim_ym_feed(idl_shim_ym_t *s, const uint8_t *data, size_t n, uint32_t now,
                        uint8_t *out, size_t cap)
{
    ym_out(s, out, cap);
    idl_ym_rx_feed(&s->rx, data, n, now);
    return s->out_len;
}

size_t idl_shim_ym_tick(idl_shim_ym_t *s, uint32_t now, uint8_t *out, size_t cap)
{
    ym_out(s, out, cap);
    idl_ym_rx_tick(&s->rx, now);
    return s->out_len;
}

size_t idl_shim_ym_abort(idl_shim_ym_t *s, uint8_t *out, size_t cap)
{
    ym_out(s, out, cap);
    idl_ym_rx_abort(&s->rx);
    return s->out_len;
}

/* state, end, refusal, commits, delivered, deadline armed, deadline */
void idl_shim_ym_status(const idl_shim_ym_t *s, uint32_t *st)
{
    st[0] = s->rx.state;
    st[1] = s->rx.end;
    st[2] = s->rx.refusal;
    st[3] = s->rx.commits;
    st[4] = s->rx.delivered;
    st[5] = (s->rx.flags & IDL_YM_F_DEADLINE) != 0u;
    st[6] = s->rx.deadline;
}

size_t idl_shim_ym_log(idl_shim_ym_t *s, uint8_t *out, size_t cap)
{
    size_t n = s->log_len < cap ? s->log_len : cap;
    memcpy(out, s->log, n);
    s->log_len = 0;
    return n;
}

unsigned idl_shim_ym_transition(unsigned state, unsigned input)
{
    return idl_ym_rx_transition(state, input);
}

/* ---- authenticated frames (IDL_AUTH=1): the port's keys and randomness, set by the test ----- */
int idl_shim_auth_keys(const uint8_t *keys, unsigned n);
void idl_shim_auth_tape(const uint8_t *tape, size_t n);
int idl_shim_blake2s(uint8_t *out, unsigned outlen, const uint8_t *key, const uint8_t *data,
                     size_t n, size_t cut1, size_t cut2);
uint32_t idl_shim_key_id(const uint8_t *key);

#if IDL_AUTH
#define SHIM_KEYS 4u
static uint8_t shim_keys[SHIM_KEYS][IDL_KEY_LEN];
static unsigned shim_nkeys;
static uint8_t shim_tape[256];
static size_t shim_tape_len;
static size_t shim_tape_at;

const uint8_t *idl_port_auth_key(unsigned i) { return i < shim_nkeys ? shim_keys[i] : NULL; }

/* the tape's bytes in turn (the Python reference's nonces), zeros when none was given */
void idl_port_random(uint8_t *buf, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        buf[i] = shim_tape_len != 0u ? shim_tape[shim_tape_at++ % shim_tape_len] : 0u;
    }
}
#endif

/* The keys the next idl_shim_init's device holds (0: unkeyed); 0 if built without IDL_AUTH. */
int idl_shim_auth_keys(const uint8_t *keys, unsigned n)
{
#if IDL_AUTH
    shim_nkeys = n < SHIM_KEYS ? n : SHIM_KEYS;
    memcpy(shim_keys, keys, (size_t)shim_nkeys * IDL_KEY_LEN);
    return 1;
#else
    (void)keys;
    (void)n;
    return 0;
#endif
}

void idl_shim_auth_tape(const uint8_t *tape, size_t n)
{
#if IDL_AUTH
    shim_tape_len = n < sizeof shim_tape ? n : sizeof shim_tape;
    memcpy(shim_tape, tape, shim_tape_len);
    shim_tape_at = 0;
#else
    (void)tape;
    (void)n;
#endif
}

/* BLAKE2s keyed with the 32 bytes at `key` of `data` cut into three pieces at cut1 <= cut2 <= n;
 * 0 without IDL_AUTH. */
int idl_shim_blake2s(uint8_t *out, unsigned outlen, const uint8_t *key, const uint8_t *data,
                     size_t n, size_t cut1, size_t cut2)
{
#if IDL_AUTH
    idl_piece_t pieces[3];
    pieces[0].p = data;
    pieces[0].n = cut1;
    pieces[1].p = data + cut1;
    pieces[1].n = cut2 - cut1;
    pieces[2].p = data + cut2;
    pieces[2].n = n - cut2;
    (void)idl_blake2s(out, outlen, key, pieces, 3u);
    return 1;
#else
    (void)out;
    (void)outlen;
    (void)key;
    (void)data;
    (void)n;
    (void)cut1;
    (void)cut2;
    return 0;
#endif
}

uint32_t idl_shim_key_id(const uint8_t *key)
{
#if IDL_AUTH
    uint8_t id[4];
    idl_auth_key_id(id, key);
    return (uint32_t)id[0] | ((uint32_t)id[1] << 8) | ((uint32_t)id[2] << 16)
           | ((uint32_t)id[3] << 24);
#else
    (void)key;
    return 0u;
#endif
}
