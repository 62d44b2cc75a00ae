/* What one framed read costs the device, for `make bench-device` (valgrind callgrind counts the
 * instructions inside idl_device_rx only):
 *
 *   bench_device read | replay
 *
 * A whole device (idl_device.c with stub port functions: no I/O, a fixed clock) is handed N
 * complete REQUEST frames, one idl_device_rx call each, as a port's main loop hands it a received
 * chunk: decoding (COBS, CRC-32C), the epoch and window checks, the execution (FC03 of the whole
 * register map: 9 registers of the built-in thermal controller), the answer stored for replay and
 * encoded into a frame, handed to idl_port_write. `read`: every frame a new number (executed);
 * `replay`: every frame the retransmission of one already answered (the stored answer resent).
 * The frames are encoded before the measured calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idl_port.h"

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

int main(int argc, char **argv)
{
    static const uint8_t read_map[] = { 0x03, 0x00, 0x00, 0x00, (uint8_t)IDL_REG_COUNT };
    void (*volatile rx)(idl_device_t *, const uint8_t *, size_t) = idl_device_rx;
    int replay = argc > 1 && strcmp(argv[1], "replay") == 0;
    uint32_t i;
    if (argc != 2 || (!replay && strcmp(argv[1], "read") != 0)) {
        fprintf(stderr, "usage: bench_device read|replay\n");
        return 2;
    }
    idl_device_init(&device);
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
