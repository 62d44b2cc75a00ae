/*
 * idemlink-device: the C device core on a POSIX host, served like `idemlink sim`.
 *
 *   idemlink-device [--port PATH] [--flash-dir DIR] [--device-id ID] [--seed N]
 *                   [--trigger-duration SECONDS] [--baudrate N] [--bytesize 7|8]
 *                   [--parity N|E|O] [--stopbits 1|2] [--stats] [--effects FILE]
 *                   [--control FIFO] [--modbus-rtu [--unit N]] [--address N]
 *                   [--key-file FILE]
 *
 * Without --port a pseudo-terminal is created. The port's path is the FIRST line of stdout
 * (flushed); then the device serves until SIGINT or SIGTERM and exits 0. --flash-dir keeps the
 * configuration (config.json, the same format as the Python simulator, replaced atomically), the
 * device id (device_id, created once), the map it belongs to (map: another map is refused) and a
 * boot counter (boots: mixed into --seed so every start draws new epochs); a symlink, FIFO or
 * oversized file there is refused, never followed. One device per flash directory: an exclusive
 * flock on it (the lock `idemlink sim` takes), so a second device or simulator is refused; the
 * temporaries a killed device left there are deleted at start. A bad argument, port or flash directory is one line on
 * stderr and exit 1 (2 for usage). --stats prints the session's counters (executed, replayed, ...,
 * flash_writes: configuration saves, which a write to a volatile register does not cost)
 * as one line on stderr when it stops. --modbus-rtu serves the same registers as a plain Modbus RTU
 * slave (unit --unit, default 1; t3.5 from --baudrate and the character format, 1.75 ms above
 * 19200 Bd and on a pty). --bytesize/--parity/--stopbits set a real port's character format and
 * the length of a character in the RTU timing: 8N1 by default, 8E1 with --modbus-rtu (as
 * `idemlink sim`); on a pty they only time the RTU pause.
 * --effects FILE appends the device's record to FILE, as `idemlink sim --effects` does (the format
 * `idemlink soak --device-cmd` judges): one JSON line {"boot": epoch, "time": t} before serving,
 * then {"epoch", "seq", "request": hex, "response": hex, "time": t} per execution (through the
 * core's optional idl_port_executed), each line one write(2) on an O_APPEND descriptor, before
 * the answer goes out; `time` is seconds of the device's clock (idl_port_millis, which starts at
 * 0 when the process starts).
 * --address N (1..247, docs/BUS.md): the device's bus address, kept in the flash directory's
 * `address` file for the next start (as `idemlink sim --address`); without it, the kept one.
 * Built with IDL_BUS=1 (the default of `make device`).
 *
 * --key-file FILE (IDL_AUTH=1, the default of `make device`; docs/SECURITY.md): the device's
 * long-term keys, one a line (the current one first, older ones accepted during a rotation),
 * read once at start from a private file (0600 or stricter; a group- or world-accessible one is
 * refused, one line on stderr, as the host refuses it): the device is then keyed, it takes
 * nothing but HELLO without a verified tag. Without it the device is unkeyed, the first
 * contract's device. Keys are never printed; only key ids leave the device (HELLO_REPLY).
 *
 * --control FIFO reads the world's changes from a named pipe (created if absent), the lines
 * `idemlink sim --control` takes: `input ADDRESS VALUE`, `condition ADDRESS BITS`
 * (posix_control.h), so the fault logic of any map can be driven from outside.
 *
 * This port implements idl_port.h with POSIX calls (the core itself uses none), one file per reason
 * to change: posix_args.c (the command line), posix_flash.c (the flash directory, the
 * configuration, device id, boot counter and received files), posix_serve.c (the port, bytes out
 * and the one serve loop of both faces), posix_control.c (the control FIFO), posix_files.c
 * (FILE_INFO / YMODEM storage); this file holds the clock, randomness, the effects record and
 * the start-up order.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idl_port.h"
#include "idl_rtu.h"
#include "posix_args.h"
#include "posix_common.h"
#include "posix_control.h"
#include "posix_flash.h"
#include "posix_keys.h"
#include "posix_serve.h"
#include "../demo_conditions.h"
#include "../effects_record.h"

#if !IDL_PORT_EXECUTED
#error "build the posix port with -DIDL_PORT_EXECUTED=1: --effects records through idl_port_executed"
#endif

static idl_posix_args_t args;
static unsigned long long seed_state;
static int effects_fd = -1;
static unsigned long long effects_ms; /* the last recorded time, widened past the 2^32 ms wrap */
static struct timespec clock_origin;

/* ---- randomness: splitmix64 from --seed, else the OS ---------------------------------------- */

static unsigned long long splitmix64(void)
{
    unsigned long long z = (seed_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static unsigned long long random64(void)
{
    unsigned long long v = 0;
    int fd;
    if (args.have_seed) {
        return splitmix64();
    }
    fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        idl_posix_fail(1, "cannot read /dev/urandom", strerror(errno));
    }
    close(fd);
    return v;
}

uint32_t idl_port_entropy32(void) { return (uint32_t)random64(); }

/* ---- clock ----------------------------------------------------------------------------------- */

/* Milliseconds since the process started (main() sets the origin first). */
uint32_t idl_port_millis(void)
{
    struct timespec ts;
    long long ms;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ms = (long long)(ts.tv_sec - clock_origin.tv_sec) * 1000ll
         + (long long)(ts.tv_nsec / 1000000l) - (long long)(clock_origin.tv_nsec / 1000000l);
    return (uint32_t)ms;
}

/* ---- the effects file (--effects) ------------------------------------------------------------ */

static void effects_append(const char *line, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(effects_fd, line + done, n - done);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            idl_posix_fail(1, "--effects: cannot append the record", strerror(errno));
        }
        done += (size_t)k;
    }
}

/* Milliseconds of the device's clock since the start, on 64 bits (the port's 32-bit clock wraps
 * after 49 days; the record's times must not). */
static unsigned long long effects_clock(uint32_t now)
{
    effects_ms += (uint32_t)(now - (uint32_t)effects_ms);
    return effects_ms;
}

/* the boot line also declares how long a trigger runs, so the soak's oracle models this device's
 * triggers from its own record (docs/SOAK.md) */
static void effects_boot(uint32_t epoch, uint32_t now, uint32_t trigger_ms)
{
    char line[IDL_EFFECTS_LINE_MAX];
    unsigned long long ms = effects_clock(now);
    effects_append(line, idl_effects_boot_line(line, epoch, (unsigned long)(ms / 1000u),
                                               (unsigned)(ms % 1000u), trigger_ms));
}

void idl_port_executed(uint32_t epoch, uint32_t seq, const uint8_t *request, uint16_t request_len,
                       const uint8_t *response, uint16_t response_len, uint32_t now)
{
    char line[IDL_EFFECTS_LINE_MAX];
    unsigned long long ms;
    if (effects_fd < 0) {
        return;
    }
    ms = effects_clock(now);
    effects_append(line, idl_effects_run_line(line, epoch, seq, request, request_len, response,
                                              response_len, (unsigned long)(ms / 1000u),
                                              (unsigned)(ms % 1000u)));
}

/* ---- the application's fault conditions ----------------------------------------------------- */

uint16_t idl_port_fault_conditions(const idl_regs_t *r, uint16_t address)
{
    return (uint16_t)(idl_demo_fault_conditions(r, address) | idl_posix_control_conditions(address));
}

/* ---- start and serve ------------------------------------------------------------------------ */

static idl_device_t device;
static idl_rtu_t rtu;

static void print_stats(void)
{
    if (args.rtu_mode) {
        fprintf(stderr, PROG ": stopped: answered=%lu broadcasts=%lu other_unit=%lu bad_crc=%lu "
                        "dropped=%lu other_answer=%lu flash_writes=%lu\n",
                (unsigned long)rtu.counters[IDL_RTU_ANSWERED],
                (unsigned long)rtu.counters[IDL_RTU_BROADCASTS],
                (unsigned long)rtu.counters[IDL_RTU_OTHER_UNIT],
                (unsigned long)rtu.counters[IDL_RTU_BAD_CRC],
                (unsigned long)rtu.counters[IDL_RTU_DROPPED],
                (unsigned long)rtu.counters[IDL_RTU_OTHER_ANSWER], idl_posix_flash_writes());
    } else {
        const uint32_t *c = device.session.counters;
        fprintf(stderr, PROG ": stopped: executed=%lu replayed=%lu conflict=%lu evicted=%lu "
                        "too_old=%lu epoch_mismatch=%lu hello=%lu decode_errors=%lu "
                        "flash_writes=%lu",
                (unsigned long)c[IDL_DISP_EXECUTED], (unsigned long)c[IDL_DISP_REPLAYED],
                (unsigned long)c[IDL_DISP_CONFLICT], (unsigned long)c[IDL_DISP_EVICTED],
                (unsigned long)c[IDL_DISP_TOO_OLD], (unsigned long)c[IDL_DISP_EPOCH_MISMATCH],
                (unsigned long)c[IDL_DISP_HELLO], (unsigned long)c[IDL_DISP_DECODE_ERRORS],
                idl_posix_flash_writes());
#if IDL_AUTH
        fprintf(stderr, " unauthenticated=%lu bad_mac=%lu",
                (unsigned long)c[IDL_DISP_UNAUTHENTICATED],
                (unsigned long)device.session.decoder.counters[IDL_DECODE_BAD_MAC]);
#endif
#if IDL_BUS
        fprintf(stderr, " other_address=%lu broadcast_executed=%lu broadcast_repeated=%lu "
                        "broadcast_refused=%lu",
                (unsigned long)c[IDL_DISP_OTHER_ADDRESS],
                (unsigned long)c[IDL_DISP_BROADCAST_EXECUTED],
                (unsigned long)c[IDL_DISP_BROADCAST_REPEATED],
                (unsigned long)c[IDL_DISP_BROADCAST_REFUSED]);
#endif
        fputc('\n', stderr);
    }
}

int main(int argc, char **argv)
{
    const char *path;
    int control_fd = -1;
    clock_gettime(CLOCK_MONOTONIC, &clock_origin);
    idl_posix_serve_signals();
    idl_posix_args_parse(&args, argc, argv);
    seed_state = args.seed;
    if (args.rtu_mode && args.key_file != NULL) { /* keyed, yet serving everyone: refused */
        idl_posix_fail(1, "--key-file keys the framed device; a plain Modbus RTU slave has no "
                          "frames to sign, so it does not apply to --modbus-rtu", NULL);
    }
    idl_posix_keys_load(args.key_file);
    idl_posix_flash_use(args.flash_dir, args.device_id, random64);
    idl_posix_flash_address(args.address);
    if (args.effects != NULL) {
        if (args.rtu_mode) {
            idl_posix_fail(1, "--effects records the framed device's executions; it does not "
                              "apply to --modbus-rtu", NULL);
        }
        effects_fd = open(args.effects, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (effects_fd < 0) {
            fprintf(stderr, PROG ": --effects %s: %s\n", args.effects, strerror(errno));
            return 1;
        }
    }
    if (args.control != NULL) {
        control_fd = idl_posix_control_open(args.control);
        if (control_fd < 0) {
            fprintf(stderr, PROG ": --control %s: %s\n", args.control,
                    errno == EEXIST ? "exists and is not a FIFO; refused" : strerror(errno));
            return 1;
        }
    }
    idl_posix_flash_lock();
    path = idl_posix_port_open(&args);
    if (args.flash_dir != NULL) {
        seed_state ^= 0xA0761D6478BD642Full * idl_posix_flash_start(); /* new epochs every start */
    }
    idl_device_init(&device);
    device.regs.trigger_ms = (uint32_t)(args.trigger_s * 1000.0 + 0.5);
    if (effects_fd >= 0) {
        effects_boot(device.session.epoch, idl_port_millis(), device.regs.trigger_ms);
    }
    printf("%s\n", path);
    fflush(stdout);

    if (args.rtu_mode) {
        idl_rtu_init(&rtu, &device.regs, (uint8_t)args.unit);
    }
    idl_posix_serve(&device, args.rtu_mode ? &rtu : NULL, &args, control_fd);
    idl_device_stop(&device); /* a batch in progress: CAN, its temporary deleted */
    if (args.print_stats) {
        print_stats();
    }
    idl_posix_port_close();
    return 0;
}
