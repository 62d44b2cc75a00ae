/* What one framed read costs the device, for `make bench-device` (valgrind callgrind counts the
 * instructions inside idl_device_rx only):
 *
 *   bench_device read | replay | rtu
 *
 * A whole device (idl_device.c with stub port functions: no I/O, a fixed clock) is handed N
 * complete REQUEST frames, one idl_device_rx call each, as a port's main loop hands it a received
 * chunk: decoding (COBS, CRC-32C), the epoch and window checks, the execution (FC03 of the whole
 * register map: 9 registers of the built-in thermal controller), the answer stored for replay and
 * encoded into a frame, handed to idl_port_write. `read`: every frame a new number (executed);
 * `replay`: every frame the retransmission of one already answered (the stored answer resent).
 * `rtu`: the same read on the plain Modbus RTU face (idl_rtu.h: 01 03 0000 0009 + CRC-16), each
 * request's bytes fed one by one as a UART hands them over, then the pause the port reports;
 * callgrind counts inside rtu_request. The frames are encoded before the measured calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idl_port.h"
#include "idl_rtu.h"

#define N 4096u

static uint8_t frames[N][IDL_WIRE_MAX];
static size_t lengths[N];
static uint32_t sink; /* keeps the answers observable */

void idl_port_write(const uint8_t *data, size_t n) { sink += (uint32_t)n + data[n / 2u]; }
uint32_t idl_port_millis(void) { return 1000u; }
bool idl_port_flash_load(uint16_t *values, uint16_t *generation)
{
    (void)values;
    (void)generation;
    return false;
}
bool idl_port_flash_save(const uint16_t *values, uint16_t generation)
{
    (void)values;
    (void)generation;
    return true;
}
size_t idl_port_unique_id(char *buf, size_t cap)
{
    (void)cap;
    memcpy(buf, "bench", 5u);
    return 5u;
}
uint32_t idl_port_entropy32(void) { return 0x1234ABCDu; }
uint16_t idl_port_fault_conditions(const idl_regs_t *r, uint16_t address)
{
    (void)r;
    (void)address;
    return 0u;
}
int idl_port_file_info(const uint8_t *name, uint8_t len, uint32_t *size, uint32_t *crc)
{
    (void)name;
    (void)len;
    (void)size;
    (void)crc;
    return 1;
}

static idl_device_t device;
static idl_rtu_t rtu;

/* One RTU request as a port serves it: every byte, the answer sent, then the pause. */
__attribute__((noinline)) static void rtu_request(const uint8_t *frame, size_t n)
{
    size_t i;
    size_t out;
    for (i = 0; i < n; i++) {
        out = idl_rtu_feed(&rtu, frame[i], 1000u);
        if (out != 0u) {
            idl_port_write(rtu.out, out);
        }
    }
    out = idl_rtu_pause(&rtu, 1000u);
    if (out != 0u) {
        idl_port_write(rtu.out, out);
    }
}

static int bench_rtu(void)
{
    static const uint8_t pdu[] = { 0x01, 0x03, 0x00, 0x00, 0x00, (uint8_t)IDL_REG_COUNT };
    uint8_t frame[sizeof pdu + 2u];
    void (*volatile run)(const uint8_t *, size_t) = rtu_request;
    uint16_t crc = idl_crc16_modbus(pdu, sizeof pdu);
    uint32_t i;
    memcpy(frame, pdu, sizeof pdu);
    frame[sizeof pdu] = (uint8_t)crc;
    frame[sizeof pdu + 1u] = (uint8_t)(crc >> 8);
    idl_rtu_init(&rtu, &device.regs, 1u);
    for (i = 0; i < N; i++) {
        run(frame, sizeof frame);
    }
    if (rtu.counters[IDL_RTU_ANSWERED] != N) {
        fprintf(stderr, "bench_device: the RTU requests were not answered\n");
        return 1;
    }
    printf("%lu\n", (unsigned long)sink);
    return 0;
}

int main(int argc, char **argv)
{
    static const uint8_t read_map[] = { 0x03, 0x00, 0x00, 0x00, (uint8_t)IDL_REG_COUNT };
    void (*volatile rx)(idl_device_t *, const uint8_t *, size_t) = idl_device_rx;
    int replay = argc > 1 && strcmp(argv[1], "replay") == 0;
    uint32_t i;
    if (argc != 2 || (!replay && strcmp(argv[1], "read") != 0 && strcmp(argv[1], "rtu") != 0)) {
        fprintf(stderr, "usage: bench_device read|replay|rtu\n");
        return 2;
    }
    idl_device_init(&device);
    if (strcmp(argv[1], "rtu") == 0) {
        return bench_rtu();
    }
    for (i = 0; i < N; i++) {
        uint32_t seq = replay ? 1u : i + 1u;
        lengths[i] = idl_frame_encode(frames[i], IDL_FT_REQUEST, replay ? IDL_FLAG_RETRANSMIT : 0u,
                                      device.session.epoch, seq, read_map, sizeof read_map);
    }
    if (replay) { /* the first answer, outside idl_device_rx (which callgrind counts) */
        size_t k;
        size_t answered = 0;
        for (k = 0; k < lengths[0]; k++) {
            answered += idl_session_feed(&device.session, frames[0][k], 1000u);
        }
        if (answered == 0u) {
            fprintf(stderr, "bench_device: the first frame was not answered\n");
            return 1;
        }
    }
    for (i = 0; i < N; i++) {
        rx(&device, frames[i], lengths[i]);
    }
    if (device.session.counters[replay ? IDL_DISP_REPLAYED : IDL_DISP_EXECUTED] != N) {
        fprintf(stderr, "bench_device: the frames were not answered as %s\n", argv[1]);
        return 1;
    }
    printf("%lu\n", (unsigned long)sink);
    return 0;
}
