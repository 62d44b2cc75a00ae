/* FILE_INFO and YMODEM storage on a POSIX directory (used by the posix port and the ctypes test
 * shim). */
#ifndef IDL_POSIX_FILES_H
#define IDL_POSIX_FILES_H

#include <stddef.h>
#include <stdint.h>

/** `dir`/`name`: 0 a regular file (*size, *crc = CRC-32C of its bytes), 1 absent (missing, a
 *  symlink, not a regular file; also when `dir` is NULL or not a directory of its own, e.g. a
 *  symlink), -1 unreadable or too large for a u32. */
int idl_posix_file_info(const char *dir, const uint8_t *name, uint8_t len, uint32_t *size,
                        uint32_t *crc);

/* One file at a time, as device_sim's DirectorySink: begin creates `dir` (if needed) and a hidden
 * `.ymodem-<random>.part` there (refused: 0 is success, -1 refused, when `name` exists and
 * !overwrite, or when `dir` is a symbolic link or not a directory); write at an offset; commit truncates to `size`, fsyncs and makes it visible under
 * its name (link, which fails on an existing name, or rename with overwrite); abort deletes the
 * temporary. */
int idl_posix_file_begin(const char *dir, const uint8_t *name, size_t len, int overwrite,
                         uint32_t (*random32)(void));
int idl_posix_file_write(uint32_t offset, const uint8_t *data, size_t n);
int idl_posix_file_commit(uint32_t size);
void idl_posix_file_abort(void);

#endif /* IDL_POSIX_FILES_H */
