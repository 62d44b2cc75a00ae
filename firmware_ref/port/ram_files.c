/* File storage in RAM for the QEMU ports (both boards): FILE_RECEIVE (YMODEM) appends files to
 * one area, FILE_INFO reads them back (size and CRC-32C); everything is lost at reset, as a
 * stand-in for a part's file storage. The board sets the area: IDL_RAM_FILES_BYTES (default
 * 256 KiB), IDL_RAM_FILES_COUNT files (8), names of at most IDL_RAM_FILES_NAME bytes
 * (IDL_YM_MAX_NAME). Implements idl_port_ymodem_block, idl_port_file_begin/write/commit/abort
 * and idl_port_file_info (idl_port.h). */
#include <string.h>

#include "idl_crc32c.h"
#include "idl_port.h"

#ifndef IDL_RAM_FILES_BYTES
#define IDL_RAM_FILES_BYTES (256u * 1024u)
#endif
#ifndef IDL_RAM_FILES_COUNT
#define IDL_RAM_FILES_COUNT 8u
#endif
#ifndef IDL_RAM_FILES_NAME
#define IDL_RAM_FILES_NAME IDL_YM_MAX_NAME
#endif
#define STORE_BYTES IDL_RAM_FILES_BYTES
#define STORE_FILES IDL_RAM_FILES_COUNT

typedef struct {
    uint8_t name[IDL_RAM_FILES_NAME];
    uint8_t len; /* 0: free */
    uint32_t start;
    uint32_t size;
} stored_file_t;

static uint8_t store[STORE_BYTES];
static uint32_t store_top; /* files are appended; a replaced file's old bytes stay unused */
static stored_file_t stored[STORE_FILES];
static uint8_t ymodem_block[IDL_YM_BLOCK_LARGE];
static uint8_t open_name[IDL_RAM_FILES_NAME];
static uint8_t open_len; /* 0: no file open */

static stored_file_t *find(const uint8_t *name, size_t len)
{
    unsigned i;
    for (i = 0; i < STORE_FILES; i++) {
        if (stored[i].len == len && len != 0u && memcmp(stored[i].name, name, len) == 0) {
            return &stored[i];
        }
    }
    return NULL;
}

uint8_t *idl_port_ymodem_block(void) { return ymodem_block; }

bool idl_port_file_begin(const uint8_t *name, size_t len, bool overwrite)
{
    if (len == 0u || len > sizeof open_name || (!overwrite && find(name, len) != NULL)) {
        return false;
    }
    memcpy(open_name, name, len);
    open_len = (uint8_t)len;
    return true;
}

bool idl_port_file_write(uint32_t offset, const uint8_t *data, size_t n)
{
    if (open_len == 0u || offset > STORE_BYTES - store_top || n > STORE_BYTES - store_top - offset) {
        return false;
    }
    memcpy(store + store_top + offset, data, n);
    return true;
}

bool idl_port_file_commit(uint32_t size)
{
    stored_file_t *slot = find(open_name, open_len);
    unsigned i;
    for (i = 0; slot == NULL && i < STORE_FILES; i++) { /* a new name: the first free entry */
        if (stored[i].len == 0u) {
            slot = &stored[i];
        }
    }
    if (open_len == 0u || slot == NULL || size > STORE_BYTES - store_top) {
        open_len = 0u;
        return false;
    }
    memcpy(slot->name, open_name, open_len);
    slot->len = open_len;
    slot->start = store_top;
    slot->size = size;
    store_top += size;
    open_len = 0u;
    return true;
}

void idl_port_file_abort(void) { open_len = 0u; }

int idl_port_file_info(const uint8_t *name, uint8_t len, uint32_t *size, uint32_t *crc)
{
    const stored_file_t *f = find(name, len);
    if (f == NULL) {
        return 1;
    }
    *size = f->size;
    *crc = idl_crc32c(store + f->start, f->size);
    return 0;
}
