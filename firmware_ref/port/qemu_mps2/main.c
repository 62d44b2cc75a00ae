/*
 * The idemlink device core on an emulated MCU: QEMU's mps2-an385 (Cortex-M3, 25 MHz).
 *
 *   qemu-system-arm -machine mps2-an385 -nographic -monitor none -serial pty \
 *       -semihosting-config enable=on,target=native -kernel build/qemu/idemlink-device.elf
 *
 * UART0 (CMSDK APB UART at 0x40004000) carries the framed protocol: QEMU's `-serial pty` makes it
 * a pty on the host that `idemlink` opens like any port. The clock is the CMSDK timer 0 running
 * free at 25 MHz, read and accumulated by the main loop (QEMU computes its value from the host's
 * clock; counting periodic interrupts instead loses ticks when the host is busy).
 * The configuration is kept in `idemlink-config.bin` in QEMU's working directory through
 * semihosting (a stand-in for a flash sector: written whole, with a CRC, read back at boot).
 * FILE_RECEIVE (YMODEM) stores files in a 256 KiB RAM area (8 files; lost at reset), where
 * FILE_INFO finds them.
 * The boot epoch mixes the host's time (semihosting) with SysTick; the device id is the command
 * line's id= (tools/qemu-device keeps one per flash directory), else IDL_QEMU_DEVICE_ID. Everything else is the portable core through idl_port.h.
 *
 * `tools/qemu-device` runs it as a device command: it passes words on the semihosting command
 * line (`-semihosting-config ...,arg=WORD`), each optional:
 *   effects=PATH   append the record of boots and executions to PATH (the effects file of
 *                  `idemlink soak --device-cmd`, written like the posix port's --effects)
 *   trigger_ms=N   how long a trigger stays RUNNING
 *   entropy=HEX    32 bits from the host's random source, mixed into the boot epoch (a TRNG's
 *                  stand-in: two boots within one host second then still draw different epochs)
 *   id=TEXT        the device id HELLO advertises (default IDL_QEMU_DEVICE_ID): one per instance
 *   stats=PATH     at a requested stop, one line of counters appended to PATH (flash_writes: the
 *                  configuration saves since boot)
 *   control=PATH   a file of control lines the host appends to (port/qemu_host.h), read when idle
 * and UART1 is its stop line: any byte received there ends the program through semihosting
 * after the frame in hand is finished (a stop never falls between an effect and its record).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idl_crc32c.h"
#include "idl_port.h"
#include "../demo_conditions.h"
#include "../effects_record.h"
#include "../qemu_host.h"

#ifndef IDL_QEMU_DEVICE_ID
#define IDL_QEMU_DEVICE_ID "qemu-mps2-an385"
#endif
#define CONFIG_FILE "idemlink-config.bin"

#define UART0_BASE 0x40004000u
#define UART_DATA (*(volatile uint32_t *)(UART0_BASE + 0x00u))
#define UART_STATE (*(volatile uint32_t *)(UART0_BASE + 0x04u))
#define UART_CTRL (*(volatile uint32_t *)(UART0_BASE + 0x08u))
#define UART_BAUDDIV (*(volatile uint32_t *)(UART0_BASE + 0x10u))
#define UART_STATE_TX_FULL 0x1u
#define UART_STATE_RX_FULL 0x2u
#define UART1_BASE 0x40005000u
#define UART1_DATA (*(volatile uint32_t *)(UART1_BASE + 0x00u))
#define UART1_STATE (*(volatile uint32_t *)(UART1_BASE + 0x04u))
#define UART1_CTRL (*(volatile uint32_t *)(UART1_BASE + 0x08u))

#define UART_INTSTATUS (*(volatile uint32_t *)(UART0_BASE + 0x0Cu))
#define UART1_INTSTATUS (*(volatile uint32_t *)(UART1_BASE + 0x0Cu))
#define UART_CTRL_RX_INTEN 0x8u
#define UART_INT_RX 0x2u
#define TIMER1_CTRL (*(volatile uint32_t *)0x40001000u)
#define TIMER1_VALUE (*(volatile uint32_t *)0x40001004u)
#define TIMER1_RELOAD (*(volatile uint32_t *)0x40001008u)
#define TIMER1_INTCLEAR (*(volatile uint32_t *)0x4000100Cu)
#define NVIC_ISER (*(volatile uint32_t *)0xE000E100u)
#define NVIC_ICPR (*(volatile uint32_t *)0xE000E280u)
/* mps2-an385 interrupt numbers: UART0 RX 0, UART1 RX 2, timer 1 9 */
#define WAKE_IRQS ((1u << 0) | (1u << 2) | (1u << 9))
#define TICK_MS 20u
#define TIMER0_CTRL (*(volatile uint32_t *)0x40000000u)
#define TIMER0_VALUE (*(volatile uint32_t *)0x40000004u)
#define TIMER0_RELOAD (*(volatile uint32_t *)0x40000008u)
#define CPU_HZ 25000000u

static uint32_t timer_last;
static uint64_t cycles;
static FILE *effects;
static uint32_t host_entropy;
static uint32_t flash_writes; /* configuration saves since boot */

/* ---- the effects record ------------------------------------------------------------------- */

static void effects_line(const char *line, size_t n)
{
    if (fwrite(line, 1, n, effects) != n || fflush(effects) != 0) {
        exit(1); /* an execution without its record would mislead whoever reads the file */
    }
}

void idl_port_executed(uint32_t epoch, uint32_t seq, const uint8_t *request, uint16_t request_len,
                       const uint8_t *response, uint16_t response_len, uint32_t now)
{
    static char line[IDL_EFFECTS_LINE_MAX];
    if (effects == NULL) {
        return;
    }
    effects_line(line, idl_effects_run_line(line, epoch, seq, request, request_len, response,
                                            response_len, (unsigned long)(now / 1000u),
                                            (unsigned)(now % 1000u)));
}

/* Main loop only (it accumulates): the timer wraps every 171 s, the loop reads it far more often. */
uint32_t idl_port_millis(void)
{
    uint32_t now = TIMER0_VALUE; /* counts down */
    cycles += (uint32_t)(timer_last - now);
    timer_last = now;
    return (uint32_t)(cycles / (CPU_HZ / 1000u));
}

void idl_port_write(const uint8_t *data, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        while (UART_STATE & UART_STATE_TX_FULL) {
        }
        UART_DATA = data[i];
    }
}

/* Configuration "sector": generation, the values by map index, CRC-32C of both. */
typedef struct {
    uint16_t generation;
    uint16_t values[IDL_REG_COUNT];
    uint32_t crc;
} config_image_t;

static uint32_t image_crc(const config_image_t *img)
{
    return idl_crc32c((const uint8_t *)img, offsetof(config_image_t, crc));
}

bool idl_port_flash_load(uint16_t *values, uint16_t *generation)
{
    config_image_t img;
    FILE *f = fopen(CONFIG_FILE, "rb");
    size_t n;
    if (f == NULL) {
        return false;
    }
    n = fread(&img, 1, sizeof img, f);
    fclose(f);
    if (n != sizeof img || img.crc != image_crc(&img)) {
        return false; /* torn or foreign: boot with the defaults */
    }
    memcpy(values, img.values, sizeof img.values);
    *generation = img.generation;
    return true;
}

bool idl_port_flash_save(const uint16_t *values, uint16_t generation)
{
    config_image_t img;
    FILE *f;
    memset(&img, 0, sizeof img);
    img.generation = generation;
    memcpy(img.values, values, sizeof img.values);
    img.crc = image_crc(&img);
    f = fopen(CONFIG_FILE, "wb");
    if (f == NULL) {
        return false;
    }
    if (fwrite(&img, 1, sizeof img, f) != sizeof img) {
        fclose(f);
        return false;
    }
    if (fclose(f) != 0) {
        return false;
    }
    flash_writes++;
    return true;
}

#if IDL_BUS
/* address=N on the command line (tools/qemu-device --address); none: 0 */
uint8_t idl_port_bus_address(void)
{
    const char *v = idl_sh_arg("address");
    unsigned long a = v != NULL ? strtoul(v, NULL, 10) : 0ul;
    return a <= 255ul ? (uint8_t)a : 0u;
}
#endif

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
    uint32_t seed = (uint32_t)time(NULL) ^ (TIMER0_VALUE << 7) ^ host_entropy;
    return idl_crc32c((const uint8_t *)&seed, sizeof seed); /* mixed, non-zero almost always */
}

uint16_t idl_port_fault_conditions(const idl_regs_t *r, uint16_t address)
{
    /* the demo rule, and the conditions set from outside (control=PATH, qemu-device --control) */
    return (uint16_t)(idl_demo_fault_conditions(r, address) | idl_sh_control_conditions(address));
}

/* ---- files: FILE_RECEIVE stores into RAM (port/ram_files.c: 256 KiB, 8 files, lost at reset),
 * FILE_INFO reads it back ------------------------------------------------------------------- */

static idl_device_t device;

int main(void)
{
    uint32_t polled = 0;
    UART_BAUDDIV = CPU_HZ / 115200u;
    /* Interrupts stay masked (PRIMASK): their only use is to wake the WFI of the idle loop. */
    __asm__ volatile("cpsid i" ::: "memory");
    UART_CTRL = 0x3u | UART_CTRL_RX_INTEN; /* TX and RX; RX raises its (masked) interrupt */
    TIMER0_RELOAD = 0xFFFFFFFFu;
    TIMER0_VALUE = 0xFFFFFFFFu;
    timer_last = 0xFFFFFFFFu;
    TIMER0_CTRL = 1u; /* enabled, no interrupt */
    UART1_CTRL = 0x2u | UART_CTRL_RX_INTEN; /* RX only: the stop line */
    TIMER1_RELOAD = CPU_HZ / 1000u * TICK_MS;
    TIMER1_VALUE = CPU_HZ / 1000u * TICK_MS;
    TIMER1_CTRL = 1u | 8u; /* enabled, interrupt: the idle loop's tick */
    NVIC_ISER = WAKE_IRQS;
    idl_sh_read_cmdline();
    {
        const char *v = idl_sh_arg("entropy");
        host_entropy = v != NULL ? (uint32_t)strtoul(v, NULL, 16) : 0u;
        v = idl_sh_arg("effects");
        if (v != NULL && (effects = fopen(v, "a")) == NULL) {
            return 1;
        }
        if (!idl_sh_control_start() || !idl_sh_keys_load()) {
            return 1;
        }
    }
    idl_device_init(&device);
    {
        const char *v = idl_sh_arg("trigger_ms");
        if (v != NULL) {
            device.regs.trigger_ms = (uint32_t)strtoul(v, NULL, 10);
        }
    }
    if (effects != NULL) {
        static char line[IDL_EFFECTS_LINE_MAX];
        uint32_t now = idl_port_millis();
        effects_line(line, idl_effects_boot_line(line, device.session.epoch,
                                                 (unsigned long)(now / 1000u),
                                                 (unsigned)(now % 1000u), device.regs.trigger_ms));
    }
    for (;;) {
        uint8_t chunk[64];
        size_t n = 0;
        /* clear the wake-up sources first: whatever arrives after this wakes the next WFI */
        UART_INTSTATUS = UART_INT_RX;
        UART1_INTSTATUS = UART_INT_RX;
        TIMER1_INTCLEAR = 1u;
        NVIC_ICPR = WAKE_IRQS;
        if (UART1_STATE & UART_STATE_RX_FULL) {
            /* stop requested: between two chunks, so never inside a frame's work */
            const char *v = idl_sh_arg("stats");
            FILE *f = v != NULL ? fopen(v, "a") : NULL;
            if (f != NULL) {
                fprintf(f, "flash_writes=%lu\n", (unsigned long)flash_writes);
                fclose(f);
            }
            return 0;
        }
        while (n < sizeof chunk && (UART_STATE & UART_STATE_RX_FULL)) {
            chunk[n++] = (uint8_t)UART_DATA;
        }
        if (n != 0u) {
            idl_device_rx(&device, chunk, n);
            continue;
        }
        if (idl_port_millis() != polled) {
            polled = idl_port_millis();
            idl_sh_control_poll(&device.regs, polled); /* the lines added from outside */
            idl_device_poll(&device);
        }
        /* idle until a byte or the next tick: spinning on the UART's registers would keep QEMU's
         * I/O thread from delivering the bytes (and on a board, burn power) */
        __asm__ volatile("wfi" ::: "memory");
    }
}
