/**
 * @file idl_regs.h
 * @brief The register core: the semantics of the map in idemlink_regmap.h, the same rules as
 *        protocol/device_core.py (DeviceCore).
 *
 * - Every write is validated whole before anything changes: addresses first (unknown, INPUT,
 *   GENERATION, or not HOLDING in a guarded write -> exception 02), then values (HOLDING outside
 *   min..max, a FAULT bit the map does not declare, a TRIGGER value other than 0/1 -> 03), then
 *   trigger states (a state outside the table -> 04). A guarded write (0x41) then compares the
 *   generation (read-only) and answers GUARD_FAILED with nothing changed.
 * - HOLDING writes set absolute values. The generation is +1 (mod 2^16) per request that changed
 *   a HOLDING value; a no-op write leaves it alone.
 * - Persist first, flash like an MCU's: a write that changes a persistent HOLDING (flag
 *   IDL_REG_FLAG_PERSIST) calls `persist` with the planned values (volatile ones at their
 *   default: flash keeps only what survives a reboot) and the generation ceiling, before anything
 *   changes; false -> exception 04, nothing changed. A write that changes only volatile HOLDINGs
 *   saves nothing, unless its generation reaches the saved ceiling.
 * - The generation's save policy (DeviceCore's): flash holds a ceiling, `generation after the
 *   write + IDL_GENERATION_RESERVE`, written when a save is due anyway and the generation has
 *   reached the old ceiling, or when only volatile registers changed and it has: at most one
 *   flash write per IDL_GENERATION_RESERVE volatile-only changes. At boot (idl_regs_restore) the
 *   generation starts at the saved ceiling, above every generation shown before the reboot.
 * - FAULT bits latch while their condition holds (the `conditions` callback, asked per FAULT
 *   register); writing 1s clears exactly the bits whose condition has gone.
 * - TRIGGER: 1 in IDLE starts the action (answer 0) and it stays RUNNING for `trigger_ms`;
 *   1 while RUNNING -> 0x0101, while DONE -> 0x0102; 0 -> IDLE (answer 0); another value 0xFF01;
 *   a state outside the table 0xFF00.
 * - Time is a millisecond clock (any origin, wraps modulo 2^32) that never runs backwards inside
 *   the core: idl_regs_tick() finishes triggers and latches faults; the Modbus layer ticks once
 *   per request before anything else.
 *
 * Not ISR-safe: call every function from one context (or under the integrator's lock).
 */
#ifndef IDL_REGS_H
#define IDL_REGS_H

#include "idl_checkreturn.h"

#include <stdbool.h>
#include <stdint.h>

/** Generations each configuration save reserves (protocol/device_core.py GENERATION_RESERVE). */
#define IDL_GENERATION_RESERVE 64u

/* The register map: the generated header in include/, or another one rendered by
 * `idemlink contract --regmap FILE --out DIR`, chosen with -DIDL_REGMAP_HEADER='"DIR/idemlink_regmap.h"'
 * (a quoted include would otherwise always find the one next to this file first). */
#ifdef IDL_REGMAP_HEADER
#include IDL_REGMAP_HEADER
#else
#include "idemlink_regmap.h"
#endif

#if IDL_REG_COUNT < 1u || IDL_REG_COUNT > 65536u
#error "the register map must hold 1..65536 registers"
#endif

/** idl_regs_write() result besides 0 (done) and the Modbus exception codes 2..4. */
#define IDL_REGS_GUARD_FAILED 0x100

typedef struct idl_regs idl_regs_t;

/** The live conditions of a FAULT register's bits (e.g. temperature > threshold). */
typedef uint16_t (*idl_fault_conditions_fn)(void *ctx, const idl_regs_t *r, uint16_t address);

/** Save the configuration about to be committed: `planned[i]` is the value of IDL_REGMAP[i]
 *  (HOLDING entries, the volatile ones at their default; others unspecified), `generation` the
 *  ceiling to keep: the generation the device boots with (see the save policy above).
 *  Return false if it could not be saved: the write is refused (exception 04). */
typedef bool (*idl_persist_fn)(void *ctx, const idl_regs_t *r, const uint16_t *planned,
                               uint16_t generation);

struct idl_regs {
    uint16_t value[IDL_REG_COUNT];   /**< INPUT, HOLDING, FAULT (latched), TRIGGER (state) */
    uint16_t planned[IDL_REG_COUNT]; /**< scratch of a write being validated */
    uint32_t started[IDL_REG_COUNT]; /**< TRIGGER: when RUNNING began (ms) */
    uint32_t now;                    /**< latest time seen (ms) */
    uint32_t trigger_ms;
    uint16_t generation;
    uint16_t ceiling; /**< the generation flash holds: the next boot's */
    idl_fault_conditions_fn conditions; /**< may be NULL: no conditions */
    idl_persist_fn persist;             /**< may be NULL: nothing to save */
    void *ctx;
};

/** Defaults from the map (generation 0), then faults latched from the conditions. */
void idl_regs_init(idl_regs_t *r, uint32_t trigger_ms, idl_fault_conditions_fn conditions,
                   idl_persist_fn persist, void *ctx, uint32_t now);

/** Load a saved configuration (values by map index, HOLDING entries read; `generation` the saved
 *  ceiling, which becomes the generation) validated whole: false (nothing changed) if a value is
 *  outside its range. HOLDING registers declared volatile go back to their default (generation
 *  +1 if one held another value: flash written before they were saved at their default). */
IDL_CHECKRETURN bool idl_regs_restore(idl_regs_t *r, const uint16_t *values, uint16_t generation, uint32_t now);

/** Advance time: finish RUNNING triggers whose duration elapsed, latch faults. */
void idl_regs_tick(idl_regs_t *r, uint32_t now);

/** Index of `address` in IDL_REGMAP, or -1. */
int32_t idl_regs_index(uint16_t address);

#if defined(IDL_BUS) && IDL_BUS
/** Whether `count` registers from `address` are all mapped HOLDING registers (what a broadcast
 *  may write: idl_modbus_broadcast_ok). */
IDL_CHECKRETURN bool idl_regs_all_holding(uint16_t address, uint16_t count);
#endif

/** Current value (no side effect); false if unmapped. */
IDL_CHECKRETURN bool idl_regs_get(const idl_regs_t *r, uint16_t address, uint16_t *value);

/** The world changed an INPUT register (sensor reading); false if not an INPUT. */
IDL_CHECKRETURN bool idl_regs_set_input(idl_regs_t *r, uint16_t address, uint16_t value, uint32_t now);

/** FC03/FC04: `count` values big-endian into `out`; 0 or exception 02. */
IDL_CHECKRETURN uint8_t idl_regs_read(const idl_regs_t *r, uint16_t address, uint16_t count, uint8_t *out);

/** FC06/FC16 (guarded false) or 0x41 (guarded, `guard` = expected generation): the big-endian
 *  values at `be`. Returns 0, an exception code 2..4, or IDL_REGS_GUARD_FAILED. */
IDL_CHECKRETURN int idl_regs_write(idl_regs_t *r, uint16_t address, uint16_t count, const uint8_t *be,
                   bool guarded, uint16_t guard);

/** 0x42: a trigger write answering its status code; 0 or exception 02 (not a TRIGGER). */
IDL_CHECKRETURN uint8_t idl_regs_trigger(idl_regs_t *r, uint16_t address, uint16_t value, uint16_t *code);

/** Test hook: put a trigger in any raw state (also an impossible one). Inline: a device that
 *  does not call it carries none of it. */
IDL_CHECKRETURN static inline bool idl_regs_force_trigger(idl_regs_t *r, uint16_t address,
                                                          uint16_t raw)
{
    int32_t i = idl_regs_index(address);
    if (i < 0 || IDL_REGMAP[i].kind != (uint8_t)IDL_REG_KIND_TRIGGER) {
        return false;
    }
    r->value[i] = raw;
    r->started[i] = r->now;
    return true;
}

#endif /* IDL_REGS_H */
