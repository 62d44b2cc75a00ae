/*
 * idemlink-device: the C device core on a POSIX host, served like `idemlink sim`.
 *
 *   idemlink-device [--port PATH] [--flash-dir DIR] [--device-id ID] [--seed N]
 *                   [--trigger-duration SECONDS] [--baudrate N] [--bytesize 7|8]
 *                   [--parity N|E|O] [--stopbits 1|2] [--stats] [--effects FILE]
 *                   [--control FIFO] [--modbus-rtu [--unit N]]
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
 *
 * --control FIFO reads the world's changes from a named pipe (created if absent), the lines
 * `idemlink sim --control` takes: `input ADDRESS VALUE`, `condition ADDRESS BITS`
 * (posix_control.h), so the fault logic of any map can be driven from outside.
 *
 * This file is the port: it implements idl_port.h with POSIX calls (the core itself uses none).
 */
#define _DEFAULT_SOURCE /* flock(2): the lock `idemlink sim` takes, so the two exclude each other */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>

#include "posix_control.h"
#include <unistd.h>

#include "idl_port.h"
#include "idl_rtu.h"
#include "posix_files.h"
#include "../demo_conditions.h"
#include "../effects_record.h"

#if !IDL_PORT_EXECUTED
#error "build the posix port with -DIDL_PORT_EXECUTED=1: --effects records through idl_port_executed"
#endif

#define PROG "idemlink-device"
#define TICK_MS 20
/* the largest flash files read, as device_sim/flash.py: MAX_FILE_BYTES, DEVICE_ID_FILE_BYTES */
#define CONFIG_FILE_BYTES (1u << 20)
#define DEVICE_ID_FILE_BYTES 128u

static volatile sig_atomic_t stop_requested;
static int io_fd = -1;
static const char *flash_dir;
static const char *given_id;
static int have_seed;
static int print_stats;
/* configuration saves since start (--stats): the erase/program cycles an MCU's flash would spend */
static unsigned long flash_writes;
static unsigned long long seed_state;
static int effects_fd = -1;
static unsigned long long effects_ms; /* the last recorded time, widened past the 2^32 ms wrap */
static struct timespec clock_origin;

static void on_signal(int signum)
{
    (void)signum;
    stop_requested = 1;
}

static void fail(int code, const char *what, const char *detail)
{
    fprintf(stderr, PROG ": %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(code);
}

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
    if (have_seed) {
        return splitmix64();
    }
    fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        fail(1, "cannot read /dev/urandom", strerror(errno));
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
            fail(1, "--effects: cannot append the record", strerror(errno));
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

/* ---- bytes out --------------------------------------------------------------------------------- */

void idl_port_write(const uint8_t *data, size_t n)
{
    while (n > 0u) {
        ssize_t k = write(io_fd, data, n);
        if (k < 0) {
            fd_set w;
            struct timeval tv = { 0, 100000 }; /* a reader that stalls 0.1 s loses the answer */
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                fprintf(stderr, PROG ": write failed: %s\n", strerror(errno));
                return;
            }
            FD_ZERO(&w);
            FD_SET(io_fd, &w);
            if (select(io_fd + 1, NULL, &w, NULL, &tv) <= 0) {
                fprintf(stderr, PROG ": write stalled for 0.1 s, answer dropped\n");
                return;
            }
            continue;
        }
        data += k;
        n -= (size_t)k;
    }
}

/* ---- the device id ----------------------------------------------------------------------------- */

static int valid_id(const char *s, size_t n)
{
    size_t i;
    if (n < 1u || n > IDL_MAX_DEVICE_ID_LEN) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        char c = s[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0u || (c != '_' && c != '.' && c != ':' && c != '-'))) {
            return 0;
        }
    }
    return 1;
}

static void sync_dir(void)
{
    int fd = open(flash_dir, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Write `text` to DIR/name by atomic replacement (temporary file, fsync, rename, fsync dir). */
static int replace_file(const char *name, const char *text, size_t n)
{
    char tmp[4096];
    char path[4096];
    int fd;
    size_t done = 0;
    snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", flash_dir, name);
    snprintf(path, sizeof path, "%s/%s", flash_dir, name);
    fd = mkstemp(tmp);
    if (fd < 0) {
        return -1;
    }
    while (done < n) {
        ssize_t k = write(fd, text + done, n - done);
        if (k < 0) {
            close(fd);
            unlink(tmp);
            return -1;
        }
        done += (size_t)k;
    }
    if (fsync(fd) != 0 || fchmod(fd, 0600) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    sync_dir();
    return 0;
}

/* Read DIR/name into buf (NUL-terminated): -1 when absent. A symlink, a FIFO, a device or a
 * file of cap bytes or more is refused (one line, exit 1), judged on the opened descriptor, as
 * device_sim/flash.py read_flash_file does; the directory is left untouched. */
static long read_flash_file(const char *name, char *buf, size_t cap)
{
    char path[4096];
    struct stat st;
    size_t total = 0;
    ssize_t n;
    int fd;
    snprintf(path, sizeof path, "%s/%s", flash_dir, name);
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT) {
            return -1;
        }
        fprintf(stderr, PROG ": flash directory: %s: %s; refused\n", path,
                errno == ELOOP ? "is a symbolic link" : strerror(errno));
        exit(1);
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (unsigned long long)st.st_size >= cap) {
        fprintf(stderr, PROG ": flash directory: %s: not a regular file of at most %lu bytes; "
                        "refused\n", path, (unsigned long)(cap - 1u));
        exit(1);
    }
    while (total + 1u < cap && (n = read(fd, buf + total, cap - 1u - total)) > 0) {
        total += (size_t)n;
    }
    close(fd);
    buf[total] = '\0';
    return (long)total;
}

/* DIR/files, where received files go, absent or a directory of its own: a symbolic link there
 * would put them outside the flash directory, so it is refused like any flash file (one line,
 * exit 1), as device_sim/flash.py ConfigFlash.files_dir does. */
static void check_files_dir(void)
{
    char path[4096 + 8];
    struct stat st;
    snprintf(path, sizeof path, "%s/files", flash_dir);
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) {
            return;
        }
        fprintf(stderr, PROG ": flash directory: %s: %s; refused\n", path, strerror(errno));
        exit(1);
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, PROG ": flash directory: %s: %s; refused\n", path,
                S_ISLNK(st.st_mode) ? "is a symbolic link" : "not a directory");
        exit(1);
    }
}

/* mkdir -p, as `idemlink sim` creates its flash directory with its parents: 0 or -1 (errno). */
static int make_dirs(const char *dir)
{
    char path[4096];
    size_t i;
    if (strlen(dir) >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    snprintf(path, sizeof path, "%s", dir);
    for (i = 1; path[i] != '\0'; i++) {
        if (path[i] == '/' && path[i - 1] != '/') {
            path[i] = '\0';
            if (mkdir(path, 0700) != 0 && errno != EEXIST) {
                return -1;
            }
            path[i] = '/';
        }
    }
    return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* One device per flash directory, as `idemlink sim` (device_sim/flash.py lock_flash_dir): an
 * exclusive flock on the directory itself, held until exit (the descriptor is never closed), taken
 * before anything there is read or written. Two devices would overwrite each other's
 * configuration and count each other's boots. */
static void lock_flash_dir(void)
{
    int fd = open(flash_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        fail(1, "flash directory", strerror(errno));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            fprintf(stderr, PROG ": flash directory %s is in use by another device: one device "
                            "per flash directory; nothing changed\n", flash_dir);
            exit(1);
        }
        fail(1, "flash directory: cannot lock it", strerror(errno));
    }
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s);
    size_t k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A temporary of ours: `.<name>.XXXXXX` (replace_file's mkstemp) or `.<stem>.<random>.tmp`
 * (`idemlink sim`'s), for the four files kept in the flash directory; nothing else matches. */
static int is_flash_temporary(const char *entry)
{
    static const char *const names[] = { "config.json", "boots", "map", "device_id" };
    static const char *const stems[] = { "config", "boots", "map", "device_id" };
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t n = strlen(names[i]);
        size_t k = strlen(stems[i]);
        if (entry[0] != '.') {
            return 0;
        }
        if (strncmp(entry + 1, names[i], n) == 0 && entry[1 + n] == '.'
            && strlen(entry + 2 + n) == 6u) {
            return 1;
        }
        if (strncmp(entry + 1, stems[i], k) == 0 && entry[1 + k] == '.'
            && strlen(entry + 2 + k) > 4u && ends_with(entry, ".tmp")) {
            return 1;
        }
    }
    return 0;
}

/* Delete in `dir` the temporaries a process killed mid-write left behind (is_flash_temporary;
 * in `files`, a batch's `.ymodem-<random>.part`): they are never read, so each crash would leak
 * one for good. Only under the directory's lock, so no writer is alive to own them. */
static void remove_stale_temporaries(const char *dir, int receiving)
{
    char path[4096 + 256];
    struct dirent *e;
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    while ((e = readdir(d)) != NULL) {
        int stale = receiving ? starts_with(e->d_name, ".ymodem-") && ends_with(e->d_name, ".part")
                              : is_flash_temporary(e->d_name);
        if (stale) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            (void)unlink(path);
        }
    }
    closedir(d);
}

/* Tie the flash directory to this map (file `map`: name and hash, like the Python simulator):
 * a directory saved with another map is refused, nothing changed. Checked first (`record` 0), so
 * that a directory of another map is refused by name before its configuration is read; the record
 * is written (`record` 1) once every check has passed. */
static void claim_map(int record)
{
    char text[257];
    char name[257];
    char hash[257];
    long n = read_flash_file("map", text, sizeof text);
    if (n < 0) {
        if (!record) {
            return;
        }
        n = (long)snprintf(text, sizeof text, "%s %s\n", IDL_MAP_NAME, IDL_MAP_HASH);
        if (replace_file("map", text, (size_t)n) != 0) {
            fail(1, "flash directory: cannot write the map record", strerror(errno));
        }
        return;
    }
    if (sscanf(text, "%256s %256s", name, hash) != 2) {
        fail(1, "flash directory: map: not a map record; refused", NULL);
    }
    if (strcmp(hash, IDL_MAP_HASH) != 0) {
        fprintf(stderr, PROG ": %s holds the configuration of register map %s %s, not %s %s: use "
                        "another flash directory\n", flash_dir, name, hash, IDL_MAP_NAME,
                IDL_MAP_HASH);
        exit(1);
    }
}

/* The boot counter's rule, as device_sim/flash.py parse_boots (tests/vectors/flash_files.json):
 * ASCII digits, then nothing but blanks (space, tab, CR, LF), of a value at most 2^64 - 2 (the
 * counter is 64 bits and the next boot's count must fit). */
#define MAX_BOOTS 0xFFFFFFFFFFFFFFFEull
#define BOOTS_FILE_BYTES 64u

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The persisted boot counter (file `boots`; 0 when absent), nothing written; a counter that breaks
 * the rule is refused (one line, exit 1). */
static unsigned long long read_boots(void)
{
    char text[BOOTS_FILE_BYTES + 1];
    unsigned long long boots = 0;
    long n = read_flash_file("boots", text, sizeof text);
    long i = 0;
    long digits;
    if (n < 0) {
        return 0;
    }
    while (i < n && text[i] >= '0' && text[i] <= '9') {
        i++;
    }
    digits = i;
    while (i < n && is_blank(text[i])) {
        i++;
    }
    if (digits == 0 || i != n) { /* a NUL byte stops both loops too */
        fail(1, "flash directory: boots: not a boot counter; refused", NULL);
    }
    for (i = 0; i < digits; i++) {
        unsigned d = (unsigned)(text[i] - '0');
        if (boots > (MAX_BOOTS - d) / 10u) {
            fail(1, "flash directory: boots: boot counter above 18446744073709551614; refused",
                 NULL);
        }
        boots = boots * 10u + d;
    }
    return boots;
}

/* The persisted boot counter, incremented: mixed into seeded epochs so that every start draws
 * new ones (a repeated epoch would let an old host replay into a new boot). */
static unsigned long long count_boot(void)
{
    char text[BOOTS_FILE_BYTES + 1];
    unsigned long long boots = read_boots() + 1u;
    int n = snprintf(text, sizeof text, "%llu\n", boots);
    if (replace_file("boots", text, (size_t)n) != 0) {
        fail(1, "flash directory: cannot write the boot counter", strerror(errno));
    }
    return boots;
}

size_t idl_port_unique_id(char *buf, size_t cap)
{
    char text[DEVICE_ID_FILE_BYTES + 1];
    size_t n;
    if (given_id != NULL) {
        n = strlen(given_id);
        memcpy(buf, given_id, n < cap ? n : cap);
        return n < cap ? n : cap;
    }
    if (flash_dir != NULL) {
        long got = read_flash_file("device_id", text, sizeof text);
        if (got >= 0) {
            n = (size_t)got;
            while (n > 0u && (text[n - 1u] == '\n' || text[n - 1u] == '\r' || text[n - 1u] == ' ')) {
                n--;
            }
            if (!valid_id(text, n)) {
                fail(1, "flash directory: device_id does not hold a device id "
                        "(1-64 characters of [A-Za-z0-9_.:-])", NULL);
            }
        } else {
            n = (size_t)snprintf(text, sizeof text, "sim-%016llx", random64());
            text[n] = '\n';
            if (replace_file("device_id", text, n + 1u) != 0) {
                fail(1, "flash directory: cannot create device_id", strerror(errno));
            }
        }
    } else {
        n = (size_t)snprintf(text, sizeof text, "sim-%016llx", random64());
    }
    if (n > cap) {
        n = cap;
    }
    memcpy(buf, text, n);
    return n;
}

/* ---- configuration flash: config.json like device_sim/flash.py ------------------------------ */

bool idl_port_flash_save(const uint16_t *values, uint16_t generation)
{
    char text[64 + 24 * IDL_REG_COUNT];
    size_t n;
    uint32_t i;
    int first = 1;
    if (flash_dir == NULL) {
        return true;
    }
    n = (size_t)snprintf(text, sizeof text, "{\"generation\": %u, \"holdings\": [",
                         (unsigned)generation);
    for (i = 0; i < IDL_REG_COUNT; i++) {
        if (IDL_REGMAP[i].kind == (uint8_t)IDL_REG_KIND_HOLDING) {
            n += (size_t)snprintf(text + n, sizeof text - n, "%s[%u, %u]", first ? "" : ", ",
                                  (unsigned)IDL_REGMAP[i].address, (unsigned)values[i]);
            first = 0;
        }
    }
    n += (size_t)snprintf(text + n, sizeof text - n, "]}");
    if (replace_file("config.json", text, n) != 0) {
        fprintf(stderr, PROG ": configuration not saved (%s): write refused\n", strerror(errno));
        return false;
    }
    flash_writes++;
    return true;
}

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') {
        p++;
    }
    return p;
}

/* A plain non-negative JSON integer; NULL if there is none. */
static const char *number(const char *p, long *out)
{
    long v = 0;
    p = skip_ws(p);
    if (*p < '0' || *p > '9') {
        return NULL;
    }
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > 0xFFFFF) {
            return NULL;
        }
        p++;
    }
    *out = v;
    return p;
}

static const char *expect(const char *p, char c)
{
    p = skip_ws(p);
    return *p == c ? p + 1 : NULL;
}

/* Strict UTF-8 (no overlong form, surrogate or code point past U+10FFFF) without a NUL byte: what
 * the simulator decodes as text (device_sim/flash.py ConfigFlash.load). */
static int utf8_text(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        unsigned cp;
        unsigned least;
        size_t k;
        size_t j;
        if (c == 0u) {
            return 0;
        }
        if (c < 0x80u) {
            i++;
            continue;
        }
        if (c >= 0xC2u && c <= 0xDFu) {
            k = 1;
            cp = c & 0x1Fu;
            least = 0x80u;
        } else if (c >= 0xE0u && c <= 0xEFu) {
            k = 2;
            cp = c & 0x0Fu;
            least = 0x800u;
        } else if (c >= 0xF0u && c <= 0xF4u) {
            k = 3;
            cp = c & 0x07u;
            least = 0x10000u;
        } else {
            return 0;
        }
        if (n - i <= k) {
            return 0; /* cut short */
        }
        for (j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0u) != 0x80u) {
                return 0;
            }
            cp = (cp << 6) | (s[i + j] & 0x3Fu);
        }
        if (cp < least || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu)) {
            return 0;
        }
        i += k + 1u;
    }
    return 1;
}

/* The [address, value] pair of the holdings list at *p (just after its '[' or a previous pair):
 * 1 and *p past the pair and its separator, 0 at the list's end, -1 when what is there is no
 * pair of integers 0..65535 (or no list goes on after it). */
static int next_pair(const char **p, long *a, long *v)
{
    const char *q = skip_ws(*p);
    if (*q == ']') {
        return 0;
    }
    if ((q = expect(q, '[')) == NULL || (q = number(q, a)) == NULL || (q = expect(q, ',')) == NULL
        || (q = number(q, v)) == NULL || (q = expect(q, ']')) == NULL || *a > 0xFFFF
        || *v > 0xFFFF) {
        return -1;
    }
    q = skip_ws(q);
    if (*q == ',') {
        q++;
        if (*skip_ws(q) == ']') {
            return -1; /* a trailing comma: not JSON */
        }
    } else if (*q != ']') {
        return -1;
    }
    *p = q;
    return 1;
}

#define CONFIG_REFUSED PROG ": flash directory: config.json: "

/* config.json, judged as the simulator judges it (ConfigSnapshot.from_json, then the map's
 * DeviceCore), in its order and with its words (tests/vectors/flash_files.json): text, a holdings
 * list, its pairs, the generation, each address once, this map's HOLDINGs and only them, each
 * value in its range. A refusal is one line and exit 1. */
bool idl_port_flash_load(uint16_t *values, uint16_t *generation)
{
    static char text[CONFIG_FILE_BYTES + 1]; /* read at start only: not on the stack */
    static uint8_t given[0x10000u / 8u];     /* each address once, any address */
    const char *list;
    const char *p;
    long gen = -1;
    long a;
    long v;
    long n;
    int more;
    uint32_t seen = 0;
    uint32_t i;
    uint32_t holdings = 0;
    if (flash_dir == NULL) {
        return false;
    }
    n = read_flash_file("config.json", text, sizeof text);
    if (n < 0) {
        return false;
    }
    if (!utf8_text((const unsigned char *)text, (size_t)n)) {
        fail(1, "flash directory: config.json: not UTF-8 text", NULL);
    }
    list = strstr(text, "\"holdings\"");
    if (list == NULL || (list = expect(list + 10, ':')) == NULL
        || (list = expect(list, '[')) == NULL) {
        fail(1, "flash directory: config.json: need an object with a holdings list", NULL);
    }
    p = list;
    while ((more = next_pair(&p, &a, &v)) == 1) {
    }
    if (more < 0) {
        fail(1, "flash directory: config.json: holdings must be [address, value] pairs of "
                "integers 0..65535", NULL);
    }
    p = strstr(text, "\"generation\"");
    if (p == NULL || (p = expect(p + 12, ':')) == NULL || (p = number(p, &gen)) == NULL
        || gen > 0xFFFF || (*skip_ws(p) != ',' && *skip_ws(p) != '}')) {
        fail(1, "flash directory: config.json: generation is not an integer 0..65535", NULL);
    }
    memset(given, 0, sizeof given);
    for (p = list; next_pair(&p, &a, &v) == 1;) {
        uint8_t bit = (uint8_t)(1u << ((unsigned long)a & 7u));
        if ((given[a >> 3] & bit) != 0u) {
            fprintf(stderr, CONFIG_REFUSED "address %ld given twice\n", a);
            exit(1);
        }
        given[a >> 3] = (uint8_t)(given[a >> 3] | bit);
    }
    for (i = 0; i < IDL_REG_COUNT; i++) {
        holdings += IDL_REGMAP[i].kind == (uint8_t)IDL_REG_KIND_HOLDING;
    }
    for (p = list; next_pair(&p, &a, &v) == 1;) {
        int32_t at = idl_regs_index((uint16_t)a);
        seen += at >= 0 && IDL_REGMAP[at].kind == (uint8_t)IDL_REG_KIND_HOLDING ? 1u : 0x10000u;
    }
    if (seen != holdings) { /* one that is not a HOLDING counts past any map's HOLDINGs */
        fail(1, "flash directory: config.json: snapshot holds other registers than this map's "
                "HOLDINGs", NULL);
    }
    for (p = list; next_pair(&p, &a, &v) == 1;) {
        int32_t at = idl_regs_index((uint16_t)a);
        if (IDL_REGMAP[at].min > v || IDL_REGMAP[at].max < v) {
            fprintf(stderr, CONFIG_REFUSED "address %ld: %ld outside %u..%u\n", a, v,
                    (unsigned)IDL_REGMAP[at].min, (unsigned)IDL_REGMAP[at].max);
            exit(1);
        }
        values[at] = (uint16_t)v;
    }
    *generation = (uint16_t)gen;
    return true;
}

/* ---- the application's fault conditions ----------------------------------------------------- */

uint16_t idl_port_fault_conditions(const idl_regs_t *r, uint16_t address)
{
    return (uint16_t)(idl_demo_fault_conditions(r, address) | idl_posix_control_conditions(address));
}

static int control_fd = -1;

/* The select set: the port, and the control FIFO when there is one; the highest fd + 1. */
static int watch(fd_set *r)
{
    FD_ZERO(r);
    FD_SET(io_fd, r);
    if (control_fd >= 0) {
        FD_SET(control_fd, r);
    }
    return (control_fd > io_fd ? control_fd : io_fd) + 1;
}

static void poll_control(const fd_set *r, idl_regs_t *regs)
{
    if (control_fd >= 0 && FD_ISSET(control_fd, r)) {
        (void)idl_posix_control_poll(control_fd, regs, idl_port_millis());
    }
}

/* ---- FILE_INFO: <flash-dir>/files, like the Python simulator's files_dir ------------------- */

int idl_port_file_info(const uint8_t *name, uint8_t len, uint32_t *size, uint32_t *crc)
{
    char dir[4096];
    if (flash_dir == NULL) {
        return 1; /* no flash: nothing was ever received */
    }
    snprintf(dir, sizeof dir, "%s/files", flash_dir);
    return idl_posix_file_info(dir, name, len, size, crc);
}

/* ---- FILE_RECEIVE: YMODEM into <flash-dir>/files, like the Python simulator ---------------- */

static uint8_t ymodem_block[IDL_YM_BLOCK_LARGE];

uint8_t *idl_port_ymodem_block(void) { return flash_dir != NULL ? ymodem_block : NULL; }

bool idl_port_file_begin(const uint8_t *name, size_t len, bool overwrite)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/files", flash_dir);
    return idl_posix_file_begin(dir, name, len, overwrite, idl_port_entropy32) == 0;
}

bool idl_port_file_write(uint32_t offset, const uint8_t *data, size_t n)
{
    return idl_posix_file_write(offset, data, n) == 0;
}

bool idl_port_file_commit(uint32_t size) { return idl_posix_file_commit(size) == 0; }

void idl_port_file_abort(void) { idl_posix_file_abort(); }

/* ---- the serving end ----------------------------------------------------------------------- */

static void make_raw(int fd)
{
    struct termios t;
    if (tcgetattr(fd, &t) != 0) {
        return;
    }
    t.c_iflag &= (tcflag_t) ~(IGNBRK | BRKINT | PARMRK | ISTRIP | INLCR | IGNCR | ICRNL | IXON);
    t.c_oflag &= (tcflag_t)~OPOST;
    t.c_lflag &= (tcflag_t) ~(ECHO | ECHONL | ICANON | ISIG | IEXTEN);
    t.c_cflag &= (tcflag_t) ~(CSIZE | PARENB);
    t.c_cflag |= CS8 | CLOCAL | CREAD;
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    (void)tcsetattr(fd, TCSANOW, &t);
}

/* The character format (bytesize 7/8, parity 'N'/'E'/'O', stopbits 1/2) on a real port. */
static void set_char_format(int fd, long bytesize, char parity, long stopbits)
{
    struct termios t;
    if (tcgetattr(fd, &t) != 0) {
        return;
    }
    t.c_cflag &= (tcflag_t) ~(CSIZE | PARENB | PARODD | CSTOPB);
    t.c_cflag |= bytesize == 7 ? CS7 : CS8;
    if (parity != 'N') {
        t.c_cflag |= PARENB;
        t.c_cflag |= parity == 'O' ? PARODD : 0;
    }
    t.c_cflag |= stopbits == 2 ? CSTOPB : 0;
    (void)tcsetattr(fd, TCSANOW, &t);
}

static speed_t baud(long rate)
{
    switch (rate) {
    case 9600: return B9600;
    case 19200: return B19200;
    case 38400: return B38400;
    case 57600: return B57600;
    case 115200: return B115200;
    case 230400: return B230400;
    default: return B0;
    }
}

static long parse_long(const char *opt, const char *text)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || end == text) {
        fprintf(stderr, PROG ": %s: %s is not an integer\n", opt, text);
        exit(2);
    }
    return v;
}

static void usage(void)
{
    fprintf(stderr, "usage: " PROG " [--port PATH] [--flash-dir DIR] [--device-id ID] [--seed N] "
                    "[--trigger-duration SECONDS] [--baudrate N] [--bytesize 7|8] "
                    "[--parity N|E|O] [--stopbits 1|2] [--stats] [--effects FILE] "
                    "[--control FIFO] [--modbus-rtu [--unit N]]\n");
    exit(2);
}

static idl_device_t device;
static idl_rtu_t rtu;

static unsigned long long micros(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
}

/* Modbus RTU: a pause of t3.5 ends a frame. It is seen between two reads (their distance less
 * the second read's transmission time) or when the line stays silent after the last byte. */
static void serve_rtu(long baudrate, unsigned char_bits)
{
    const unsigned long long char_us = idl_rtu_char_us((uint32_t)baudrate, char_bits);
    const unsigned long long t35_us = idl_rtu_t35_us((uint32_t)baudrate, char_bits);
    unsigned long long last_rx = 0;
    int have_rx = 0;
    while (!stop_requested) {
        fd_set r;
        int pending = rtu.len != 0u || rtu.hunting;
        struct timeval tv = { 0, pending ? 2000 : TICK_MS * 1000 };
        uint8_t buf[512];
        unsigned long long now;
        ssize_t n;
        size_t i;
        size_t out;
        int ready;
        ready = select(watch(&r), &r, NULL, NULL, &tv);
        if (ready < 0) {
            if (errno == EINTR) {
                continue;
            }
            fail(1, "the port failed while serving", strerror(errno));
        }
        if (ready > 0) {
            poll_control(&r, &device.regs);
        }
        now = micros();
        n = ready > 0 && FD_ISSET(io_fd, &r) ? read(io_fd, buf, sizeof buf) : 0;
        if (n < 0 && errno != EAGAIN && errno != EINTR && errno != EIO) {
            fail(1, "the port failed while serving", strerror(errno));
        }
        if (n <= 0) {
            if (pending && have_rx && now - last_rx >= t35_us) {
                out = idl_rtu_pause(&rtu, idl_port_millis());
                if (out != 0u) {
                    idl_port_write(rtu.out, out);
                }
            }
            idl_device_poll(&device);
            continue;
        }
        if (have_rx && now - last_rx >= t35_us + (unsigned long long)n * char_us) {
            out = idl_rtu_pause(&rtu, idl_port_millis());
            if (out != 0u) {
                idl_port_write(rtu.out, out);
            }
        }
        last_rx = now;
        have_rx = 1;
        idl_regs_tick(&device.regs, idl_port_millis());
        for (i = 0; i < (size_t)n; i++) {
            out = idl_rtu_feed(&rtu, buf[i], idl_port_millis());
            if (out != 0u) {
                idl_port_write(rtu.out, out);
            }
        }
    }
}

int main(int argc, char **argv)
{
    const char *port = NULL;
    const char *effects = NULL;
    const char *control = NULL;
    long baudrate = 115200;
    long bytesize = 8;
    long stopbits = 1;
    char parity = 0; /* not given: 'N', or 'E' with --modbus-rtu */
    long unit = 1;
    int rtu_mode = 0;
    double trigger_s = IDL_TRIGGER_MS / 1000.0;
    int slave_fd = -1;
    const char *path;
    struct sigaction sa;
    int i;
    clock_gettime(CLOCK_MONOTONIC, &clock_origin);
    memset(&sa, 0, sizeof sa); /* no SA_RESTART: a signal wakes the select and the loop ends */
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    for (i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(opt, "-h") == 0 || strcmp(opt, "--help") == 0) {
            usage();
        }
        if (strcmp(opt, "--stats") == 0) {
            print_stats = 1;
            continue;
        }
        if (strcmp(opt, "--modbus-rtu") == 0) {
            rtu_mode = 1;
            continue;
        }
        if (val == NULL) {
            usage();
        }
        i++;
        if (strcmp(opt, "--port") == 0) {
            port = val;
        } else if (strcmp(opt, "--flash-dir") == 0) {
            flash_dir = val;
        } else if (strcmp(opt, "--effects") == 0) {
            effects = val;
        } else if (strcmp(opt, "--control") == 0) {
            control = val;
        } else if (strcmp(opt, "--device-id") == 0) {
            if (!valid_id(val, strlen(val))) {
                fprintf(stderr, PROG ": device id '%s' must be 1-64 characters of "
                                "[A-Za-z0-9_.:-], starting with a letter or digit\n", val);
                return 1;
            }
            given_id = val;
        } else if (strcmp(opt, "--seed") == 0) {
            seed_state = (unsigned long long)parse_long(opt, val);
            have_seed = 1;
        } else if (strcmp(opt, "--baudrate") == 0) {
            baudrate = parse_long(opt, val);
            if (baudrate <= 0 || baudrate > 20000000) {
                fprintf(stderr, PROG ": baud rate %ld must be 1..20000000\n", baudrate);
                return 1;
            }
        } else if (strcmp(opt, "--bytesize") == 0) {
            bytesize = parse_long(opt, val);
            if (bytesize != 7 && bytesize != 8) {
                fprintf(stderr, PROG ": byte size %ld must be 7 or 8\n", bytesize);
                return 1;
            }
        } else if (strcmp(opt, "--stopbits") == 0) {
            stopbits = parse_long(opt, val);
            if (stopbits != 1 && stopbits != 2) {
                fprintf(stderr, PROG ": stop bits %ld must be 1 or 2\n", stopbits);
                return 1;
            }
        } else if (strcmp(opt, "--parity") == 0) {
            if (val[0] == '\0' || val[1] != '\0' || strchr("NEOneo", val[0]) == NULL) {
                fprintf(stderr, PROG ": parity '%s' must be N, E or O\n", val);
                return 1;
            }
            parity = val[0] == 'n' ? 'N' : val[0] == 'e' ? 'E' : val[0] == 'o' ? 'O' : val[0];
        } else if (strcmp(opt, "--unit") == 0) {
            unit = parse_long(opt, val);
            if (unit < 1 || unit > 247) {
                fprintf(stderr, PROG ": unit id %ld outside 1..247\n", unit);
                return 1;
            }
        } else if (strcmp(opt, "--trigger-duration") == 0 || strcmp(opt, "--trigger-seconds") == 0) {
            char *end;
            trigger_s = strtod(val, &end);
            if (*end != '\0' || end == val) {
                fprintf(stderr, PROG ": %s: %s is not a number\n", opt, val);
                return 2;
            }
            /* like `idemlink sim`; the core counts milliseconds in 32 bits (49.7 days) */
            if (!(trigger_s >= 0.0 && trigger_s <= 4.0e6)) {
                fprintf(stderr, PROG ": trigger duration %s must be a finite number of seconds "
                                ">= 0 (at most 4000000)\n", val);
                return 1;
            }
        } else {
            usage();
        }
    }
    if (parity == 0) {
        parity = rtu_mode ? 'E' : 'N'; /* Modbus RTU's default framing is 8E1 */
    }
    if (effects != NULL) {
        if (rtu_mode) {
            fail(1, "--effects records the framed device's executions; it does not apply to "
                    "--modbus-rtu", NULL);
        }
        effects_fd = open(effects, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (effects_fd < 0) {
            fprintf(stderr, PROG ": --effects %s: %s\n", effects, strerror(errno));
            return 1;
        }
    }
    if (control != NULL) {
        control_fd = idl_posix_control_open(control);
        if (control_fd < 0) {
            fprintf(stderr, PROG ": --control %s: %s\n", control,
                    errno == EEXIST ? "exists and is not a FIFO; refused" : strerror(errno));
            return 1;
        }
    }
    if (flash_dir != NULL && make_dirs(flash_dir) != 0) {
        fail(1, "flash directory", strerror(errno));
    }
    if (flash_dir != NULL) {
        lock_flash_dir();
    }
    if (port != NULL) {
        io_fd = open(port, O_RDWR | O_NOCTTY | O_NONBLOCK);
        if (io_fd < 0) {
            fprintf(stderr, PROG ": cannot open port %s: %s\n", port, strerror(errno));
            return 1;
        }
        if (isatty(io_fd)) {
            struct termios t;
            make_raw(io_fd);
            set_char_format(io_fd, bytesize, parity, stopbits);
            if (baud(baudrate) != B0 && tcgetattr(io_fd, &t) == 0) {
                (void)cfsetispeed(&t, baud(baudrate));
                (void)cfsetospeed(&t, baud(baudrate));
                (void)tcsetattr(io_fd, TCSANOW, &t);
            }
        }
        path = port;
    } else {
        io_fd = posix_openpt(O_RDWR | O_NOCTTY);
        if (io_fd < 0 || grantpt(io_fd) != 0 || unlockpt(io_fd) != 0 || ptsname(io_fd) == NULL) {
            fail(1, "cannot create a pseudo-terminal", strerror(errno));
        }
        path = ptsname(io_fd);
        /* keep our own slave fd open: a client closing and reopening the path then never hangs
         * up the master (no EIO) */
        slave_fd = open(path, O_RDWR | O_NOCTTY);
        if (slave_fd < 0) {
            fail(1, "cannot open the pseudo-terminal", strerror(errno));
        }
        make_raw(slave_fd);
        make_raw(io_fd);
        (void)fcntl(io_fd, F_SETFL, fcntl(io_fd, F_GETFL) | O_NONBLOCK);
    }

    if (flash_dir != NULL) {
        uint16_t check[IDL_REG_COUNT];
        uint16_t generation;
        char ident[IDL_MAX_DEVICE_ID_LEN];
        char files[4096 + 8];
        char text[DEVICE_ID_FILE_BYTES + 1];
        long n;
        /* every check before anything is written: a refused flash exits with nothing changed */
        check_files_dir(); /* first, as the simulator's ConfigFlash */
        claim_map(0);
        if (!idl_port_flash_load(check, &generation)) {
            generation = 0; /* none saved: judged all the same (a bad file exits inside) */
        }
        (void)read_boots();
        n = read_flash_file("device_id", text, sizeof text);
        while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) {
            n--;
        }
        if (n >= 0 && !valid_id(text, (size_t)n)) {
            fail(1, "flash directory: device_id does not hold a device id "
                    "(1-64 characters of [A-Za-z0-9_.:-])", NULL);
        }
        claim_map(1);
        remove_stale_temporaries(flash_dir, 0);
        snprintf(files, sizeof files, "%s/files", flash_dir);
        remove_stale_temporaries(files, 1);
        if (idl_port_unique_id(ident, sizeof ident) == 0u) { /* created once */
            fail(1, "flash directory: no device id", NULL);
        }
        seed_state ^= 0xA0761D6478BD642Full * count_boot(); /* new epochs on every start */
    }
    idl_device_init(&device);
    device.regs.trigger_ms = (uint32_t)(trigger_s * 1000.0 + 0.5);
    if (effects_fd >= 0) {
        effects_boot(device.session.epoch, idl_port_millis(), device.regs.trigger_ms);
    }
    printf("%s\n", path);
    fflush(stdout);

    if (rtu_mode) {
        idl_rtu_init(&rtu, &device.regs, (uint8_t)unit);
        serve_rtu(baudrate, IDL_RTU_CHAR_BITS((unsigned)bytesize, parity != 'N' ? 1u : 0u,
                                              (unsigned)stopbits));
    }
    while (!stop_requested) {
        fd_set r;
        struct timeval tv = { 0, TICK_MS * 1000 };
        int ready;
        ready = select(watch(&r), &r, NULL, NULL, &tv);
        if (ready < 0) {
            if (errno == EINTR) {
                continue;
            }
            fail(1, "the port failed while serving", strerror(errno));
        }
        if (ready > 0) {
            poll_control(&r, &device.regs);
        }
        if (ready > 0 && FD_ISSET(io_fd, &r)) {
            uint8_t buf[4096];
            ssize_t n = read(io_fd, buf, sizeof buf);
            if (n > 0) {
                idl_device_rx(&device, buf, (size_t)n);
                continue;
            }
            if (n < 0 && errno != EAGAIN && errno != EINTR && errno != EIO) {
                fail(1, "the port failed while serving", strerror(errno));
            }
            if (n == 0 || errno == EIO) {
                struct timespec pause = { 0, TICK_MS * 1000000L };
                nanosleep(&pause, NULL); /* no reader on the other side right now */
            }
        }
        idl_device_poll(&device);
    }
    idl_device_stop(&device); /* a batch in progress: CAN, its temporary deleted */
    if (print_stats && rtu_mode) {
        fprintf(stderr, PROG ": stopped: answered=%lu broadcasts=%lu other_unit=%lu bad_crc=%lu "
                        "dropped=%lu other_answer=%lu flash_writes=%lu\n",
                (unsigned long)rtu.counters[IDL_RTU_ANSWERED],
                (unsigned long)rtu.counters[IDL_RTU_BROADCASTS],
                (unsigned long)rtu.counters[IDL_RTU_OTHER_UNIT],
                (unsigned long)rtu.counters[IDL_RTU_BAD_CRC],
                (unsigned long)rtu.counters[IDL_RTU_DROPPED],
                (unsigned long)rtu.counters[IDL_RTU_OTHER_ANSWER], flash_writes);
    } else if (print_stats) {
        const uint32_t *c = device.session.counters;
        fprintf(stderr, PROG ": stopped: executed=%lu replayed=%lu conflict=%lu evicted=%lu "
                        "too_old=%lu epoch_mismatch=%lu hello=%lu decode_errors=%lu "
                        "flash_writes=%lu\n",
                (unsigned long)c[IDL_DISP_EXECUTED], (unsigned long)c[IDL_DISP_REPLAYED],
                (unsigned long)c[IDL_DISP_CONFLICT], (unsigned long)c[IDL_DISP_EVICTED],
                (unsigned long)c[IDL_DISP_TOO_OLD], (unsigned long)c[IDL_DISP_EPOCH_MISMATCH],
                (unsigned long)c[IDL_DISP_HELLO], (unsigned long)c[IDL_DISP_DECODE_ERRORS],
                flash_writes);
    }
    if (slave_fd >= 0) {
        close(slave_fd);
    }
    close(io_fd);
    return 0;
}
