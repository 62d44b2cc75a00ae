/* The QEMU ports' host world through semihosting: see qemu_host.h. */
#include "qemu_host.h"

#include <string.h>

#include "control_lines.h"
#include "idl_auth.h"

#define SYS_OPEN 0x01
#define SYS_CLOSE 0x02
#define SYS_WRITE 0x05
#define SYS_READ 0x06
#define SYS_SEEK 0x0A
#define SYS_FLEN 0x0C
#define SYS_TIME 0x11
#define SYS_GET_CMDLINE 0x15
#define SYS_EXIT 0x18

int idl_sh_call(int op, void *arg)
{
    register int r0 __asm__("r0") = op;
    register void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

int idl_sh_open(const char *path, int mode)
{
    struct { const char *p; int mode; int len; } a = { path, mode, (int)strlen(path) };
    return idl_sh_call(SYS_OPEN, &a);
}

void idl_sh_close(int h)
{
    int a = h;
    (void)idl_sh_call(SYS_CLOSE, &a);
}

bool idl_sh_write(int h, const void *buf, size_t n)
{
    struct { int h; const void *buf; int len; } a = { h, buf, (int)n };
    return idl_sh_call(SYS_WRITE, &a) == 0;
}

bool idl_sh_read(int h, void *buf, size_t n)
{
    struct { int h; void *buf; int len; } a = { h, buf, (int)n };
    return idl_sh_call(SYS_READ, &a) == 0;
}

bool idl_sh_seek(int h, uint32_t pos)
{
    struct { int h; int pos; } a = { h, (int)pos };
    return idl_sh_call(SYS_SEEK, &a) == 0;
}

int idl_sh_flen(int h)
{
    int a = h;
    return idl_sh_call(SYS_FLEN, &a);
}

int idl_sh_open_append(const char *path)
{
    int h = idl_sh_open(path, IDL_SH_MODE_A);
    int len;
    if (h < 0) {
        return h;
    }
    len = idl_sh_flen(h);
    if (len < 0 || !idl_sh_seek(h, (uint32_t)len)) {
        idl_sh_close(h);
        return -1;
    }
    return h;
}

uint32_t idl_sh_time(void) { return (uint32_t)idl_sh_call(SYS_TIME, NULL); }

void idl_sh_exit(bool ok)
{
    /* AArch32 semihosting: the reason; QEMU exits 0 for ApplicationExit, 1 otherwise */
    (void)idl_sh_call(SYS_EXIT, (void *)(uintptr_t)(ok ? 0x20026u : 0x20023u));
    for (;;) {
    }
}

/* ---- the command line: words `key=value` split at spaces ----------------------------------- */

static char cmdline[512];
static char *words[12];
static size_t word_count;

void idl_sh_read_cmdline(void)
{
    struct { char *buf; int len; } block = { cmdline, (int)sizeof cmdline - 1 };
    char *p = cmdline;
    if (idl_sh_call(SYS_GET_CMDLINE, &block) != 0) {
        cmdline[0] = '\0';
    }
    cmdline[sizeof cmdline - 1u] = '\0';
    while (*p != '\0' && word_count < sizeof words / sizeof words[0]) {
        words[word_count++] = p;
        p = strchr(p, ' ');
        if (p == NULL) {
            break;
        }
        *p++ = '\0';
    }
}

const char *idl_sh_arg(const char *key)
{
    size_t k = strlen(key);
    size_t i;
    for (i = 0; i < word_count; i++) {
        if (strncmp(words[i], key, k) == 0 && words[i][k] == '=') {
            return words[i] + k + 1;
        }
    }
    return NULL;
}

/* ---- the control lines: the file the wrapper appends to, read from where we left off ---------- */

static idl_control_t control;
static int control_handle = -1;
static uint32_t control_read; /* bytes of the file applied so far */

static void say(const char *text, const char *why)
{
    static const char tt[] = ":tt";
    char msg[IDL_CONTROL_MAX_LINE + 96u];
    size_t n = 0;
    size_t k;
    int h = idl_sh_open(tt, IDL_SH_MODE_A); /* ":tt" for appending: the host's stderr */
    size_t shown = idl_control_shown(text);
    const char *parts[5] = { "qemu-device: control: '", text,
                             text[shown] != '\0' ? " ...': " : "': ", why, "\n" };
    for (k = 0; k < 5u; k++) {
        size_t len = strlen(parts[k]);
        if (k == 1u) {
            len = shown; /* as the posix device: the first word only */
        }
        if (n + len < sizeof msg) {
            memcpy(msg + n, parts[k], len);
            n += len;
        }
    }
    if (h >= 0) {
        (void)idl_sh_write(h, msg, n);
        idl_sh_close(h);
    }
}

bool idl_sh_control_start(void)
{
    const char *path = idl_sh_arg("control");
    idl_control_init(&control, say);
    if (path == NULL) {
        return true;
    }
    control_handle = idl_sh_open(path, IDL_SH_MODE_RB);
    return control_handle >= 0;
}

void idl_sh_control_poll(idl_regs_t *regs, uint32_t now)
{
    char buf[128];
    int len;
    if (control_handle < 0 || (len = idl_sh_flen(control_handle)) <= (int)control_read) {
        return;
    }
    while ((uint32_t)len > control_read) {
        size_t n = (uint32_t)len - control_read < sizeof buf ? (uint32_t)len - control_read
                                                             : sizeof buf;
        if (!idl_sh_seek(control_handle, control_read) || !idl_sh_read(control_handle, buf, n)) {
            return;
        }
        (void)idl_control_feed(&control, buf, n, regs, now);
        control_read += (uint32_t)n;
    }
}

uint16_t idl_sh_control_conditions(uint16_t address)
{
    return idl_control_conditions(&control, address);
}

#if IDL_AUTH
static uint8_t sh_keys[4][IDL_KEY_LEN];
static unsigned sh_nkeys;
static uint8_t sh_nonce_seed[16];
static uint32_t sh_nonce_count;

const uint8_t *idl_port_auth_key(unsigned i) { return i < sh_nkeys ? sh_keys[i] : NULL; }

/* BLAKE2s keyed with the seed (zero-padded to a key) over the counter: unpredictable on the wire,
 * never the same twice in a run */
void idl_port_random(uint8_t *buf, size_t n)
{
    uint8_t key[IDL_KEY_LEN] = { 0 };
    uint8_t out[32];
    idl_piece_t piece;
    memcpy(key, sh_nonce_seed, sizeof sh_nonce_seed);
    piece.p = (const uint8_t *)&sh_nonce_count;
    piece.n = sizeof sh_nonce_count;
    (void)idl_blake2s(out, 32u, key, &piece, 1u);
    sh_nonce_count++;
    memcpy(buf, out, n < sizeof out ? n : sizeof out);
}

static int hex_nibble(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

bool idl_sh_keys_load(void)
{
    const char *path = idl_sh_arg("keys");
    const char *seed = idl_sh_arg("nonce_seed");
    int h;
    int len;
    unsigned i;
    for (i = 0; seed != NULL && i < 2u * sizeof sh_nonce_seed && seed[i] != '\0'; i++) {
        int v = hex_nibble(seed[i]);
        if (v < 0) {
            break;
        }
        sh_nonce_seed[i / 2u] = (uint8_t)(sh_nonce_seed[i / 2u] | (v << ((i % 2u) ? 0 : 4)));
    }
    if (path == NULL) {
        return true;
    }
    h = idl_sh_open(path, IDL_SH_MODE_RB);
    if (h < 0) {
        return false;
    }
    len = idl_sh_flen(h);
    if (len <= 0 || len % (int)IDL_KEY_LEN != 0 || len > (int)sizeof sh_keys
        || !idl_sh_read(h, sh_keys, (size_t)len)) {
        idl_sh_close(h);
        return false;
    }
    idl_sh_close(h);
    sh_nkeys = (unsigned)len / IDL_KEY_LEN;
    return true;
}
#else
bool idl_sh_keys_load(void) { return idl_sh_arg("keys") == NULL; }
#endif
