/* libFuzzer target: arbitrary bytes into a whole device (framed session + Modbus + registers).
 * The first bytes of the input steer the frames, the rest is split into chunks; the target checks
 * that nothing crashes or reads out of bounds (ASan/UBSan), that every answer is one delimited
 * frame within IDL_WIRE_MAX, and that the decoder never holds more than IDL_MAX_ENCODED bytes.
 * Half of the inputs are wrapped as valid REQUEST frames so the fuzzer reaches the registers. */
#include <stdlib.h>
#include <string.h>

#include "idl_files.h"
#include "idl_modbus.h"
#include "idl_name.h"
#include "idl_session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint16_t execute(void *ctx, const uint8_t *pdu, uint16_t len, uint8_t *resp,
                        uint32_t now, uint32_t seq)
{
    (void)seq;
    return idl_modbus_execute((idl_regs_t *)ctx, pdu, len, resp, now);
}

static void check_answer(const idl_session_t *s, size_t n)
{
    if (n == 0u) {
        return;
    }
    if (n < 2u + IDL_MIN_FRAME || n > IDL_WIRE_MAX || s->tx[0] != 0u || s->tx[n - 1u] != 0u
        || memchr(s->tx + 1, 0, n - 2u) != NULL) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static idl_regs_t regs;
    static idl_session_t session;
    static const uint8_t hash[IDL_MAP_HASH_LEN] = IDL_MAP_HASH_BYTES;
    static uint8_t wire[IDL_WIRE_MAX];
    static const idl_session_config_t cfg = { execute, &regs, "fuzz", "f-1", IDL_MAP_NAME, hash,
                                              32u };
    size_t i;
    uint32_t now = 0;
    if (size > 1u && data[0] == 0xFFu) { /* the name rules and FILE_INFO on raw bytes */
        uint8_t answer[IDL_MB_FILE_INFO_ANSWER_LEN];
        (void)idl_name_check(data + 1, size - 1u, 255u);
        if (idl_file_info_execute(data + 1, (uint16_t)(size - 1u > 300u ? 300u : size - 1u), answer,
                                  NULL, NULL) > sizeof answer) {
            abort();
        }
        return 0;
    }
    idl_regs_init(&regs, 100u, NULL, NULL, NULL, 0u);
    idl_session_init(&session, &cfg, 7u);
    if (size > 0u && (data[0] & 1u) != 0u) {
        /* each chunk [len, seq, bytes...] becomes one valid REQUEST frame */
        i = 1;
        while (i + 2u <= size) {
            size_t len = data[i] % 64u;
            uint32_t seq = data[i + 1u] % 16u;
            size_t n;
            size_t k;
            i += 2u;
            if (len > size - i) {
                len = size - i;
            }
            n = idl_frame_encode(wire, IDL_FT_REQUEST, 0u, 7u, seq, data + i, len);
            i += len;
            now += 40u;
            for (k = 0; k < n; k++) {
                check_answer(&session, idl_session_feed(&session, wire[k], now));
            }
        }
    } else {
        for (i = 0; i < size; i++) {
            check_answer(&session, idl_session_feed(&session, data[i], now));
            if (session.decoder.len > IDL_MAX_ENCODED) {
                abort();
            }
        }
    }
    return 0;
}
