/**
 * @file effects_record.h
 * @brief The lines of the soak's effects file (docs/SOAK.md), shared by the ports in this tree:
 *        `{"boot": epoch, "time": t, "trigger_duration": d}` when the device starts and
 *        `{"epoch", "seq", "request": hex, "response": hex, "time": t}` per execution (the core's
 *        optional idl_port_executed). Times are milliseconds printed as seconds ("12.345"), with
 *        no floating point. Each function writes one whole line, newline included, into `line`
 *        (at least IDL_EFFECTS_LINE_MAX bytes) and returns its length; the port appends it to its
 *        record in one write. A test and soak aid, not part of a product's firmware.
 */
#ifndef IDL_EFFECTS_RECORD_H
#define IDL_EFFECTS_RECORD_H

#include <stdio.h>

#include "idl_port.h"

/** The longest line: the fixed text and numbers, then two PDUs in hex. */
#define IDL_EFFECTS_LINE_MAX (160u + 4u * IDL_MAX_PAYLOAD)

static inline size_t idl_effects_hex(char *out, const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    size_t i;
    for (i = 0; i < n; i++) {
        out[2u * i] = digits[p[i] >> 4];
        out[2u * i + 1u] = digits[p[i] & 15u];
    }
    return 2u * n;
}

static inline size_t idl_effects_boot_line(char *line, uint32_t epoch, unsigned long time_s,
                                           unsigned time_ms, uint32_t trigger_ms)
{
    return (size_t)sprintf(line,
                           "{\"boot\": %lu, \"time\": %lu.%03u, \"trigger_duration\": %lu.%03lu}\n",
                           (unsigned long)epoch, time_s, time_ms,
                           (unsigned long)(trigger_ms / 1000u), (unsigned long)(trigger_ms % 1000u));
}

static inline size_t idl_effects_run_line(char *line, uint32_t epoch, uint32_t seq,
                                          const uint8_t *request, uint16_t request_len,
                                          const uint8_t *response, uint16_t response_len,
                                          unsigned long time_s, unsigned time_ms)
{
    size_t n = (size_t)sprintf(line, "{\"epoch\": %lu, \"seq\": %lu, \"request\": \"",
                               (unsigned long)epoch, (unsigned long)seq);
    n += idl_effects_hex(line + n, request, request_len);
    n += (size_t)sprintf(line + n, "\", \"response\": \"");
    n += idl_effects_hex(line + n, response, response_len);
    n += (size_t)sprintf(line + n, "\", \"time\": %lu.%03u}\n", time_s, time_ms);
    return n;
}

#endif
