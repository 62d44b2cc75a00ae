/* FILE_INFO on a POSIX directory: see posix_files.h. Mirrors device_sim/device.py _file_info: a
 * symlink or anything but a regular file is absent; a file that cannot be read is a failure. A
 * directory that is a symbolic link is never followed (no file there; a batch is refused). */
#include "posix_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idl_crc32c.h"

/* `dir` is a directory of its own: not a symbolic link (never followed: the files would be
 * elsewhere), not another kind of file. */
static int real_dir(const char *dir)
{
    struct stat st;
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

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
    if (dir == NULL || !real_dir(dir)) {
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

/* ---- YMODEM storage: a hidden temporary, then link (or rename with overwrite) ---------------- */

static int tmp_fd = -1;
static char tmp_path[4096 + 64];
static char target_path[4096 + 256];
static char dir_path[4096];
static int replace_target;

static void sync_dir(void)
{
    int fd = open(dir_path, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int idl_posix_file_begin(const char *dir, const uint8_t *name, size_t len, int overwrite,
                         uint32_t (*random32)(void))
{
    struct stat st;
    int i;
    idl_posix_file_abort();
    if (dir == NULL || strlen(dir) >= sizeof dir_path) {
        return -1;
    }
    snprintf(dir_path, sizeof dir_path, "%s", dir);
    if ((mkdir(dir_path, 0700) != 0 && errno != EEXIST) || !real_dir(dir_path)) {
        return -1;
    }
    snprintf(target_path, sizeof target_path, "%s/%.*s", dir, (int)len, (const char *)name);
    if (!overwrite && lstat(target_path, &st) == 0) {
        return -1; /* never replace an existing file unless asked */
    }
    for (i = 0; i < 100 && tmp_fd < 0; i++) {
        snprintf(tmp_path, sizeof tmp_path, "%s/.ymodem-%08lx.part", dir,
                 (unsigned long)random32());
        tmp_fd = open(tmp_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
        if (tmp_fd < 0 && errno != EEXIST) {
            return -1;
        }
    }
    replace_target = overwrite;
    return tmp_fd >= 0 ? 0 : -1;
}

int idl_posix_file_write(uint32_t offset, const uint8_t *data, size_t n)
{
    size_t done = 0;
    if (tmp_fd < 0) {
        return -1;
    }
    while (done < n) {
        ssize_t k = pwrite(tmp_fd, data + done, n - done, (off_t)offset + (off_t)done);
        if (k <= 0) {
            return -1;
        }
        done += (size_t)k;
    }
    return 0;
}

int idl_posix_file_commit(uint32_t size)
{
    int fd = tmp_fd;
    if (fd < 0) {
        return -1;
    }
    if (ftruncate(fd, (off_t)size) != 0 || fchmod(fd, 0644) != 0 || fsync(fd) != 0) {
        idl_posix_file_abort();
        return -1;
    }
    close(fd);
    tmp_fd = -1;
    if (replace_target ? rename(tmp_path, target_path) != 0
                       : link(tmp_path, target_path) != 0) { /* link: never overwrite */
        unlink(tmp_path);
        return -1;
    }
    if (!replace_target) {
        unlink(tmp_path);
    }
    sync_dir();
    return 0;
}

void idl_posix_file_abort(void)
{
    if (tmp_fd >= 0) {
        close(tmp_fd);
        tmp_fd = -1;
        unlink(tmp_path);
    }
}
