/**
 * @file idl_crc32c.h
 * @brief CRC-32C (Castagnoli, reflected, init and xorout 0xFFFFFFFF): the frame trailer and the
 *        replay cache's request digest. Same values as protocol/frame.py's crc32c.
 *
 * The implementation is chosen at compile time with IDL_CRC32C_TABLE:
 *   0  bitwise, no table (smallest code, ~8 cycles per bit);
 *   1  nibble table (default): 64 bytes of const data, four bytes at a time; with IDL_SMALL_CODE
 *      (the -Os default, idl_small.h) only its four basis rows, 16 bytes, a byte at a time;
 *   2  byte table, 1 KiB of const data;
 *   3  slicing by 4, 4 KiB of const data (fastest).
 */
#ifndef IDL_CRC32C_H
#define IDL_CRC32C_H

#include "idl_checkreturn.h"

#include <stddef.h>
#include <stdint.h>

#include "idemlink_proto.h"

#ifndef IDL_CRC32C_TABLE
#define IDL_CRC32C_TABLE 1
#endif
#if IDL_CRC32C_TABLE < 0 || IDL_CRC32C_TABLE > 3
#error "IDL_CRC32C_TABLE must be 0 (bitwise), 1 (nibble table), 2 (byte table) or 3 (slicing by 4)"
#endif
#if IDL_CRC_POLY != 0x1EDC6F41u || IDL_CRC_INIT != 0xFFFFFFFFu || IDL_CRC_XOROUT != 0xFFFFFFFFu \
    || IDL_CRC_REFLECTED != 1u
#error "the contract's CRC is not the CRC-32C this file implements: regenerate and port"
#endif

/** CRC-32C register after n more bytes (start with IDL_CRC_INIT; no final xor). */
IDL_CHECKRETURN uint32_t idl_crc32c_update(uint32_t reg, const uint8_t *data, size_t n);

/** CRC-32C of a buffer (init and final xor applied): idl_crc32c("123456789") == IDL_CRC_CHECK. */
IDL_CHECKRETURN uint32_t idl_crc32c(const uint8_t *data, size_t n);

/** A frame followed by its own CRC (little-endian) always has this CRC (no xorout). */
#define IDL_CRC32C_RESIDUE_REG 0xB798B438u

#endif /* IDL_CRC32C_H */
