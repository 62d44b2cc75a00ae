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

#if IDL_FILE_INFO
static int file_lookup(void *ctx, const uint8_t *name, uint8_t len, uint32_t *size,
                       uint32_t *crc)
{
    (void)ctx;
    return idl_port_file_info(name, len, size, crc);
}
#endif

#if IDL_FILE_RECEIVE
/* ---- FILE_RECEIVE: the line handed to YMODEM for one batch (device_sim/file_receive.py) ---- */

/* DEVICE_RECEIVER: 'C' every second, ten times, then give up; ReceiverConfig's other defaults */
static const idl_ym_config_t YM_CONFIG = { { 1000u, 10000u, 1000u, 250u, 5000u, 60000u },
                                           IDL_FILE_QUOTA, 10u, 10u, (uint8_t)IDL_YM_MAX_NAME };

/* the port's storage is one per firmware, and so is the device receiving into it */
static idl_device_t *ym_device;

static bool ym_begin(void *ctx, const uint8_t *name, size_t len, uint32_t size, bool known)
{
    (void)ctx;
    if (known && size > IDL_FILE_QUOTA - ym_device->ym_used) {
        return false; /* the declared size exceeds what the batch may still store */
    }
    return idl_port_file_begin(name, len, ym_device->ym_overwrite != 0u);
}

static bool ym_write(void *ctx, uint32_t offset, const uint8_t *data, size_t n)
{
    uint32_t room = IDL_FILE_QUOTA - ym_device->ym_used;
    (void)ctx;
    if (offset > room || n > room - offset) {
        return false; /* past what the batch may store */
    }
    return idl_port_file_write(offset, data, n);
}

static bool ym_commit(void *ctx, uint32_t size)
{
    (void)ctx;
    if (!idl_port_file_commit(size)) {
        return false;
    }
    ym_device->ym_used += size;
    return true;
}

static void ym_abort(void *ctx)
{
    (void)ctx;
    idl_port_file_abort();
}

static void ym_send(void *ctx, const uint8_t *data, size_t n)
{
    (void)ctx;
    idl_port_write(data, n);
}

static const idl_ym_io_t YM_IO = { ym_begin, ym_write, ym_commit, ym_abort, ym_send, NULL };

/* `44` or `44 00`: keep existing files; `44 01`: replace them; anything else: exception 03 */
static uint16_t file_receive(idl_device_t *d, const uint8_t *pdu, uint16_t len, uint8_t *resp)
{
    resp[0] = (uint8_t)(IDL_MB_FC_FILE_RECEIVE | IDL_MB_EXCEPTION_FLAG);
    resp[1] = (uint8_t)IDL_MB_EXC_ILLEGAL_FUNCTION;
    if (idl_port_ymodem_block() == NULL) {
        return 2u;
    }
    resp[1] = (uint8_t)IDL_MB_EXC_ILLEGAL_DATA_VALUE;
    if (len > 2u || (len == 2u && pdu[1] > 1u)) {
        return 2u;
    }
    d->ym_mode = 1u; /* the line changes hands once this answer is out */
    d->ym_overwrite = (uint8_t)(len == 2u ? pdu[1] : 0u);
    resp[0] = (uint8_t)IDL_MB_FC_FILE_RECEIVE;
    resp[1] = 0u;
    return 2u;
}
#endif

/* FILE_INFO and FILE_RECEIVE are answered here (the register core never sees them, as in
 * device_sim/device.py); without IDL_FILE_INFO / IDL_FILE_RECEIVE the register core answers
 * 0x45 / 0x44 with 01. */
static uint16_t execute(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *resp, uint32_t now,
                        uint32_t seq)
{
    idl_device_t *d = (idl_device_t *)ctx;
    uint16_t n;
#if IDL_FILE_INFO
    if (len != 0u && pdu[0] == (uint8_t)IDL_MB_FC_FILE_INFO) {
        n = idl_file_info_execute(pdu, len, resp, file_lookup, NULL);
    } else
#endif
#if IDL_FILE_RECEIVE
    if (len != 0u && pdu[0] == (uint8_t)IDL_MB_FC_FILE_RECEIVE) {
        n = file_receive(d, pdu, len, resp);
    } else
#endif
    {
        n = idl_modbus_execute(&d->regs, pdu, len, resp, now);
    }
#if IDL_PORT_EXECUTED && IDL_BUS
    /* a broadcast belongs to no boot: recorded under epoch 0 (no boot has it) */
    idl_port_executed(d->session.broadcasting != 0u ? 0u : d->session.epoch, seq, pdu, len, resp,
                      n, now);
#elif IDL_PORT_EXECUTED
    idl_port_executed(d->session.epoch, seq, pdu, len, resp, n, now);
#else
    (void)seq;
#endif
    return n;
}

#if IDL_BUS
static bool broadcast_ok(void *ctx, const uint8_t *pdu, uint16_t len)
{
    (void)ctx;
    return idl_modbus_broadcast_ok(pdu, len);
}
#endif

void idl_device_init(idl_device_t *d)
{
    uint32_t now = idl_port_millis();
    uint32_t epoch;
    size_t n;
    uint16_t generation = 0;
    idl_regs_init(&d->regs, IDL_TRIGGER_MS, conditions, persist, NULL, now);
    /* the scratch array doubles as the load buffer: it is unused outside a write */
    if (idl_port_flash_load(d->regs.planned, &generation)) {
        /* false: a saved value out of range (a corrupt or foreign record): the defaults stay */
        bool restored = idl_regs_restore(&d->regs, d->regs.planned, generation, now);
        (void)restored;
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
#if IDL_BUS
    {
        uint8_t address = idl_port_bus_address();
        d->cfg.address = address <= IDL_MAX_ADDRESS ? address : 0u;
        d->cfg.broadcast_ok = broadcast_ok;
    }
#endif
    do {
        epoch = idl_port_entropy32();
    } while (epoch == 0u);
    idl_session_init(&d->session, &d->cfg, epoch);
#if IDL_FILE_RECEIVE
    d->ym_mode = 0u;
#endif
}

#if IDL_FILE_RECEIVE
/* the receiver's timers; at the batch's end, back to frames */
static void ym_run(idl_device_t *d, const uint8_t *data, size_t n, uint32_t now)
{
    idl_ym_rx_feed(&d->ym, data, n, now);
    if (idl_ym_rx_finished(&d->ym)) {
        d->ym_mode = 0u;
    }
}
#endif

void idl_device_rx(idl_device_t *d, const uint8_t *data, size_t n)
{
    uint32_t now = idl_port_millis();
    idl_regs_tick(&d->regs, now);
#if IDL_FILE_RECEIVE
    if (d->ym_mode == 2u) {
        ym_run(d, data, n, now);
        return;
    }
#endif
    while (n != 0u) { /* the bytes in one scan, stopping at each answer to send it */
        size_t used;
        size_t out = idl_session_feed_buf(&d->session, data, n, &used, now);
        if (out != 0u) {
            idl_port_write(d->session.tx, out);
        }
        data += used;
        n -= used;
    }
#if IDL_FILE_RECEIVE
    if (d->ym_mode == 1u) { /* as the simulator: the rest of this read went to the frames */
        d->ym_mode = 2u;
        d->ym_used = 0u;
        ym_device = d;
        idl_ym_rx_init(&d->ym, &YM_CONFIG, &YM_IO, idl_port_ymodem_block());
        idl_ym_rx_start(&d->ym, now);
    }
#endif
}

void idl_device_poll(idl_device_t *d)
{
    uint32_t now = idl_port_millis();
    idl_regs_tick(&d->regs, now);
#if IDL_FILE_RECEIVE
    if (d->ym_mode == 2u) {
        ym_run(d, NULL, 0u, now); /* no bytes: the timers alone */
    }
#endif
}

void idl_device_stop(idl_device_t *d)
{
#if IDL_FILE_RECEIVE
    if (d->ym_mode == 2u) {
        idl_ym_rx_abort(&d->ym);
    }
    d->ym_mode = 0u;
#else
    (void)d;
#endif
}
