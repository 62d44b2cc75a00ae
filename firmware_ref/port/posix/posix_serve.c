/* The posix device's serving end: see posix_serve.h. */
#include "posix_serve.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "posix_common.h"
#include "posix_control.h"

#define TICK_MS 20

static volatile sig_atomic_t stop_requested;
static int io_fd = -1;
static int slave_fd = -1;

static void on_signal(int signum)
{
    (void)signum;
    stop_requested = 1;
}

void idl_posix_serve_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa); /* no SA_RESTART: a signal wakes the select and the loop ends */
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- bytes out ----------------------------------------------------------------------------- */

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

/* ---- the port -------------------------------------------------------------------------------- */

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

const char *idl_posix_port_open(const idl_posix_args_t *a)
{
    const char *path;
    if (a->port != NULL) {
        io_fd = open(a->port, O_RDWR | O_NOCTTY | O_NONBLOCK);
        if (io_fd < 0) {
            fprintf(stderr, PROG ": cannot open port %s: %s\n", a->port, strerror(errno));
            exit(1);
        }
        if (isatty(io_fd)) {
            struct termios t;
            make_raw(io_fd);
            set_char_format(io_fd, a->bytesize, a->parity, a->stopbits);
            if (baud(a->baudrate) != B0 && tcgetattr(io_fd, &t) == 0) {
                (void)cfsetispeed(&t, baud(a->baudrate));
                (void)cfsetospeed(&t, baud(a->baudrate));
                (void)tcsetattr(io_fd, TCSANOW, &t);
            }
        }
        return a->port;
    }
    io_fd = posix_openpt(O_RDWR | O_NOCTTY);
    if (io_fd < 0 || grantpt(io_fd) != 0 || unlockpt(io_fd) != 0 || ptsname(io_fd) == NULL) {
        idl_posix_fail(1, "cannot create a pseudo-terminal", strerror(errno));
    }
    path = ptsname(io_fd);
    /* keep our own slave fd open: a client closing and reopening the path then never hangs
     * up the master (no EIO) */
    slave_fd = open(path, O_RDWR | O_NOCTTY);
    if (slave_fd < 0) {
        idl_posix_fail(1, "cannot open the pseudo-terminal", strerror(errno));
    }
    make_raw(slave_fd);
    make_raw(io_fd);
    (void)fcntl(io_fd, F_SETFL, fcntl(io_fd, F_GETFL) | O_NONBLOCK);
    return path;
}

void idl_posix_port_close(void)
{
    if (slave_fd >= 0) {
        close(slave_fd);
    }
    close(io_fd);
}

/* ---- the serve loop ------------------------------------------------------------------------ */

/* The face being served: frames (rtu NULL) or Modbus RTU, whose frame ends at a pause of t3.5,
 * seen between two reads (their distance less the second read's transmission time) or when the
 * line stays silent after the last byte. */
typedef struct {
    idl_device_t *device;
    idl_rtu_t *rtu;
    unsigned long long char_us;
    unsigned long long t35_us;
    unsigned long long last_rx; /* when the last bytes were read (us) */
    int have_rx;
} face_t;

static unsigned long long micros(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000ull;
}

static void rtu_pause(idl_rtu_t *rtu)
{
    size_t out = idl_rtu_pause(rtu, idl_port_millis());
    if (out != 0u) {
        idl_port_write(rtu->out, out);
    }
}

/* RTU: a frame under way (bytes held or hunting for the next frame's start) */
static int rtu_pending(const face_t *f)
{
    return f->rtu != NULL && (f->rtu->len != 0u || f->rtu->hunting);
}

/* Bytes read at `now`. */
static void face_rx(face_t *f, const uint8_t *buf, size_t n, unsigned long long now)
{
    size_t i;
    if (f->rtu == NULL) {
        idl_device_rx(f->device, buf, n);
        return;
    }
    if (f->have_rx && now - f->last_rx >= f->t35_us + (unsigned long long)n * f->char_us) {
        rtu_pause(f->rtu);
    }
    f->last_rx = now;
    f->have_rx = 1;
    idl_regs_tick(&f->device->regs, idl_port_millis());
    for (i = 0; i < n; i++) {
        size_t out = idl_rtu_feed(f->rtu, buf[i], idl_port_millis());
        if (out != 0u) {
            idl_port_write(f->rtu->out, out);
        }
    }
}

/* A turn without bytes: RTU's silence ends a frame; the device's idle work. */
static void face_idle(face_t *f, unsigned long long now)
{
    if (rtu_pending(f) && f->have_rx && now - f->last_rx >= f->t35_us) {
        rtu_pause(f->rtu);
    }
    idl_device_poll(f->device);
}

/* The select set: the port, and the control FIFO when there is one; the highest fd + 1. */
static int watch(fd_set *r, int control_fd)
{
    FD_ZERO(r);
    FD_SET(io_fd, r);
    if (control_fd >= 0) {
        FD_SET(control_fd, r);
    }
    return (control_fd > io_fd ? control_fd : io_fd) + 1;
}

void idl_posix_serve(idl_device_t *device, idl_rtu_t *rtu, const idl_posix_args_t *a,
                     int control_fd)
{
    face_t f;
    uint8_t buf[4096];
    /* RTU reads little at a time: the pause between two reads is judged per read */
    const size_t cap = rtu != NULL ? 512u : sizeof buf;
    memset(&f, 0, sizeof f);
    f.device = device;
    f.rtu = rtu;
    if (rtu != NULL) {
        unsigned bits = IDL_RTU_CHAR_BITS((unsigned)a->bytesize, a->parity != 'N' ? 1u : 0u,
                                          (unsigned)a->stopbits);
        f.char_us = idl_rtu_char_us((uint32_t)a->baudrate, bits);
        f.t35_us = idl_rtu_t35_us((uint32_t)a->baudrate, bits);
    }
    while (!stop_requested) {
        fd_set r;
        struct timeval tv = { 0, rtu_pending(&f) ? 2000 : TICK_MS * 1000 };
        unsigned long long now;
        int ready = select(watch(&r, control_fd), &r, NULL, NULL, &tv);
        if (ready < 0) {
            if (errno == EINTR) {
                continue;
            }
            idl_posix_fail(1, "the port failed while serving", strerror(errno));
        }
        if (ready > 0 && control_fd >= 0 && FD_ISSET(control_fd, &r)) {
            (void)idl_posix_control_poll(control_fd, &device->regs, idl_port_millis());
        }
        now = micros();
        if (ready > 0 && FD_ISSET(io_fd, &r)) {
            ssize_t n = read(io_fd, buf, cap);
            if (n > 0) {
                face_rx(&f, buf, (size_t)n, now);
                continue;
            }
            if (n < 0 && errno != EAGAIN && errno != EINTR && errno != EIO) {
                idl_posix_fail(1, "the port failed while serving", strerror(errno));
            }
            if (rtu == NULL && (n == 0 || errno == EIO)) {
                struct timespec pause = { 0, TICK_MS * 1000000L };
                nanosleep(&pause, NULL); /* no reader on the other side right now */
            }
        }
        face_idle(&f, now);
    }
}
