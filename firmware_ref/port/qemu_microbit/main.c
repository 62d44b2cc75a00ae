/*
 * The idemlink device core on a Cortex-M0: the nRF51822 of the BBC micro:bit as QEMU emulates it
 * (`qemu-system-arm -machine microbit`), and the same board template built bare for a small part.
 *
 *   make -C firmware_ref qemu-device BOARD=microbit      build/qemu-microbit/idemlink-device.elf
 *   firmware_ref/tools/qemu-device --board microbit      (prints the pty, like the posix device)
 *   make -C firmware_ref board-m0plus                    the bare image for a 32 KiB / 4 KiB part
 *
 * The board template (both builds): the vector table and a reset handler that copies .data and
 * clears .bss (no libc start-up, no heap: _sbrk refuses); UART0 (0x40002000) at 115200 Bd with
 * its RXDRDY interrupt moving each byte into a 256-byte RX ring (an overrun is counted, never
 * overwritten) and polled TX; SysTick every 20 ms as the idle loop's wake-up; the clock from
 * TIMER0 running free at 1 MHz, read by a capture task (a counted tick would lose time when
 * interrupts are late); the boot epoch from the RNG peripheral; the main loop drains the ring into
 * idl_device_rx and sleeps in WFI when there is nothing to do. QEMU 7.2's nRF51 model implements
 * all of these (UART RX and TX with interrupts, TIMER capture, RNG, NVMC, SysTick on the CPU clock;
 * it has no RTC and one UART).
 *
 * IDL_BOARD_SEMIHOSTING=1 (the QEMU build): the host's world through semihosting, no newlib stdio
 * and no malloc. The configuration is two 1 KiB "pages" (A/B, each with a sequence number and a
 * CRC-32C, the older one written) in `idemlink-flash.bin` in QEMU's working directory, the flash
 * directory: a kill while a page is written tears that page only and the other one boots. Words of
 * the semihosting command line, each optional (tools/qemu-device passes them):
 *   id=TEXT        the device id (default IDL_QEMU_DEVICE_ID): one per instance
 *   effects=PATH   append boots and executions to PATH (the soak's effects file)
 *   trigger_ms=N   how long a trigger stays RUNNING
 *   entropy=HEX    32 bits from the host, mixed into the boot epoch with the RNG's
 *   stop=PATH      a file the main loop watches between two chunks: once it is not empty the
 *                  firmware exits (the frame in hand finished, so an effect never loses its record)
 *   stats=PATH     at that stop, one line of counters appended to PATH (flash writes, RX overruns)
 *   address=N      the bus address, with IDL_BUS=1 (0 or absent: none)
 *   control=PATH   a file of control lines the host appends to (port/qemu_host.h), read when idle
 * FILE_RECEIVE stores into a 4 KiB RAM area (4 files, lost at reset).
 *
 * IDL_BOARD_SEMIHOSTING=0 (the bare image): the configuration in the last two 1 KiB flash pages
 * through the NVMC (erase, then program word by word), the device id from FICR's DEVICEID, and no
 * file storage (build it with IDL_FILE_RECEIVE=0).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "idl_crc32c.h"
#include "idl_port.h"
#include "../demo_conditions.h"

#ifndef IDL_BOARD_SEMIHOSTING
#define IDL_BOARD_SEMIHOSTING 1
#endif
#ifndef IDL_QEMU_DEVICE_ID
#define IDL_QEMU_DEVICE_ID "qemu-microbit"
#endif

#if IDL_BOARD_SEMIHOSTING
#include <stdlib.h>

#include "../effects_record.h"
#include "../qemu_host.h"
#endif

/* ---- nRF51 registers ------------------------------------------------------------------------ */

#define REG(a) (*(volatile uint32_t *)(a))
#define UART0 0x40002000u
#define UART_STARTRX REG(UART0 + 0x000u)
#define UART_STARTTX REG(UART0 + 0x008u)
#define UART_RXDRDY REG(UART0 + 0x108u)
#define UART_TXDRDY REG(UART0 + 0x11Cu)
#define UART_INTENSET REG(UART0 + 0x304u)
#define UART_ENABLE REG(UART0 + 0x500u)
#define UART_RXD REG(UART0 + 0x518u)
#define UART_TXD REG(UART0 + 0x51Cu)
#define UART_BAUDRATE REG(UART0 + 0x524u)
#define UART_INT_RXDRDY (1u << 2)
#define UART_BAUD_115200 0x01D7E000u
#define UART0_IRQ 2u
#define TIMER0 0x40008000u
#define TIMER_START REG(TIMER0 + 0x000u)
#define TIMER_CAPTURE0 REG(TIMER0 + 0x040u)
#define TIMER_MODE REG(TIMER0 + 0x504u)
#define TIMER_BITMODE REG(TIMER0 + 0x508u)
#define TIMER_PRESCALER REG(TIMER0 + 0x510u)
#define TIMER_CC0 REG(TIMER0 + 0x540u)
#define RNG 0x4000D000u
#define RNG_START REG(RNG + 0x000u)
#define RNG_STOP REG(RNG + 0x004u)
#define RNG_VALRDY REG(RNG + 0x100u)
#define RNG_VALUE REG(RNG + 0x508u)
#define SYST_CSR REG(0xE000E010u)
#define SYST_RVR REG(0xE000E014u)
#define SYST_CVR REG(0xE000E018u)
#define NVIC_ISER REG(0xE000E100u)
#define CPU_HZ 16000000u
#define TICK_MS 20u

/* ---- the board template: start-up, vector table, RX ring, SysTick ---------------------------- */

extern int main(void);
extern uint32_t _sidata, _sdata, _edata, _sbss, _ebss;
/* the linker's top of RAM, declared as a function so the vector table stays in ISO C */
extern void _estack(void);
void Reset_Handler(void);
void Default_Handler(void);
void UART0_IRQHandler(void);
void SysTick_Handler(void);
void *_sbrk(ptrdiff_t incr);

#define RX_RING 256u /* a power of two */
static volatile uint8_t rx_ring[RX_RING];
static volatile uint32_t rx_head; /* written by the ISR only */
static volatile uint32_t rx_tail; /* written by the main loop only */
static volatile uint32_t rx_overruns;
static volatile uint32_t ticks;

void Reset_Handler(void)
{
    uint32_t *src = &_sidata;
    uint32_t *dst = &_sdata;
    while (dst < &_edata) {
        *dst++ = *src++;
    }
    for (dst = &_sbss; dst < &_ebss; ++dst) {
        *dst = 0u;
    }
    (void)main();
    for (;;) {
    }
}

void Default_Handler(void)
{
    for (;;) {
    }
}

/* No heap: the core never allocates, and neither may anything linked with it. */
void *_sbrk(ptrdiff_t incr)
{
    (void)incr;
    return (void *)-1;
}

/* The RX interrupt: each received byte into the ring, nothing else. */
void UART0_IRQHandler(void)
{
    while (UART_RXDRDY != 0u) {
        uint8_t b;
        UART_RXDRDY = 0u;
        b = (uint8_t)UART_RXD;
        if (rx_head - rx_tail < RX_RING) {
            rx_ring[rx_head & (RX_RING - 1u)] = b;
            rx_head = rx_head + 1u;
        } else {
            rx_overruns = rx_overruns + 1u; /* the frame fails its CRC; the host retries */
        }
    }
}

void SysTick_Handler(void) { ticks = ticks + 1u; }

/* 16 system exceptions, then the nRF51's 32 interrupts (UART0 is number 2) */
__attribute__((section(".isr_vector"), used)) static void (*const vectors[48])(void) = {
    _estack, Reset_Handler, Default_Handler, Default_Handler,
    0, 0, 0, 0, 0, 0, 0, Default_Handler, 0, 0, Default_Handler, SysTick_Handler,
    Default_Handler, Default_Handler, UART0_IRQHandler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
};

static void board_init(void)
{
    UART_BAUDRATE = UART_BAUD_115200;
    UART_ENABLE = 4u;
    UART_STARTTX = 1u;
    UART_STARTRX = 1u;
    UART_INTENSET = UART_INT_RXDRDY;
    TIMER_MODE = 0u;      /* timer */
    TIMER_BITMODE = 3u;   /* 32 bits */
    TIMER_PRESCALER = 4u; /* 16 MHz / 2^4: 1 MHz */
    TIMER_START = 1u;
    SYST_RVR = CPU_HZ / 1000u * TICK_MS - 1u;
    SYST_CVR = 0u;
    SYST_CSR = 7u; /* processor clock, interrupt, enabled */
    NVIC_ISER = 1u << UART0_IRQ;
}

/* ---- idl_port.h: the clock, the line, entropy ------------------------------------------------ */

static uint32_t timer_last;
static uint32_t micros_part; /* microseconds not yet a whole millisecond */
static uint32_t millis_now;

/* Main loop only (it accumulates): the timer wraps every 71 minutes, the loop reads it more often. */
uint32_t idl_port_millis(void)
{
    uint32_t now;
    uint32_t q;
    TIMER_CAPTURE0 = 1u;
    now = TIMER_CC0;
    micros_part += now - timer_last;
    timer_last = now;
    q = micros_part / 1000u;
    millis_now += q;
    micros_part -= q * 1000u;
    return millis_now;
}

void idl_port_write(const uint8_t *data, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        UART_TXDRDY = 0u;
        UART_TXD = data[i];
        while (UART_TXDRDY == 0u) {
        }
    }
}

static uint32_t rng32(void)
{
    uint32_t v = 0;
    unsigned i;
    RNG_START = 1u;
    for (i = 0; i < 4u; i++) {
        while (RNG_VALRDY == 0u) {
        }
        RNG_VALRDY = 0u;
        v = (v << 8) | (RNG_VALUE & 0xFFu);
    }
    RNG_STOP = 1u;
    return v;
}

uint16_t idl_port_fault_conditions(const idl_regs_t *r, uint16_t address)
{
#if IDL_BOARD_SEMIHOSTING
    /* the demo rule, and the conditions set from outside (control=PATH, qemu-device --control) */
    return (uint16_t)(idl_demo_fault_conditions(r, address) | idl_sh_control_conditions(address));
#else
    return idl_demo_fault_conditions(r, address);
#endif
}

/* ---- the configuration: two pages, A/B, the older one written -------------------------------- */

#define PAGE_BYTES 1024u
typedef struct {
    uint32_t sequence; /* serial number of the save: the newer valid page wins */
    uint16_t generation;
    uint16_t values[IDL_REG_COUNT];
    uint32_t crc; /* CRC-32C of everything before it */
} config_page_t;

static uint32_t flash_writes; /* persistent saves since boot */
static uint32_t flash_sequence;
static unsigned flash_next; /* the page the next save writes */

static bool page_read(unsigned page, config_page_t *out);
static bool page_write(unsigned page, const config_page_t *in);

static bool page_valid(const config_page_t *p)
{
    return p->crc == idl_crc32c((const uint8_t *)p, offsetof(config_page_t, crc));
}

bool idl_port_flash_load(uint16_t *values, uint16_t *generation)
{
    config_page_t a;
    config_page_t b;
    bool va = page_read(0u, &a) && page_valid(&a);
    bool vb = page_read(1u, &b) && page_valid(&b);
    const config_page_t *best;
    if (va && vb) {
        best = (int32_t)(b.sequence - a.sequence) > 0 ? &b : &a;
    } else if (va || vb) {
        best = va ? &a : &b;
    } else {
        flash_next = 0u;
        return false; /* nothing saved, or both torn: boot with the defaults */
    }
    flash_sequence = best->sequence;
    flash_next = best == &a ? 1u : 0u;
    memcpy(values, best->values, sizeof best->values);
    *generation = best->generation;
    return true;
}

bool idl_port_flash_save(const uint16_t *values, uint16_t generation)
{
    config_page_t p;
    memset(&p, 0, sizeof p);
    p.sequence = flash_sequence + 1u;
    p.generation = generation;
    memcpy(p.values, values, sizeof p.values);
    p.crc = idl_crc32c((const uint8_t *)&p, offsetof(config_page_t, crc));
    if (!page_write(flash_next, &p)) {
        return false;
    }
    flash_sequence = p.sequence;
    flash_next ^= 1u;
    flash_writes++;
    return true;
}

#if IDL_BOARD_SEMIHOSTING
/* ---- semihosting (port/qemu_host.c): the host's files stand in for flash, the effects file and
 * the stop line ---------------------------------------------------------------------------- */

#define FLASH_FILE "idemlink-flash.bin"

static bool page_read(unsigned page, config_page_t *out)
{
    int h = idl_sh_open(FLASH_FILE, IDL_SH_MODE_RB);
    bool ok;
    if (h < 0) {
        return false;
    }
    ok = idl_sh_seek(h, page * PAGE_BYTES) && idl_sh_read(h, out, sizeof *out);
    idl_sh_close(h);
    return ok;
}

static bool page_write(unsigned page, const config_page_t *in)
{
    int h = idl_sh_open(FLASH_FILE, IDL_SH_MODE_RPLUSB);
    bool ok;
    if (h < 0) {
        h = idl_sh_open(FLASH_FILE, IDL_SH_MODE_WPLUSB); /* the first save: an empty "flash" */
    }
    if (h < 0) {
        return false;
    }
    ok = idl_sh_seek(h, page * PAGE_BYTES) && idl_sh_write(h, in, sizeof *in);
    idl_sh_close(h);
    return ok;
}

static int effects = -1;
static int stop_handle = -1;
static char line[IDL_EFFECTS_LINE_MAX]; /* one line of the effects file at a time */
static uint32_t host_entropy;

static void effects_line(const char *line, size_t n)
{
    if (!idl_sh_write(effects, line, n)) {
        idl_sh_exit(false); /* an execution without its record would mislead whoever reads the file */
    }
}

void idl_port_executed(uint32_t epoch, uint32_t seq, const uint8_t *request, uint16_t request_len,
                       const uint8_t *response, uint16_t response_len, uint32_t now)
{
    if (effects < 0) {
        return;
    }
    effects_line(line, idl_effects_run_line(line, epoch, seq, request, request_len, response,
                                            response_len, (unsigned long)(now / 1000u),
                                            (unsigned)(now % 1000u)));
}

size_t idl_port_unique_id(char *buf, size_t cap)
{
    const char *id = idl_sh_arg("id");
    size_t n;
    if (id == NULL) {
        id = IDL_QEMU_DEVICE_ID;
    }
    n = strlen(id);
    if (n > cap) {
        n = cap;
    }
    memcpy(buf, id, n);
    return n;
}

uint32_t idl_port_entropy32(void)
{
    uint32_t seed[3];
    seed[0] = rng32();
    seed[1] = idl_sh_time();
    seed[2] = host_entropy;
    return idl_crc32c((const uint8_t *)seed, sizeof seed);
}

/* ---- files: FILE_RECEIVE stores into RAM (port/ram_files.c, sized by the build: 4 KiB, 4 files,
 * lost at reset), FILE_INFO reads it back --------------------------------------------------- */

static void host_start(void)
{
    const char *v;
    idl_sh_read_cmdline();
    v = idl_sh_arg("entropy");
    host_entropy = v != NULL ? (uint32_t)strtoul(v, NULL, 16) : 0u;
    v = idl_sh_arg("effects");
    if (v != NULL && (effects = idl_sh_open_append(v)) < 0) {
        idl_sh_exit(false);
    }
    v = idl_sh_arg("stop");
    if (v != NULL && (stop_handle = idl_sh_open(v, IDL_SH_MODE_RB)) < 0) {
        idl_sh_exit(false);
    }
    if (!idl_sh_control_start() || !idl_sh_keys_load()) {
        idl_sh_exit(false);
    }
}

static void host_booted(idl_device_t *d)
{
    const char *v = idl_sh_arg("trigger_ms");
    if (v != NULL) {
        d->regs.trigger_ms = (uint32_t)strtoul(v, NULL, 10);
    }
    if (effects >= 0) {
        uint32_t now = idl_port_millis();
        effects_line(line, idl_effects_boot_line(line, d->session.epoch,
                                                 (unsigned long)(now / 1000u),
                                                 (unsigned)(now % 1000u), d->regs.trigger_ms));
    }
}

/* Between two chunks: has the wrapper asked to stop? Then the counters, and exit. */
static void host_poll_stop(void)
{
    const char *path;
    int h;
    if (stop_handle < 0 || idl_sh_flen(stop_handle) <= 0) {
        return;
    }
    path = idl_sh_arg("stats");
    if (path != NULL && (h = idl_sh_open_append(path)) >= 0) {
        int n = sprintf(line, "flash_writes=%lu rx_overruns=%lu\n", (unsigned long)flash_writes,
                        (unsigned long)rx_overruns);
        (void)idl_sh_write(h, line, (size_t)n);
        idl_sh_close(h);
    }
    idl_sh_exit(true);
}

#else
/* ---- bare: the configuration pages in flash through the NVMC; no file storage --------------- */

#define NVMC 0x4001E000u
#define NVMC_READY REG(NVMC + 0x400u)
#define NVMC_CONFIG REG(NVMC + 0x504u)
#define NVMC_ERASEPAGE REG(NVMC + 0x508u)
#define FICR_DEVICEID0 REG(0x10000060u)
#define FICR_DEVICEID1 REG(0x10000064u)

extern uint8_t _config_pages[]; /* the linker's CONFIG region: two pages */

static bool page_read(unsigned page, config_page_t *out)
{
    memcpy(out, _config_pages + page * PAGE_BYTES, sizeof *out);
    return true;
}

static void nvmc_wait(void)
{
    while (NVMC_READY == 0u) {
    }
}

static bool page_write(unsigned page, const config_page_t *in)
{
    volatile uint32_t *dst = (volatile uint32_t *)(uintptr_t)(_config_pages + page * PAGE_BYTES);
    uint32_t words_out[(sizeof(config_page_t) + 3u) / 4u];
    size_t i;
    memset(words_out, 0xFF, sizeof words_out);
    memcpy(words_out, in, sizeof *in);
    NVMC_CONFIG = 2u; /* erase enabled */
    nvmc_wait();
    NVMC_ERASEPAGE = (uint32_t)(uintptr_t)dst;
    nvmc_wait();
    NVMC_CONFIG = 1u; /* write enabled */
    for (i = 0; i < sizeof words_out / 4u; i++) {
        dst[i] = words_out[i];
        nvmc_wait();
    }
    NVMC_CONFIG = 0u;
    return memcmp((const void *)(uintptr_t)dst, in, sizeof *in) == 0; /* verified */
}

size_t idl_port_unique_id(char *buf, size_t cap)
{
    static const char digits[] = "0123456789abcdef";
    uint32_t id[2];
    size_t n = 0;
    unsigned i;
    id[0] = FICR_DEVICEID1;
    id[1] = FICR_DEVICEID0;
    for (i = 0; i < 16u && n < cap; i++) {
        buf[n++] = digits[(id[i / 8u] >> (28u - 4u * (i % 8u))) & 15u];
    }
    return n;
}

uint32_t idl_port_entropy32(void) { return rng32(); }

uint8_t *idl_port_ymodem_block(void) { return NULL; }
bool idl_port_file_begin(const uint8_t *name, size_t len, bool overwrite)
{
    (void)name;
    (void)len;
    (void)overwrite;
    return false;
}
bool idl_port_file_write(uint32_t offset, const uint8_t *data, size_t n)
{
    (void)offset;
    (void)data;
    (void)n;
    return false;
}
bool idl_port_file_commit(uint32_t size)
{
    (void)size;
    return false;
}
void idl_port_file_abort(void) {}
int idl_port_file_info(const uint8_t *name, uint8_t len, uint32_t *size, uint32_t *crc)
{
    (void)name;
    (void)len;
    (void)size;
    (void)crc;
    return 1;
}
#endif

#if IDL_BUS
#ifndef IDL_BOARD_ADDRESS
#define IDL_BOARD_ADDRESS 0u /**< the bare image's bus address (0: none), set at build time */
#endif
/* address=N on the command line (tools/qemu-device --address); the bare image: IDL_BOARD_ADDRESS */
uint8_t idl_port_bus_address(void)
{
#if IDL_BOARD_SEMIHOSTING
    const char *v = idl_sh_arg("address");
    unsigned long a = v != NULL ? strtoul(v, NULL, 10) : 0ul;
    return a <= 255ul ? (uint8_t)a : 0u;
#else
    return (uint8_t)IDL_BOARD_ADDRESS;
#endif
}
#endif

/* ---- the main loop ------------------------------------------------------------------------ */

static idl_device_t device;

int main(void)
{
    uint32_t polled = 0;
    board_init();
#if IDL_BOARD_SEMIHOSTING
    host_start();
#endif
    idl_device_init(&device);
#if IDL_BOARD_SEMIHOSTING
    host_booted(&device);
#endif
    for (;;) {
        uint8_t chunk[64];
        size_t n = 0;
#if IDL_BOARD_SEMIHOSTING
        host_poll_stop(); /* between two chunks: never inside a frame's work */
#endif
        while (n < sizeof chunk && rx_tail != rx_head) {
            chunk[n++] = rx_ring[rx_tail & (RX_RING - 1u)];
            rx_tail = rx_tail + 1u;
        }
        if (n != 0u) {
            idl_device_rx(&device, chunk, n);
            continue;
        }
        if (idl_port_millis() != polled) {
            polled = idl_port_millis();
#if IDL_BOARD_SEMIHOSTING
            idl_sh_control_poll(&device.regs, polled); /* the lines added from outside */
#endif
            idl_device_poll(&device);
        }
        /* sleep until a byte or the next SysTick; a byte that arrived after the check above
         * leaves its interrupt pending, and a pending interrupt ends WFI even while masked */
        __asm__ volatile("cpsid i" ::: "memory");
        if (rx_tail == rx_head) {
            __asm__ volatile("wfi" ::: "memory");
        }
        __asm__ volatile("cpsie i" ::: "memory");
    }
}
