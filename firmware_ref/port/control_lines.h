/* The world outside a device, as lines of text from another process: the rule of
 * `idemlink sim --control` (device_sim/control.py, its Python twin), portable C for every port
 * (the posix device reads them from a FIFO, port/posix/posix_control.c; the QEMU devices from a
 * file the host appends to through semihosting, port/qemu_host.c):
 *   input ADDRESS VALUE        the world changed an INPUT register (raw 0..65535)
 *   condition ADDRESS BITS     the external fault conditions of that FAULT register are BITS
 * Numbers decimal or 0x hex (no sign); blank lines and '#' comments ignored. A wrong line
 * (unknown word, not a number, no such register, an undeclared bit, longer than 128 bytes)
 * changes nothing: it is counted and said through the `say` callback (one line). */
#ifndef IDL_CONTROL_LINES_H
#define IDL_CONTROL_LINES_H

#include <stddef.h>
#include <stdint.h>

#include "idl_regs.h"

#define IDL_CONTROL_MAX_LINE 128u

/** Say why `text` (a line) was refused. Show only its first `idl_control_shown(text)` bytes
 *  and "..." when more follows: a line's later words may be a secret an operator pasted (a
 *  key after a command this device does not know), never repeated in a log. */
typedef void (*idl_control_say_fn)(const char *text, const char *why);

typedef struct {
    uint16_t external[IDL_REG_COUNT]; /**< the conditions set, by register index */
    char line[IDL_CONTROL_MAX_LINE + 1u];
    uint16_t used;
    uint8_t skipping; /**< the rest of an overlong line is being dropped */
    uint8_t nul;      /**< this line holds a NUL byte: refused whole at its end */
    unsigned long refused;
    idl_control_say_fn say;
} idl_control_t;

void idl_control_init(idl_control_t *c, idl_control_say_fn say);

/** The bytes of `text` a refusal may show: its first word, at most 40 bytes. */
size_t idl_control_shown(const char *text);

/** Bytes from the outside: every complete line applied to `regs` at `now` (ms); returns the
 *  number of lines refused in this call. */
unsigned idl_control_feed(idl_control_t *c, const char *data, size_t n, idl_regs_t *regs,
                          uint32_t now);

/** The external conditions set for the FAULT register at `address` (0 if none). */
uint16_t idl_control_conditions(const idl_control_t *c, uint16_t address);

#endif /* IDL_CONTROL_LINES_H */
