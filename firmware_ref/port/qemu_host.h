/* What the QEMU ports (port/qemu_mps2, port/qemu_microbit built with IDL_BOARD_SEMIHOSTING=1)
 * share of the host's world, through ARM semihosting: the file calls, the command line that
 * tools/qemu-device passes (`-semihosting-config ...,arg=WORD`: words `key=value`), and the
 * control lines (control=PATH: a file the wrapper appends the lines of its --control FIFO to; the
 * main loop reads what was added, the rule of port/control_lines.h, refusals said on the host's
 * stderr). A bare board has none of this. */
#ifndef IDL_QEMU_HOST_H
#define IDL_QEMU_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idl_regs.h"

/* semihosting open modes (ARM semihosting SYS_OPEN) */
#define IDL_SH_MODE_RB 1
#define IDL_SH_MODE_RPLUSB 3
#define IDL_SH_MODE_WPLUSB 7
#define IDL_SH_MODE_A 8

int idl_sh_call(int op, void *arg);
int idl_sh_open(const char *path, int mode);
void idl_sh_close(int h);
/** true when all n bytes were written / read */
bool idl_sh_write(int h, const void *buf, size_t n);
bool idl_sh_read(int h, void *buf, size_t n);
bool idl_sh_seek(int h, uint32_t pos);
int idl_sh_flen(int h);
/** Open for appending (the end sought explicitly: QEMU 7.2 opens mode "a" without O_APPEND). */
int idl_sh_open_append(const char *path);
/** The host's time in seconds. */
uint32_t idl_sh_time(void);
/** End the program: QEMU exits 0 when `ok`, 1 otherwise. */
void idl_sh_exit(bool ok);

/** Read the command line once (at start); then idl_sh_arg("key") is the value of `key=...` or
 *  NULL. */
void idl_sh_read_cmdline(void);
const char *idl_sh_arg(const char *key);

/** control=PATH: open it (false when it is named and cannot be opened). */
bool idl_sh_control_start(void);
/** Apply the lines added to the control file since the last call (cheap when none were). */
void idl_sh_control_poll(idl_regs_t *regs, uint32_t now);
/** The external conditions the control lines set for the FAULT register at `address`. */
uint16_t idl_sh_control_conditions(uint16_t address);

/** With IDL_AUTH=1: keys=PATH, the device's long-term keys (a file of 1..4 times 32 bytes that
 *  tools/qemu-device writes, 0600, from its --key-file), read once into RAM (the board's flash,
 *  for this port), and nonce_seed=HEX (16 bytes from the host): the HELLO nonces are BLAKE2s of
 *  the seed and a counter. false when keys= is named and cannot be read whole. Without keys=
 *  the device is unkeyed. */
bool idl_sh_keys_load(void);

#endif /* IDL_QEMU_HOST_H */
