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
    size_t i;
    size_t used = 0;
    idl_regs_tick(&s->regs, now);
    for (i = 0; i < n; i++) {
        size_t k = idl_session_feed(&s->session, data[i], now);
        if (k != 0u && used + k <= cap) {
            memcpy(out + used, s->session.tx, k);
            used += k;
        }
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
    return kind < 7u ? s->session.decoder.counters[kind] : 0u;
}

uint32_t idl_shim_saved_generation(const idl_shim_t *s);

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
    return which < 5u ? s->rtu.counters[which] : 0u;
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
