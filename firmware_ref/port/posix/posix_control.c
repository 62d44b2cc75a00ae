/* The control FIFO of the posix device: see posix_control.h. */
#define _DEFAULT_SOURCE
#include "posix_control.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint16_t external[IDL_REG_COUNT];
static char line[IDL_CONTROL_MAX_LINE + 1u];
static size_t used;
static int skipping; /* the rest of an overlong line is being dropped */
static unsigned long refused_total;

int idl_posix_control_open(const char *path)
{
    struct stat st;
    int fd;
    if (mkfifo(path, 0600) != 0 && errno != EEXIST) {
        return -1;
    }
    if (lstat(path, &st) != 0) {
        return -1;
    }
    if (!S_ISFIFO(st.st_mode)) {
        errno = EEXIST;
        return -1;
    }
    fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        /* our own writer: a writer that comes and goes never leaves us reading end-of-file */
        (void)open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    }
    return fd;
}

static int number(const char *text, uint16_t *out)
{
    char *end;
    unsigned long v;
    if (text == NULL || *text == '\0' || *text == '-' || *text == '+') {
        return 0;
    }
    errno = 0;
    v = (text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) ? strtoul(text + 2, &end, 16)
                                                                 : strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || v > 0xFFFFul
        || ((text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) && text[2] == '\0')) {
        return 0;
    }
    *out = (uint16_t)v;
    return 1;
}

static int refuse(const char *text, const char *why)
{
    fprintf(stderr, "idemlink-device: control: '%.40s': %s\n", text, why);
    refused_total++;
    return 0;
}

/* One line (NUL-terminated, no newline): 1 applied or ignored, 0 refused. */
static int apply_line(char *text, idl_regs_t *regs, uint32_t now)
{
    char copy[IDL_CONTROL_MAX_LINE + 1u];
    char *word;
    char *a;
    char *v;
    char *rest;
    char *save = NULL;
    uint16_t address;
    uint16_t value;
    int32_t at;
    memcpy(copy, text, strlen(text) + 1u);
    word = strtok_r(copy, " \t\r", &save);
    if (word == NULL || word[0] == '#') {
        return 1;
    }
    a = strtok_r(NULL, " \t\r", &save);
    v = strtok_r(NULL, " \t\r", &save);
    rest = strtok_r(NULL, " \t\r", &save);
    if (strcmp(word, "input") != 0 && strcmp(word, "condition") != 0) {
        return refuse(text, "say 'input ADDRESS VALUE' or 'condition ADDRESS BITS'");
    }
    if (a == NULL || v == NULL || rest != NULL) {
        return refuse(text, "takes an address and a value");
    }
    if (!number(a, &address)) {
        return refuse(text, "the address is not a number 0..65535");
    }
    if (!number(v, &value)) {
        return refuse(text, "the value is not a number 0..65535");
    }
    at = idl_regs_index(address);
    if (strcmp(word, "input") == 0) {
        if (at < 0 || IDL_REGMAP[at].kind != (uint8_t)IDL_REG_KIND_INPUT) {
            return refuse(text, "not an INPUT register");
        }
        if (!idl_regs_set_input(regs, address, value, now)) {
            return refuse(text, "not an INPUT register");
        }
    } else {
        if (at < 0 || IDL_REGMAP[at].kind != (uint8_t)IDL_REG_KIND_FAULT) {
            return refuse(text, "not a FAULT register");
        }
        if ((value & (uint16_t)~IDL_REGMAP[at].fault_mask) != 0u) {
            return refuse(text, "bits that are not declared fault bits");
        }
        external[at] = value;
        idl_regs_tick(regs, now); /* a condition that holds latches now */
    }
    return 1;
}

unsigned idl_posix_control_poll(int fd, idl_regs_t *regs, uint32_t now)
{
    char buf[512];
    unsigned refused = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        ssize_t i;
        for (i = 0; i < n; i++) {
            char c = buf[i];
            if (c == '\n') {
                if (skipping) {
                    skipping = 0;
                    refuse("(too long)", "line longer than 128 bytes");
                    refused++;
                } else {
                    line[used] = '\0';
                    refused += apply_line(line, regs, now) ? 0u : 1u;
                }
                used = 0;
            } else if (!skipping) {
                if (used == IDL_CONTROL_MAX_LINE) {
                    skipping = 1; /* bounded: the rest of this line is dropped */
                    used = 0;
                } else {
                    line[used++] = c;
                }
            }
        }
    }
    return refused;
}

uint16_t idl_posix_control_conditions(uint16_t address)
{
    int32_t at = idl_regs_index(address);
    return at < 0 ? 0u : external[at];
}

unsigned long idl_posix_control_refused(void) { return refused_total; }
