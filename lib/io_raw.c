/* io_raw.c: pread / pwrite of exactly n bytes with EINTR and short-count retries, early
 * writeback of big writes, and fsync of a path, each through fault injection. See io.h. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

zck_status zck__pread_all(int fd, void *data, size_t n, uint64_t off, const char *name) {
  uint8_t *p = data;
  while (n) {
    int fe = zck__io_fault(ZCK_IO_OP_READ);
    if (fe > 0) return zck__fail_errno(fe, "%s: read of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return zck__fail_errno(errno, "%s: read of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    }
    if (r == 0)
      return zck__fail(ZCK_ERR_TRUNCATED, "%s: truncated: file ends before offset %llu", name,
                       (unsigned long long)(off + n));
    p += r; n -= (size_t)r; off += (uint64_t)r;
  }
  return ZCK_OK;
}

/* Writes at least this big start their writeback at once (see io.h). */
#define ZCK__WRITE_BEHIND_BYTES ((size_t)1 << 20)
/* One pwrite copies at most this much into the page cache: on Linux 6.x (ext4) a 4 MiB
 * write cost ~5x the system time of the same bytes in 256 KiB writes
 * (tests/bench/results-checks-1e9-cold.txt). */
#define ZCK__WRITE_PIECE ((size_t)256 << 10)

zck_status zck__pwrite_all(int fd, const void *data, size_t n, uint64_t off, const char *name) {
  const uint8_t *p = data;
  size_t total = n;
  uint64_t start = off;
  while (n) {
    int fe = zck__io_fault(ZCK_IO_OP_WRITE);
    if (fe == -1 && n > 1) { /* short write, then the disk is full */
      ssize_t r = pwrite(fd, p, n / 2, (off_t)off);
      (void)r;
      fe = ENOSPC;
    }
    if (fe > 0) return zck__fail_errno(fe, "%s: write of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    ssize_t r = pwrite(fd, p, n < ZCK__WRITE_PIECE ? n : ZCK__WRITE_PIECE, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return zck__fail_errno(errno, "%s: write of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    }
    p += r; n -= (size_t)r; off += (uint64_t)r;
    /* a hint: on anything but a regular file it fails, and the fsync at commit is what
     * makes the data durable either way */
    if (total >= ZCK__WRITE_BEHIND_BYTES && (off - start >= ZCK__WRITE_BEHIND_BYTES || !n)) {
      (void)sync_file_range(fd, (off_t)start, (off_t)(off - start), SYNC_FILE_RANGE_WRITE);
      start = off;
    }
  }
  return ZCK_OK;
}

zck_status zck__fsync_path(const char *path, bool is_dir) {
  int fd = open(path, (is_dir ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return zck__fail_errno(errno, "%s: cannot open for fsync", path);
  int fe = zck__io_fault(ZCK_IO_OP_FSYNC);
  int r = fe ? -1 : fsync(fd);
  int e = fe ? fe : errno;
  close(fd);
  if (r != 0 && !(is_dir && e == EINVAL)) return zck__fail_errno(e, "%s: fsync failed", path);
  return ZCK_OK;
}
