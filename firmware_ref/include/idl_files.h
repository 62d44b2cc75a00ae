/**
 * @file idl_files.h
 * @brief 0x45 FILE_INFO (framed only, read-only): size and CRC-32C of a stored file, as
 *        device_sim/device.py answers it.
 *
 * Request `45 len:u8 name`: shorter than 2 bytes, a length that disagrees with the PDU, or a name
 * idl_name_check() refuses (at most IDL_MB_MAX_FILE_INFO_NAME bytes) -> exception 03. The
 * receiver's own temporaries (".ymodem-*.part") are never committed files: ABSENT without asking.
 * Otherwise the port's `lookup` says: present (answer `45 00 size:u32 crc32c:u32`, big-endian),
 * absent (`45 01 0 0`) or failed (exception 04: unreadable, or larger than a u32 can say).
 */
#ifndef IDL_FILES_H
#define IDL_FILES_H

#include "idl_checkreturn.h"

#include <stdint.h>

#include "idemlink_proto.h"

/** Look a file up by its (checked) name: 0 present with *size and *crc filled, 1 absent,
 *  -1 failed. */
typedef int (*idl_file_lookup_fn)(void *ctx, const uint8_t *name, uint8_t len, uint32_t *size,
                                  uint32_t *crc);

/** Answer one 0x45 PDU into `resp` (at least IDL_MB_FILE_INFO_ANSWER_LEN bytes); returns the
 *  answer's length. */
IDL_CHECKRETURN uint16_t idl_file_info_execute(const uint8_t *pdu, uint16_t len, uint8_t *resp,
                               idl_file_lookup_fn lookup, void *ctx);

#endif /* IDL_FILES_H */
