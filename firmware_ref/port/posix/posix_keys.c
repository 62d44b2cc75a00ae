/* The posix device's keys: see posix_keys.h. The keys stay in this file's static memory (the
 * board's flash, for this port); the core reads them through idl_port_auth_key and never copies
 * or prints them; nothing here prints a byte of them. */
#include "posix_keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idl_port.h"
#include "posix_common.h"

#define KEYS_MAX 4u
#define KEY_FILE_MAX 4096u

#if IDL_AUTH
static uint8_t keys[KEYS_MAX][IDL_KEY_LEN];
static unsigned nkeys;

const uint8_t *idl_port_auth_key(unsigned i) { return i < nkeys ? keys[i] : NULL; }

/* the device's HELLO nonces: the OS's randomness (never --seed's: a nonce must not repeat) */
void idl_port_random(uint8_t *buf, size_t n)
{
    size_t done = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && done < n) {
        ssize_t k = read(fd, buf + done, n - done);
        if (k <= 0 && !(k < 0 && errno == EINTR)) {
            break;
        }
        done += k > 0 ? (size_t)k : 0u;
    }
    if (fd >= 0) {
        close(fd);
    }
    if (done < n) {
        idl_posix_fail(1, "cannot read /dev/urandom", strerror(errno));
    }
}
#endif

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void refuse(const char *path, const char *why)
{
    fprintf(stderr, PROG ": --key-file %s: %s; refused\n", path, why);
    exit(1);
}

void idl_posix_keys_load(const char *path)
{
    static char text[KEY_FILE_MAX + 1u];
    struct stat st;
    size_t len = 0;
    size_t i = 0;
    unsigned line = 0;
    int fd;
    if (path == NULL) {
        return;
    }
#if !IDL_AUTH
    refuse(path, "built without IDL_AUTH=1 (make device builds it in)");
#endif
    /* without blocking: a FIFO (or a device) is refused below, not waited on; a regular
     * file reads the same either way */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        refuse(path, strerror(errno));
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        refuse(path, "not a regular file");
    }
    if ((st.st_mode & 077) != 0) {
        char why[160];
        snprintf(why, sizeof why, "mode %04o lets group or others read or change it; a key file "
                 "must be 0600 or stricter (chmod 600 %s)", (unsigned)(st.st_mode & 07777), path);
        refuse(path, why);
    }
    if (st.st_size > (off_t)KEY_FILE_MAX) {
        refuse(path, "larger than 4096 bytes");
    }
    for (;;) {
        ssize_t k = read(fd, text + len, KEY_FILE_MAX + 1u - len);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k < 0) {
            refuse(path, strerror(errno));
        }
        if (k == 0 || (len += (size_t)k) > KEY_FILE_MAX) {
            break;
        }
    }
    close(fd);
    if (len > KEY_FILE_MAX) {
        refuse(path, "larger than 4096 bytes");
    }
    /* one key a line: 64 hex digits, blanks around and between bytes, '#' comments (the host's
     * bytes.fromhex per line, protocol/key_file.py) */
    while (i < len) {
        uint8_t key[32];
        size_t digits = 0;
        line++;
        for (; i < len && text[i] != '\n'; i++) {
            char c = text[i];
            if (c == '#') {
                while (i < len && text[i] != '\n') {
                    i++;
                }
                break;
            }
            if (c == ' ' || c == '\t' || c == '\r') {
                if (digits % 2u != 0u) { /* a blank inside a byte */
                    break;
                }
                continue;
            }
            if (hexval(c) < 0 || digits >= 64u) {
                char why[80];
                snprintf(why, sizeof why, "line %u is not one key of 64 hex digits", line);
                refuse(path, why);
            }
            if (digits % 2u == 0u) {
                key[digits / 2u] = (uint8_t)(hexval(c) << 4);
            } else {
                key[digits / 2u] = (uint8_t)(key[digits / 2u] | hexval(c));
            }
            digits++;
        }
        i++; /* the newline */
        if (digits == 0u) {
            continue;
        }
        if (digits != 64u) {
            char why[80];
            snprintf(why, sizeof why, "line %u is not one key of 64 hex digits", line);
            refuse(path, why);
        }
#if IDL_AUTH
        if (nkeys == KEYS_MAX) {
            refuse(path, "more than 4 keys");
        }
        memcpy(keys[nkeys++], key, sizeof key);
#endif
        memset(key, 0, sizeof key);
    }
#if IDL_AUTH
    if (nkeys == 0u) {
        refuse(path, "no key in it");
    }
#endif
    memset(text, 0, sizeof text);
}
