/* The posix device's flash directory: see posix_flash.h. */
#define _DEFAULT_SOURCE /* flock(2): the lock `idemlink sim` takes, so the two exclude each other */
#include "posix_flash.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idl_port.h"
#include "posix_common.h"
#include "posix_files.h"

/* the largest flash files read, as device_sim/flash.py: MAX_FILE_BYTES, DEVICE_ID_FILE_BYTES */
#define CONFIG_FILE_BYTES (1u << 20)
#define DEVICE_ID_FILE_BYTES 128u

static const char *flash_dir;
static const char *given_id;
static unsigned long long (*random64_fn)(void);
/* configuration saves since start (--stats): the erase/program cycles an MCU's flash would spend */
static unsigned long flash_writes;

void idl_posix_flash_use(const char *dir, const char *id, unsigned long long (*random64)(void))
{
    flash_dir = dir;
    given_id = id;
    random64_fn = random64;
}

unsigned long idl_posix_flash_writes(void) { return flash_writes; }

/* ---- the device id ----------------------------------------------------------------------- */

int idl_posix_valid_id(const char *s, size_t n)
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
        idl_posix_fail(1, "flash directory", strerror(errno));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            fprintf(stderr, PROG ": flash directory %s is in use by another device: one device "
                            "per flash directory; nothing changed\n", flash_dir);
            exit(1);
        }
        idl_posix_fail(1, "flash directory: cannot lock it", strerror(errno));
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
            idl_posix_fail(1, "flash directory: cannot write the map record", strerror(errno));
        }
        return;
    }
    if (sscanf(text, "%256s %256s", name, hash) != 2) {
        idl_posix_fail(1, "flash directory: map: not a map record; refused", NULL);
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
        idl_posix_fail(1, "flash directory: boots: not a boot counter; refused", NULL);
    }
    for (i = 0; i < digits; i++) {
        unsigned d = (unsigned)(text[i] - '0');
        if (boots > (MAX_BOOTS - d) / 10u) {
            idl_posix_fail(1, "flash directory: boots: boot counter above "
                              "18446744073709551614; refused", NULL);
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
        idl_posix_fail(1, "flash directory: cannot write the boot counter", strerror(errno));
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
            if (!idl_posix_valid_id(text, n)) {
                idl_posix_fail(1, "flash directory: device_id does not hold a device id "
                        "(1-64 characters of [A-Za-z0-9_.:-])", NULL);
            }
        } else {
            n = (size_t)snprintf(text, sizeof text, "sim-%016llx", random64_fn());
            text[n] = '\n';
            if (replace_file("device_id", text, n + 1u) != 0) {
                idl_posix_fail(1, "flash directory: cannot create device_id", strerror(errno));
            }
        }
    } else {
        n = (size_t)snprintf(text, sizeof text, "sim-%016llx", random64_fn());
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

/* One JSON value at p (RFC 8259, plus the NaN / Infinity / -Infinity Python's json.loads takes):
 * the end of it, or NULL. Nesting deeper than 64 is refused (a configuration is two deep). */
static const char *json_value(const char *p, unsigned depth);

static const char *json_string(const char *p) /* at the opening quote */
{
    for (p++; *p != '"'; p++) {
        if ((unsigned char)*p < 0x20u) { /* a control character, or the end of the text */
            return NULL;
        }
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                int k;
                for (k = 0; k < 4; k++) {
                    char h = *++p;
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) {
                        return NULL;
                    }
                }
            } else if (*p == '\0' || strchr("\"\\/bfnrt", *p) == NULL) {
                return NULL;
            }
        }
    }
    return p + 1;
}

static const char *json_digits(const char *p)
{
    if (*p < '0' || *p > '9') {
        return NULL;
    }
    while (*p >= '0' && *p <= '9') {
        p++;
    }
    return p;
}

static const char *json_word(const char *p, const char *word)
{
    size_t n = strlen(word);
    return strncmp(p, word, n) == 0 ? p + n : NULL;
}

static const char *json_value(const char *p, unsigned depth)
{
    p = skip_ws(p);
    if (*p == '"') {
        return json_string(p);
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        if (depth >= 64u) {
            return NULL;
        }
        p = skip_ws(p + 1);
        if (*p == close) {
            return p + 1;
        }
        for (;;) {
            if (close == '}') {
                if (*p != '"' || (p = json_string(p)) == NULL || (p = expect(p, ':')) == NULL) {
                    return NULL;
                }
            }
            if ((p = json_value(p, depth + 1u)) == NULL) {
                return NULL;
            }
            p = skip_ws(p);
            if (*p == close) {
                return p + 1;
            }
            if (*p != ',') {
                return NULL;
            }
            p = skip_ws(p + 1);
        }
    }
    if (*p == 't' || *p == 'f' || *p == 'n' || *p == 'N' || *p == 'I') {
        const char *e = json_word(p, "true");
        e = e != NULL ? e : json_word(p, "false");
        e = e != NULL ? e : json_word(p, "null");
        e = e != NULL ? e : json_word(p, "NaN");
        return e != NULL ? e : json_word(p, "Infinity");
    }
    if (*p == '-') {
        p++;
        if (*p == 'I') {
            return json_word(p, "Infinity");
        }
    }
    if (*p == '0') {
        p++;
    } else if ((p = json_digits(p)) == NULL) {
        return NULL;
    }
    if (*p == '.' && (p = json_digits(p + 1)) == NULL) {
        return NULL;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') {
            p++;
        }
        p = json_digits(p);
    }
    return p;
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
        idl_posix_fail(1, "flash directory: config.json: not UTF-8 text", NULL);
    }
    p = json_value(text, 0u); /* the whole text one JSON value: a cut or a tail is refused */
    if (p == NULL || *skip_ws(p) != '\0') {
        idl_posix_fail(1, "flash directory: config.json: not JSON", NULL);
    }
    list = strstr(text, "\"holdings\"");
    if (list == NULL || (list = expect(list + 10, ':')) == NULL
        || (list = expect(list, '[')) == NULL) {
        idl_posix_fail(1, "flash directory: config.json: need an object with a holdings list",
                       NULL);
    }
    p = list;
    while ((more = next_pair(&p, &a, &v)) == 1) {
    }
    if (more < 0) {
        idl_posix_fail(1, "flash directory: config.json: holdings must be [address, value] "
                          "pairs of integers 0..65535", NULL);
    }
    p = strstr(text, "\"generation\"");
    if (p == NULL || (p = expect(p + 12, ':')) == NULL || (p = number(p, &gen)) == NULL
        || gen > 0xFFFF || (*skip_ws(p) != ',' && *skip_ws(p) != '}')) {
        idl_posix_fail(1, "flash directory: config.json: generation is not an integer 0..65535",
                       NULL);
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
        idl_posix_fail(1, "flash directory: config.json: snapshot holds other registers than "
                          "this map's HOLDINGs", NULL);
    }
    for (p = list; next_pair(&p, &a, &v) == 1;) {
        int32_t at = idl_regs_index((uint16_t)a);
        /* a typed HOLDING's rows hold its limits' keys, not raw words: its whole value is
         * judged by the core's own check at start (refuse_typed_outside) */
        if ((IDL_REGMAP[at].flags & (uint8_t)~IDL_REG_FLAG_PERSIST) == 0u
            && (IDL_REGMAP[at].min > v || IDL_REGMAP[at].max < v)) {
            fprintf(stderr, CONFIG_REFUSED "address %ld: %ld outside %u..%u\n", a, v,
                    (unsigned)IDL_REGMAP[at].min, (unsigned)IDL_REGMAP[at].max);
            exit(1);
        }
        values[at] = (uint16_t)v;
    }
    *generation = (uint16_t)gen;
    return true;
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

/* ---- start ----------------------------------------------------------------------------------- */

void idl_posix_flash_lock(void)
{
    if (flash_dir == NULL) {
        return;
    }
    if (make_dirs(flash_dir) != 0) {
        idl_posix_fail(1, "flash directory", strerror(errno));
    }
    lock_flash_dir();
}

static long bus_address; /* --address, or the directory's `address`; 0: none */

void idl_posix_flash_address(long given) { bus_address = given; }

#if IDL_BUS
uint8_t idl_port_bus_address(void) { return (uint8_t)bus_address; }
#endif

/* The kept address (device_sim/flash.py ConfigFlash.address): digits with blanks around, 1..247;
 * anything else refused. Nothing to read when one is given or the file is absent. */
static void read_address(void)
{
    char text[DEVICE_ID_FILE_BYTES + 1];
    long n = read_flash_file("address", text, sizeof text);
    long k = 0;
    long a = 0;
    if (n < 0 || bus_address != 0) {
        return;
    }
    while (k < n && is_blank(text[k])) {
        k++;
    }
    while (k < n && text[k] >= '0' && text[k] <= '9' && a <= 247) {
        a = a * 10 + (text[k++] - '0');
    }
    while (k < n && is_blank(text[k])) {
        k++;
    }
    if (k != n || a < 1 || a > 247) {
        idl_posix_fail(1, "flash directory: address does not hold a device address (1..247); "
                          "refused", NULL);
    }
    bus_address = a;
}

#if defined(IDL_REGMAP_TYPED) && IDL_REGMAP_TYPED
/* A typed HOLDING saved outside its limits (config.json edited by hand, another build's map): the
 * core's boot restore would refuse the whole configuration and boot with the defaults, silently.
 * Judged here by that same check (idl_regs_restore), one value at a time among the defaults so
 * the refusal names it, as the simulator's does: one line and exit 1. */
static void refuse_typed_outside(const uint16_t *saved)
{
    static idl_regs_t scratch; /* start only: not on the stack */
    uint16_t one[IDL_REG_COUNT];
    uint32_t i;
    uint32_t j;
    for (i = 0; i < IDL_REG_COUNT; i++) {
        one[i] = IDL_REGMAP[i].def;
    }
    for (i = 0; i < IDL_REG_COUNT; i++) {
        unsigned f = IDL_REGMAP[i].flags;
        uint32_t n = 1u << ((f >> IDL_REG_FLAG_WORDS_SHIFT) & 3u);
        if (IDL_REGMAP[i].kind != (uint8_t)IDL_REG_KIND_HOLDING
            || (f & (unsigned)~IDL_REG_FLAG_PERSIST) == 0u /* a u16: checked on load */
            || ((f >> IDL_REG_FLAG_INDEX_SHIFT) & 3u) != 0u || i + n > IDL_REG_COUNT) {
            continue;
        }
        for (j = 0; j < n; j++) {
            one[i + j] = saved[i + j];
        }
        idl_regs_init(&scratch, IDL_TRIGGER_MS, NULL, NULL, NULL, 0u);
        if (!idl_regs_restore(&scratch, one, 0u, 0u)) {
            fprintf(stderr, CONFIG_REFUSED "address %u: [", (unsigned)IDL_REGMAP[i].address);
            for (j = 0; j < n; j++) {
                fprintf(stderr, "%s%u", j != 0u ? ", " : "", (unsigned)saved[i + j]);
            }
            fprintf(stderr, "] outside its min..max (a typed value, judged whole)\n");
            exit(1);
        }
        for (j = 0; j < n; j++) {
            one[i + j] = IDL_REGMAP[i + j].def;
        }
    }
}
#endif

unsigned long long idl_posix_flash_start(void)
{
    uint16_t check[IDL_REG_COUNT];
    uint16_t generation;
    char ident[IDL_MAX_DEVICE_ID_LEN];
    char files[4096 + 8];
    char text[DEVICE_ID_FILE_BYTES + 1];
    long n;
    if (flash_dir == NULL) {
        return 0;
    }
    /* every check before anything is written: a refused flash exits with nothing changed */
    check_files_dir(); /* first, as the simulator's ConfigFlash */
    claim_map(0);
    if (!idl_port_flash_load(check, &generation)) {
        generation = 0; /* none saved: judged all the same (a bad file exits inside) */
    }
#if defined(IDL_REGMAP_TYPED) && IDL_REGMAP_TYPED
    else {
        refuse_typed_outside(check);
    }
#endif
    (void)read_boots();
    n = read_flash_file("device_id", text, sizeof text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) {
        n--;
    }
    if (n >= 0 && !idl_posix_valid_id(text, (size_t)n)) {
        idl_posix_fail(1, "flash directory: device_id does not hold a device id "
                          "(1-64 characters of [A-Za-z0-9_.:-])", NULL);
    }
    read_address();
    claim_map(1);
    if (bus_address != 0) {
        char line[8];
        int len = snprintf(line, sizeof line, "%ld\n", bus_address);
        if (replace_file("address", line, (size_t)len) != 0) {
            idl_posix_fail(1, "flash directory: cannot keep the address", strerror(errno));
        }
    }
    remove_stale_temporaries(flash_dir, 0);
    snprintf(files, sizeof files, "%s/files", flash_dir);
    remove_stale_temporaries(files, 1);
    if (idl_port_unique_id(ident, sizeof ident) == 0u) { /* created once */
        idl_posix_fail(1, "flash directory: no device id", NULL);
    }
    return count_boot();
}
