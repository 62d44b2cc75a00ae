/* FILE_INFO: see idl_files.h. */
#include "idl_files.h"

#include <stdbool.h>
#include <string.h>

#include "idl_name.h"

static const uint8_t TEMP_PREFIX[] = ".ymodem-";
static const uint8_t TEMP_SUFFIX[] = ".part";

static bool receive_temporary(const uint8_t *name, uint8_t len)
{
    size_t pre = sizeof TEMP_PREFIX - 1u;
    size_t suf = sizeof TEMP_SUFFIX - 1u;
    return len >= pre && len >= suf && memcmp(name, TEMP_PREFIX, pre) == 0
           && memcmp(name + len - suf, TEMP_SUFFIX, suf) == 0;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

uint16_t idl_file_info_execute(const uint8_t *pdu, uint16_t len, uint8_t *resp,
                               idl_file_lookup_fn lookup, void *ctx)
{
    uint32_t size = 0;
    uint32_t crc = 0;
    int found = 1;
    if (len < 2u || len != 2u + pdu[1]
        || idl_name_check(pdu + 2, pdu[1], IDL_MB_MAX_FILE_INFO_NAME) != IDL_NAME_OK) {
        resp[0] = (uint8_t)(IDL_MB_FC_FILE_INFO | IDL_MB_EXCEPTION_FLAG);
        resp[1] = (uint8_t)IDL_MB_EXC_ILLEGAL_DATA_VALUE;
        return 2u;
    }
    if (!receive_temporary(pdu + 2, pdu[1]) && lookup != NULL) {
        found = lookup(ctx, pdu + 2, pdu[1], &size, &crc);
    }
    if (found < 0) {
        resp[0] = (uint8_t)(IDL_MB_FC_FILE_INFO | IDL_MB_EXCEPTION_FLAG);
        resp[1] = (uint8_t)IDL_MB_EXC_SERVER_DEVICE_FAILURE;
        return 2u;
    }
    if (found != 0) {
        size = 0;
        crc = 0;
    }
    resp[0] = (uint8_t)IDL_MB_FC_FILE_INFO;
    resp[1] = found == 0 ? (uint8_t)IDL_MB_FILE_PRESENT : (uint8_t)IDL_MB_FILE_ABSENT;
    put32(resp + 2, size);
    put32(resp + 6, crc);
    return (uint16_t)IDL_MB_FILE_INFO_ANSWER_LEN;
}
