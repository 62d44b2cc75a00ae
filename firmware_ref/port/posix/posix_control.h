/* The world outside the posix device, from another process: a control FIFO (--control PATH).
 * The same lines as `idemlink sim --control` (device_sim/control.py, the rule's Python twin;
 * the C rule is port/control_lines.c, which the QEMU devices share):
 *   input ADDRESS VALUE        the world changed an INPUT register (raw 0..65535)
 *   condition ADDRESS BITS     the external fault conditions of that FAULT register are BITS
 * Numbers decimal or 0x hex; blank lines and '#' comments ignored. A wrong line (unknown word,
 * not a number, no such register, an undeclared bit, longer than 128 bytes) changes nothing: it
 * is counted and said on stderr in one line. */
#ifndef IDL_POSIX_CONTROL_H
#define IDL_POSIX_CONTROL_H

#include <stdint.h>

#include "idl_regs.h"

/** Create (if absent) and open the FIFO at `path`; its fd, or -1 with errno set (EEXIST: there
 *  is something at `path` that is not a FIFO). */
int idl_posix_control_open(const char *path);

/** Read what came on `fd` and apply every complete line at `now` (ms). Returns the number of
 *  lines refused in this call. */
unsigned idl_posix_control_poll(int fd, idl_regs_t *regs, uint32_t now);

/** The external conditions the control FIFO set for the FAULT register at `address` (0 if none). */
uint16_t idl_posix_control_conditions(uint16_t address);

/** Lines refused since start. */
unsigned long idl_posix_control_refused(void);

#endif /* IDL_POSIX_CONTROL_H */
