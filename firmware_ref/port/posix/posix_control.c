/* The control FIFO of the posix device: see posix_control.h. The lines' rule is
 * port/control_lines.c, shared with the QEMU devices. */
#define _DEFAULT_SOURCE
#include "posix_control.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../control_lines.h"

static idl_control_t control;
static int started;

static void say(const char *text, const char *why)
{
    size_t shown = idl_control_shown(text);
    fprintf(stderr, "idemlink-device: control: '%.*s%s': %s\n", (int)shown, text,
            text[shown] != '\0' ? " ..." : "", why);
}

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
        idl_control_init(&control, say);
        started = 1;
    }
    return fd;
}

unsigned idl_posix_control_poll(int fd, idl_regs_t *regs, uint32_t now)
{
    char buf[512];
    unsigned refused = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        refused += idl_control_feed(&control, buf, (size_t)n, regs, now);
    }
    return refused;
}

uint16_t idl_posix_control_conditions(uint16_t address)
{
    return started ? idl_control_conditions(&control, address) : 0u;
}

unsigned long idl_posix_control_refused(void) { return control.refused; }
