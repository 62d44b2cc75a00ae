/* The posix device's flash directory (--flash-dir), read and written like the Python simulator's
 * (device_sim/flash.py; tests/vectors/flash_files.json): config.json (the configuration, replaced
 * atomically), device_id (created once), map (the map it belongs to: another is refused), boots
 * (the boot counter), files/ (FILE_INFO and YMODEM). A symlink, FIFO or oversized file there is
 * refused, never followed; every refusal is one line on stderr and exit 1, nothing changed.
 * This file also implements the port's idl_port_unique_id, idl_port_flash_save/_load,
 * idl_port_file_info and the YMODEM storage hooks (idl_port.h). */
#ifndef IDL_POSIX_FLASH_H
#define IDL_POSIX_FLASH_H

#include <stddef.h>

/** The directory (NULL: no flash, nothing kept), the --device-id given (NULL: from device_id or
 *  drawn) and where 64 random bits come from (a drawn device id). Call first. */
void idl_posix_flash_use(const char *dir, const char *given_id,
                         unsigned long long (*random64)(void));

/** Create the directory with its parents and take its exclusive flock (the one `idemlink sim`
 *  takes), held until exit: one device per flash directory. Nothing without a directory. */
void idl_posix_flash_lock(void);

/** Every check of the directory before anything is written (files/, map, config.json, boots,
 *  device_id), then the map record, stale temporaries deleted, the device id created once and
 *  the boot counter incremented: returns the new boot count (0 without a directory). */
unsigned long long idl_posix_flash_start(void);

/** The bus address given (--address 1..247; 0: none given): kept in the directory's `address`
 *  file by idl_posix_flash_start (the simulator's format), which otherwise reads the kept one (a
 *  file without an address 1..247 is refused). idl_port_bus_address (IDL_BUS=1) returns it. Call
 *  before idl_posix_flash_start. */
void idl_posix_flash_address(long given);

/** Configuration saves since start (--stats flash_writes). */
unsigned long idl_posix_flash_writes(void);

/** 1 if s[0..n) is a device id: 1-64 characters of [A-Za-z0-9_.:-], a letter or digit first. */
int idl_posix_valid_id(const char *s, size_t n);

#endif /* IDL_POSIX_FLASH_H */
