/* The posix device's serving end: the port (a pseudo-terminal, or --port PATH with its character
 * format and baud rate), bytes out (idl_port_write), and ONE serve loop for both faces — the
 * framed protocol (idl_device_rx) and plain Modbus RTU (idl_rtu, a pause of t3.5 ends a frame) —
 * which also reads the control FIFO and gives the device its idle turns, until SIGINT/SIGTERM. */
#ifndef IDL_POSIX_SERVE_H
#define IDL_POSIX_SERVE_H

#include "idl_port.h"
#include "idl_rtu.h"
#include "posix_args.h"

/** SIGINT and SIGTERM end the serve loop (no SA_RESTART: the signal wakes its select). */
void idl_posix_serve_signals(void);

/** Open the port the arguments name (or create a pseudo-terminal, keeping its slave open so a
 *  client closing and reopening it never hangs up the master); returns its path. Exits on
 *  failure (one line, exit 1). */
const char *idl_posix_port_open(const idl_posix_args_t *a);

/** Close the port (and the pseudo-terminal's slave). */
void idl_posix_port_close(void);

/** Serve until a signal: `rtu` NULL serves frames to `device`; else `rtu` (initialised over
 *  device->regs) serves Modbus RTU, its pause timed from the arguments' baud rate and character
 *  format. `control_fd` (-1: none) is the control FIFO, read when it has something. */
void idl_posix_serve(idl_device_t *device, idl_rtu_t *rtu, const idl_posix_args_t *a,
                     int control_fd);

#endif /* IDL_POSIX_SERVE_H */
