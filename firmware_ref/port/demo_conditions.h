/**
 * @file demo_conditions.h
 * @brief The built-in thermal controller's one computed fault condition, shared by the ports in
 *        this tree: over-temperature while temperature > threshold (as the Python simulator's
 *        DEFAULT_RULES). A product replaces it with its own idl_port_fault_conditions. Compiled to
 *        nothing for a map without those registers.
 */
#ifndef IDL_DEMO_CONDITIONS_H
#define IDL_DEMO_CONDITIONS_H

#include "idl_port.h"

static inline uint16_t idl_demo_fault_conditions(const idl_regs_t *r, uint16_t address)
{
#if defined(IDL_REG_FAULTS) && defined(IDL_REG_TEMPERATURE) && defined(IDL_REG_THRESHOLD) \
    && defined(IDL_FAULT_OVER_TEMPERATURE)
    uint16_t t = 0;
    uint16_t limit = 0;
    if (address == IDL_REG_FAULTS && idl_regs_get(r, IDL_REG_TEMPERATURE, &t)
        && idl_regs_get(r, IDL_REG_THRESHOLD, &limit) && t > limit) {
        return (uint16_t)IDL_FAULT_OVER_TEMPERATURE;
    }
#else
    (void)r;
    (void)address;
#endif
    return 0;
}

#endif /* IDL_DEMO_CONDITIONS_H */
