/* FILE_INFO on a POSIX directory (used by the posix port and the ctypes test shim). */
#ifndef IDL_POSIX_FILES_H
#define IDL_POSIX_FILES_H

#include <stdint.h>

/** `dir`/`name`: 0 a regular file (*size, *crc = CRC-32C of its bytes), 1 absent (missing, a
 *  symlink, not a regular file; also when `dir` is NULL), -1 unreadable or too large for a u32. */
int idl_posix_file_info(const char *dir, const uint8_t *name, uint8_t len, uint32_t *size,
                        uint32_t *crc);

#endif /* IDL_POSIX_FILES_H */
