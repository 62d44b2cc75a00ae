/* Register core: see idl_regs.h. */
#include "idl_regs.h"
#include "idl_tables.h"

#include <stddef.h>

/* (state, value written) -> next state and answer, generated from the Python TRIGGER_TABLE
 * (idl_tables.h); the START action is "IDLE + write 1"; RUNNING becomes DONE in
 * idl_regs_tick() when the duration elapsed. */
static const uint8_t TRIGGER_NEXT[IDL_TRIGGER_STATES][2] = IDL_TRIGGER_NEXT_TABLE;
static const uint16_t TRIGGER_ANSWER[IDL_TRIGGER_STATES][2] = IDL_TRIGGER_ANSWER_TABLE;

static uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

int32_t idl_regs_index(uint16_t address)
{
    uint32_t lo = 0;
    uint32_t hi = IDL_REG_COUNT;
    while (lo < hi) {
        uint32_t mid = (lo + hi) >> 1;
        uint16_t a = IDL_REGMAP[mid].address;
        if (a == address) {
            return (int32_t)mid;
        }
        if (a < address) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    return -1;
}

#if defined(IDL_REGMAP_TYPED) && IDL_REGMAP_TYPED
/* A typed HOLDING (i16, u32, f32...: idemlink_regmap.h's IDL_REG_FLAG_* give its type, word count,
 * word order and each row's position): whether the value whose first row is `d` lies outside
 * min..max, compared as the type's numbers, bit-exact with the Python register model. Its words
 * taken most significant first are made unsigned-comparable (signed: sign bit flipped; float:
 * sign bit flipped, every bit when negative: NaN beyond +-inf, never in range) and compared with
 * the rows' min/max words, which the generator stored in that same form. Its words are `be`
 * (big-endian, in address order, as a request carries them). A plain u16 (flags 0) is the v < min || v > max
 * of before. Compiled only for a map with a typed HOLDING. */
static bool typed_out(const idl_reg_desc_t *d, const uint8_t *be)
{
    unsigned f = d->flags;
    unsigned n = 1u << ((f >> IDL_REG_FLAG_WORDS_SHIFT) & 3u);
    unsigned s;
    int lo = 0;
    int hi = 0;
    uint16_t flip = 0u;
    for (s = 0; s < n; s++) {
        unsigned p = (f & IDL_REG_FLAG_LITTLE) != 0u ? n - 1u - s : s;
        uint16_t v = be16(be + 2u * p);
        if (s == 0u && (f & (IDL_REG_FLAG_SIGNED | IDL_REG_FLAG_FLOAT)) != 0u) {
            bool negative_float = (f & IDL_REG_FLAG_FLOAT) != 0u && (v & 0x8000u) != 0u;
            flip = negative_float ? 0xFFFFu : 0u;
            v = (uint16_t)(v ^ (negative_float ? 0u : 0x8000u));
        }
        v = (uint16_t)(v ^ flip);
        if (lo == 0) {
            lo = (v > d[p].min) - (v < d[p].min);
        }
        if (hi == 0) {
            hi = (v > d[p].max) - (v < d[p].max);
        }
    }
    return lo < 0 || hi > 0;
}
/* a string HOLDING: read-only (the simulator's RegisterSpec.writable), its rows carry both type
 * bits, which no number has; any value is in range */
#define IDL_TYPED_STRING(d)                                                                        \
    (((d)->flags & (IDL_REG_FLAG_SIGNED | IDL_REG_FLAG_FLOAT))                                     \
     == (IDL_REG_FLAG_SIGNED | IDL_REG_FLAG_FLOAT))
#define IDL_TYPED_INDEX(d) (((unsigned)(d)->flags >> IDL_REG_FLAG_INDEX_SHIFT) & 3u)
#define IDL_TYPED_WORDS(d) (1u << (((unsigned)(d)->flags >> IDL_REG_FLAG_WORDS_SHIFT) & 3u))
#endif

/* Index of the first of `count` consecutive mapped registers from `address`, or -1 (also for
 * count 0). The map is sorted and unique, so a gap-free run is consecutive in the table. */
static int32_t run_index(uint16_t address, uint16_t count)
{
    int32_t first = idl_regs_index(address);
    if (count == 0u || first < 0 || (uint32_t)first + count > IDL_REG_COUNT
        || IDL_REGMAP[(uint32_t)first + count - 1u].address != (uint32_t)address + count - 1u) {
        return -1;
    }
    return first;
}

/* Index of `address` if it is a register of `kind`, else -1. */
static int32_t index_of_kind(uint16_t address, idl_reg_kind_t kind)
{
    int32_t i = idl_regs_index(address);
    return i >= 0 && IDL_REGMAP[i].kind == (uint8_t)kind ? i : -1;
}

#if defined(IDL_BUS) && IDL_BUS
bool idl_regs_all_holding(uint16_t address, uint16_t count)
{
    int32_t first = run_index(address, count);
    uint32_t i;
    if (first < 0) {
        return false;
    }
    for (i = (uint32_t)first; i < (uint32_t)first + count; i++) {
        if (IDL_REGMAP[i].kind != (uint8_t)IDL_REG_KIND_HOLDING) {
            return false;
        }
    }
    return true;
}
#endif

static uint16_t conditions(const idl_regs_t *r, uint32_t i)
{
    return r->conditions != NULL ? r->conditions(r->ctx, r, IDL_REGMAP[i].address) : 0u;
}

static void latch(idl_regs_t *r)
{
    uint32_t i;
    for (i = 0; i < IDL_REG_COUNT; i++) {
        if (IDL_REGMAP[i].kind == (uint8_t)IDL_REG_KIND_FAULT) {
            r->value[i] = (uint16_t)(r->value[i] | conditions(r, i));
        }
    }
}

static void advance(idl_regs_t *r, uint32_t now)
{
    if ((int32_t)(now - r->now) > 0) {
        r->now = now;
    }
}

void idl_regs_init(idl_regs_t *r, uint32_t trigger_ms, idl_fault_conditions_fn cond,
                   idl_persist_fn persist, void *ctx, uint32_t now)
{
    uint32_t i;
    for (i = 0; i < IDL_REG_COUNT; i++) {
        uint8_t kind = IDL_REGMAP[i].kind;
        r->value[i] = (kind == (uint8_t)IDL_REG_KIND_INPUT || kind == (uint8_t)IDL_REG_KIND_HOLDING)
                          ? IDL_REGMAP[i].def : 0u;
        r->planned[i] = 0u;
        r->started[i] = 0u;
    }
    r->now = now;
    r->trigger_ms = trigger_ms;
    r->generation = 0u;
    r->ceiling = 0u;
    r->conditions = cond;
    r->persist = persist;
    r->ctx = ctx;
    latch(r);
}

bool idl_regs_restore(idl_regs_t *r, const uint16_t *values, uint16_t generation, uint32_t now)
{
    uint32_t i;
    bool changed = false;
    for (i = 0; i < IDL_REG_COUNT; i++) {
        const idl_reg_desc_t *d = &IDL_REGMAP[i];
#if defined(IDL_REGMAP_TYPED) && IDL_REGMAP_TYPED
        if (d->kind == (uint8_t)IDL_REG_KIND_HOLDING && IDL_TYPED_INDEX(d) == 0u
            && !IDL_TYPED_STRING(d)) {
            uint8_t be[8]; /* the value's words as a request carries them (at most 4) */
            unsigned j;
            for (j = 0; j < IDL_TYPED_WORDS(d); j++) {
                be[2u * j] = (uint8_t)(values[i + j] >> 8);
                be[2u * j + 1u] = (uint8_t)values[i + j];
            }
            if (typed_out(d, be)) {
                return false;
            }
        }
#else
        if (d->kind == (uint8_t)IDL_REG_KIND_HOLDING && (values[i] < d->min || values[i] > d->max)) {
            return false;
        }
#endif
    }
    advance(r, now);
    r->generation = generation;
    r->ceiling = generation;
    for (i = 0; i < IDL_REG_COUNT; i++) {
        const idl_reg_desc_t *d = &IDL_REGMAP[i];
        if (d->kind == (uint8_t)IDL_REG_KIND_HOLDING) {
            uint16_t v = (d->flags & IDL_REG_FLAG_PERSIST) ? values[i] : d->def;
            changed = changed || v != values[i];
            r->value[i] = v;
        }
    }
    if (changed) {
        r->generation = (uint16_t)(r->generation + 1u);
    }
    latch(r);
    return true;
}

void idl_regs_tick(idl_regs_t *r, uint32_t now)
{
    uint32_t i;
    advance(r, now);
    for (i = 0; i < IDL_REG_COUNT; i++) {
        if (IDL_REGMAP[i].kind == (uint8_t)IDL_REG_KIND_TRIGGER
            && r->value[i] == (uint16_t)IDL_TRIGGER_RUNNING
            && (uint32_t)(r->now - r->started[i]) >= r->trigger_ms) {
            r->value[i] = (uint16_t)IDL_TRIGGER_DONE;
        }
    }
    latch(r);
}

static uint16_t value_at(const idl_regs_t *r, uint32_t i)
{
    return IDL_REGMAP[i].kind == (uint8_t)IDL_REG_KIND_GENERATION ? r->generation : r->value[i];
}

bool idl_regs_get(const idl_regs_t *r, uint16_t address, uint16_t *value)
{
    int32_t i = idl_regs_index(address);
    if (i < 0) {
        return false;
    }
    *value = value_at(r, (uint32_t)i);
    return true;
}

bool idl_regs_set_input(idl_regs_t *r, uint16_t address, uint16_t value, uint32_t now)
{
    int32_t i = index_of_kind(address, IDL_REG_KIND_INPUT);
    if (i < 0) {
        return false;
    }
    idl_regs_tick(r, now);
    r->value[i] = value;
    latch(r);
    return true;
}

uint8_t idl_regs_read(const idl_regs_t *r, uint16_t address, uint16_t count, uint8_t *out)
{
    uint32_t k;
    int32_t first = run_index(address, count);
    if (first < 0) {
        return IDL_MB_EXC_ILLEGAL_DATA_ADDRESS;
    }
    for (k = 0; k < count; k++) {
        uint16_t v = value_at(r, (uint32_t)first + k);
        out[2u * k] = (uint8_t)(v >> 8);
        out[2u * k + 1u] = (uint8_t)v;
    }
    return 0;
}

static void trigger_step(idl_regs_t *r, uint32_t i, uint16_t value)
{
    uint16_t state = r->value[i];
    r->value[i] = TRIGGER_NEXT[state][value];
    if (state == (uint16_t)IDL_TRIGGER_IDLE && value == 1u) {
        r->started[i] = r->now;
    }
}

/* Pass 1 and 2 of a write: the first exception, or 0. One walk over the registers: a register
 * that cannot be written at all (02) wins over any value refused (03), which wins over a trigger
 * in an abnormal state (04), whatever their order in the range, as three passes would find. */
static uint8_t validate(const idl_regs_t *r, int32_t first, uint16_t count, const uint8_t *be,
                        bool guarded)
{
    uint32_t k;
    uint8_t exc = 0;
    if (first < 0) {
        return IDL_MB_EXC_ILLEGAL_DATA_ADDRESS;
    }
    for (k = 0; k < count; k++) {
        const idl_reg_desc_t *d = &IDL_REGMAP[(uint32_t)first + k];
        uint16_t v = be16(be + 2u * k);
        uint8_t kind = d->kind;
        if (kind == (uint8_t)IDL_REG_KIND_INPUT || kind == (uint8_t)IDL_REG_KIND_GENERATION
            || (guarded && kind != (uint8_t)IDL_REG_KIND_HOLDING)) {
            return IDL_MB_EXC_ILLEGAL_DATA_ADDRESS;
        }
#if defined(IDL_REGMAP_TYPED) && IDL_REGMAP_TYPED
        /* a write covers all the registers of a typed value or none of them, and never a
         * string (02, pass 1) */
        if (kind == (uint8_t)IDL_REG_KIND_HOLDING
            && (IDL_TYPED_STRING(d) || (k == 0u && IDL_TYPED_INDEX(d) != 0u)
                || (IDL_TYPED_INDEX(d) == 0u && k + IDL_TYPED_WORDS(d) > count))) {
            return IDL_MB_EXC_ILLEGAL_DATA_ADDRESS;
        }
        if ((kind == (uint8_t)IDL_REG_KIND_HOLDING && IDL_TYPED_INDEX(d) == 0u
             && typed_out(d, be + 2u * k))
#else
        if ((kind == (uint8_t)IDL_REG_KIND_HOLDING && (v < d->min || v > d->max))
#endif
            || (kind == (uint8_t)IDL_REG_KIND_FAULT && (v & (uint16_t)~d->fault_mask) != 0u)
            || (kind == (uint8_t)IDL_REG_KIND_TRIGGER && v > 1u)) {
            exc = IDL_MB_EXC_ILLEGAL_DATA_VALUE;
        } else if (kind == (uint8_t)IDL_REG_KIND_TRIGGER && exc == 0u
                   && r->value[(uint32_t)first + k] > (uint16_t)IDL_TRIGGER_DONE) {
            exc = IDL_MB_EXC_SERVER_DEVICE_FAILURE;
        }
    }
    return exc;
}

/* planned = the values after the write (the volatile HOLDINGs at their default when `flash`:
 * what flash keeps); returns 0 (no HOLDING changes), 1 (only volatile ones) or 3 (a persistent
 * one too) */
static unsigned plan(idl_regs_t *r, int32_t first, uint16_t count, const uint8_t *be, bool flash)
{
    uint32_t i;
    unsigned changes = 0u;
    for (i = 0; i < IDL_REG_COUNT; i++) {
        const idl_reg_desc_t *d = &IDL_REGMAP[i];
        uint32_t k = i - (uint32_t)first;
        uint16_t v = r->value[i];
        if (d->kind == (uint8_t)IDL_REG_KIND_HOLDING) {
            if (k < count) {
                v = be16(be + 2u * k);
                if (v != r->value[i]) {
                    changes |= (d->flags & IDL_REG_FLAG_PERSIST) ? 3u : 1u;
                }
            }
            if (flash && !(d->flags & IDL_REG_FLAG_PERSIST)) {
                v = d->def;
            }
        }
        r->planned[i] = v;
    }
    return changes;
}

int idl_regs_write(idl_regs_t *r, uint16_t address, uint16_t count, const uint8_t *be,
                   bool guarded, uint16_t guard)
{
    uint32_t i;
    uint32_t k;
    unsigned changes;
    int32_t first = run_index(address, count);
    uint8_t exc = validate(r, first, count, be, guarded);
    if (exc != 0u) {
        return exc;
    }
    if (guarded && guard != r->generation) {
        return IDL_REGS_GUARD_FAILED;
    }
    changes = plan(r, first, count, be, false);
    if (changes != 0u) {
        uint16_t after = (uint16_t)(r->generation + 1u);
        bool below = (uint16_t)((uint16_t)(r->ceiling - after) - 1u) < IDL_GENERATION_RESERVE;
        if (changes > 1u || !below) { /* flash must change: the save policy in idl_regs.h */
            uint16_t ceiling = below ? r->ceiling : (uint16_t)(after + IDL_GENERATION_RESERVE);
            (void)plan(r, first, count, be, true);
            if (r->persist != NULL && !r->persist(r->ctx, r, r->planned, ceiling)) {
                return IDL_MB_EXC_SERVER_DEVICE_FAILURE;
            }
            r->ceiling = ceiling;
            (void)plan(r, first, count, be, false);
        }
        for (i = 0; i < IDL_REG_COUNT; i++) {
            r->value[i] = r->planned[i];
        }
        r->generation = (uint16_t)(r->generation + 1u);
    }
    for (k = 0; k < count; k++) {
        i = (uint32_t)first + k;
        if (IDL_REGMAP[i].kind == (uint8_t)IDL_REG_KIND_TRIGGER) {
            trigger_step(r, i, be16(be + 2u * k));
        }
    }
    for (k = 0; k < count; k++) {
        i = (uint32_t)first + k;
        if (IDL_REGMAP[i].kind == (uint8_t)IDL_REG_KIND_FAULT) {
            uint16_t bits = be16(be + 2u * k);
            r->value[i] = (uint16_t)(r->value[i] & ~(bits & ~conditions(r, i)));
        }
    }
    latch(r);
    return 0;
}

uint8_t idl_regs_trigger(idl_regs_t *r, uint16_t address, uint16_t value, uint16_t *code)
{
    int32_t i = index_of_kind(address, IDL_REG_KIND_TRIGGER);
    uint16_t state;
    if (i < 0) {
        return IDL_MB_EXC_ILLEGAL_DATA_ADDRESS;
    }
    state = r->value[i];
    if (value > 1u) {
        *code = IDL_TRIGGER_STATUS_ILLEGAL_VALUE;
        return 0;
    }
    if (state > (uint16_t)IDL_TRIGGER_DONE) {
        *code = IDL_TRIGGER_STATUS_ABNORMAL_STATE;
        return 0;
    }
    *code = TRIGGER_ANSWER[state][value];
    trigger_step(r, (uint32_t)i, value);
    latch(r);
    return 0;
}
