/* FILE_INFO on a POSIX directory: see posix_files.h. Mirrors device_sim/device.py _file_info: a
 * symlink or anything but a regular file is absent; a file that cannot be read is a failure. */
#include "posix_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idl_crc32c.h"

int idl_posix_file_info(const char *dir, const uint8_t *name, uint8_t len, uint32_t *size,
                        uint32_t *crc)
{
    char path[4096 + 256];
    struct stat st;
    uint8_t buf[4096];
    uint32_t reg = IDL_CRC_INIT;
    unsigned long long total = 0;
    ssize_t n;
    int fd;
    if (dir == NULL) {
        return 1;
    }
    snprintf(path, sizeof path, "%s/%.*s", dir, (int)len, (const char *)name);
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        return (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) ? 1 : -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 1;
    }
    if ((unsigned long long)st.st_size > 0xFFFFFFFFull) {
        close(fd);
        return -1; /* the answer's size is a u32: such a file cannot be described */
    }
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        reg = idl_crc32c_update(reg, buf, (size_t)n);
        total += (unsigned long long)n;
    }
    close(fd);
    if (n < 0 || total > 0xFFFFFFFFull) {
        return -1;
    }
    *size = (uint32_t)total;
    *crc = reg ^ IDL_CRC_XOROUT;
    return 0;
}
