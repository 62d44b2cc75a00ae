/* Glue: one device = register core + Modbus face + framed session + port. See idl_port.h. */
#include "idl_port.h"

#include "idl_files.h"

#include <string.h>

static const uint8_t MAP_HASH[IDL_MAP_HASH_LEN] = IDL_MAP_HASH_BYTES;

static uint16_t conditions(void *ctx, const idl_regs_t *r, uint16_t address)
{
    (void)ctx;
    return idl_port_fault_conditions(r, address);
}

static bool persist(void *ctx, const idl_regs_t *r, const uint16_t *planned, uint16_t generation)
{
    (void)ctx;
    (void)r;
    return idl_port_flash_save(planned, generation);
}

static int file_lookup(void *ctx, const uint8_t *name, uint8_t len, uint32_t *size,
                       uint32_t *crc)
{
    (void)ctx;
    return idl_port_file_info(name, len, size, crc);
}

/* FILE_INFO is answered here (the register core never sees it, as in device_sim/device.py);
 * FILE_RECEIVE (0x44) is not implemented yet: the register core answers it with exception 01. */
static uint16_t execute(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *resp, uint32_t now,
                        uint32_t seq)
{
    idl_device_t *d = (idl_device_t *)ctx;
    uint16_t n;
    if (len != 0u && pdu[0] == (uint8_t)IDL_MB_FC_FILE_INFO) {
        n = idl_file_info_execute(pdu, len, resp, file_lookup, NULL);
    } else {
        n = idl_modbus_execute(&d->regs, pdu, len, resp, now);
    }
#if IDL_PORT_EXECUTED
    idl_port_executed(d->session.epoch, seq, pdu, len, resp, n, now);
#else
    (void)seq;
#endif
    return n;
}

void idl_device_init(idl_device_t *d)
{
    uint32_t now = idl_port_millis();
    uint32_t epoch;
    size_t n;
    uint16_t generation = 0;
    idl_regs_init(&d->regs, IDL_TRIGGER_MS, conditions, persist, NULL, now);
    /* the scratch array doubles as the load buffer: it is unused outside a write */
    if (idl_port_flash_load(d->regs.planned, &generation)) {
        (void)idl_regs_restore(&d->regs, d->regs.planned, generation, now);
    }
    n = idl_port_unique_id(d->device_id, IDL_MAX_DEVICE_ID_LEN);
    d->device_id[n < IDL_MAX_DEVICE_ID_LEN ? n : IDL_MAX_DEVICE_ID_LEN] = '\0';
    d->cfg.execute = execute;
    d->cfg.ctx = d;
    d->cfg.name = IDL_DEVICE_NAME;
    d->cfg.device_id = d->device_id;
    d->cfg.map_name = IDL_MAP_NAME;
    d->cfg.map_hash = MAP_HASH;
    d->cfg.max_inflight = 32u;
    do {
        epoch = idl_port_entropy32();
    } while (epoch == 0u);
    idl_session_init(&d->session, &d->cfg, epoch);
}

void idl_device_rx(idl_device_t *d, const uint8_t *data, size_t n)
{
    size_t i;
    uint32_t now = idl_port_millis();
    idl_regs_tick(&d->regs, now);
    for (i = 0; i < n; i++) {
        size_t out = idl_session_feed(&d->session, data[i], now);
        if (out != 0u) {
            idl_port_write(d->session.tx, out);
        }
    }
}

void idl_device_poll(idl_device_t *d) { idl_regs_tick(&d->regs, idl_port_millis()); }
