/* zck_damage: flips one bit inside one named record of a torch .pt (zip) file, for the
 * damage campaign (damage.sh).
 *
 *   zck_damage flip [--recrc] FILE WHAT
 *
 * WHAT picks the bytes:
 *   @fp32     the first non-empty tensor whose name holds "fp32_groups" or "fp32_flat_groups"
 *             (the fp32 master partition of a DeepSpeed ZeRO optimizer file)
 *   @exp_avg  the first non-empty tensor whose name ends in ".exp_avg"
 *   @lp       the first non-empty bfloat16 / float16 tensor (16-bit weights of a model file)
 *   @data.pkl the pickle record itself
 *   NAME      the tensor with that exact dotted name
 * The bit flipped is bit 0 of the first byte of the middle element (the lowest mantissa
 * bit: a change no range or NaN check can see, only a checksum), or of the middle byte of
 * data.pkl.
 *
 * Which tensor is where comes from the library's torch reader; where each record's data
 * lies comes from this file's own walk of the zip central directory and local headers, so
 * the two are checked against each other: the flipped byte must lie inside one record's
 * data, the byte must read back changed, and the record's CRC-32 (zlib) must no longer
 * match the directory. --recrc then writes the new CRC into the local header and the
 * central directory: a valid zip holding other values, which only a manifest can tell
 * from the original. Prints one line saying what it did. Exit 0 done, 1 error, 2 nothing
 * of that kind in the file (the campaign marks the cell not applicable).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "torch/torch.h"
#include "zck.h"

static const char *g_file;

static void die(const char *what) {
  fprintf(stderr, "zck_damage: %s: %s\n", g_file, what);
  exit(1);
}

static uint32_t le16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le32(const unsigned char *p) { return le16(p) | le16(p + 2) << 16; }
static uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }
static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* ---- the zip directory, walked here (independent of the library's reader) */
typedef struct record {
  char name[512];
  uint64_t data_off, size; /* data bytes [data_off, data_off + size) */
  uint32_t crc;
  uint64_t cd_crc_pos, lh_crc_pos; /* where the CRC field sits in the file */
} record;

static unsigned char *g_buf;
static size_t g_len;
static record *g_rec;
static size_t g_nrec;

static void load(void) {
  int fd = open(g_file, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) die(strerror(errno));
  g_len = (size_t)st.st_size;
  g_buf = malloc(g_len ? g_len : 1);
  if (!g_buf || pread(fd, g_buf, g_len, 0) != (ssize_t)g_len) die("cannot read");
  close(fd);
}

static void walk_zip(void) {
  if (g_len < 22) die("too short for a zip");
  size_t eocd = g_len - 22;
  for (;; eocd--) {
    if (le32(g_buf + eocd) == 0x06054b50u) break;
    if (eocd == 0 || g_len - eocd > 22 + 65535) die("no end of central directory");
  }
  uint64_t n = le16(g_buf + eocd + 10), cd = le32(g_buf + eocd + 16);
  if (n == 0xFFFF || cd == 0xFFFFFFFFu) { /* zip64: the locator sits just before */
    if (eocd < 20 || le32(g_buf + eocd - 20) != 0x07064b50u) die("zip64 locator missing");
    uint64_t z = le64(g_buf + eocd - 12);
    if (z + 56 > g_len || le32(g_buf + z) != 0x06064b50u) die("zip64 end record missing");
    n = le64(g_buf + z + 32);
    cd = le64(g_buf + z + 48);
  }
  g_rec = calloc(n ? n : 1, sizeof *g_rec);
  if (!g_rec) die("out of memory");
  uint64_t p = cd;
  for (uint64_t i = 0; i < n; i++) {
    if (p + 46 > g_len || le32(g_buf + p) != 0x02014b50u) die("bad central directory entry");
    const unsigned char *c = g_buf + p;
    record *r = &g_rec[g_nrec++];
    uint32_t nlen = le16(c + 28), xlen = le16(c + 30), clen = le16(c + 32);
    if (p + 46 + nlen + xlen > g_len || nlen >= sizeof r->name) die("bad central directory name");
    memcpy(r->name, c + 46, nlen);
    r->crc = le32(c + 16);
    r->cd_crc_pos = p + 16;
    uint64_t size = le32(c + 24), lh = le32(c + 42);
    if (le16(c + 10) != 0) die("a compressed record (torch files are stored)");
    /* zip64 extended information: only the fields whose 32-bit value is saturated */
    const unsigned char *x = c + 46 + nlen, *xend = x + xlen;
    while (x + 4 <= xend) {
      uint32_t id = le16(x), len = le16(x + 2);
      const unsigned char *f = x + 4;
      if (id == 1) {
        if (le32(c + 24) == 0xFFFFFFFFu) { size = le64(f); f += 8; }
        if (le32(c + 20) == 0xFFFFFFFFu) f += 8;
        if (le32(c + 42) == 0xFFFFFFFFu) lh = le64(f);
      }
      x += 4 + len;
    }
    if (lh + 30 > g_len || le32(g_buf + lh) != 0x04034b50u) die("bad local header");
    r->lh_crc_pos = lh + 14;
    r->data_off = lh + 30 + le16(g_buf + lh + 26) + le16(g_buf + lh + 28);
    r->size = size;
    if (r->data_off + size > g_len) die("record data past the end of the file");
    p += 46 + nlen + xlen + clen;
  }
}

static const record *record_holding(uint64_t off, uint64_t len) {
  for (size_t i = 0; i < g_nrec; i++)
    if (off >= g_rec[i].data_off && off + len <= g_rec[i].data_off + g_rec[i].size) return &g_rec[i];
  return NULL;
}

static uint32_t crc_of(const record *r) {
  return (uint32_t)crc32(crc32(0L, Z_NULL, 0), g_buf + r->data_off, (uInt)r->size);
}

/* ---- picking the bytes */
static int picks(const char *what, const char *name, const zck_torch_tensor *t) {
  if (zck_torch_tensor_nbytes(t) == 0) return 0;
  if (strcmp(what, "@fp32") == 0) return strstr(name, "fp32_groups") || strstr(name, "fp32_flat_groups");
  if (strcmp(what, "@exp_avg") == 0) {
    size_t n = strlen(name);
    return n >= 8 && strcmp(name + n - 8, ".exp_avg") == 0;
  }
  if (strcmp(what, "@lp") == 0) return t->dtype == ZCK_BF16 || t->dtype == ZCK_F16;
  return strcmp(what, name) == 0;
}

/* The byte to flip and a description of it; returns 0 when nothing matches. */
static int locate(const char *what, uint64_t *off, char *desc, size_t desc_len) {
  zck_torch_file *f = NULL;
  if (zck_torch_open(g_file, NULL, &f) != ZCK_OK) die(zck_last_error());
  int found = 0;
  if (strcmp(what, "@data.pkl") == 0) {
    char want[600];
    snprintf(want, sizeof want, "%s/data.pkl", zck_torch_prefix(f));
    for (size_t i = 0; i < g_nrec && !found; i++)
      if (strcmp(g_rec[i].name, want) == 0) {
        *off = g_rec[i].data_off + g_rec[i].size / 2;
        snprintf(desc, desc_len, "data.pkl");
        found = 1;
      }
  } else {
    zck_torch_named *v = NULL;
    size_t n = 0;
    if (zck_torch_state_dict(f, zck_torch_root(f), &v, &n) != ZCK_OK) die(zck_last_error());
    for (size_t i = 0; i < n && !found; i++) {
      const zck_torch_tensor *t = v[i].tensor;
      if (!picks(what, v[i].name, t)) continue;
      if (!zck_torch_tensor_contiguous(t)) die("the picked tensor is not contiguous");
      uint64_t esize = zck_dtype_size(t->dtype);
      uint64_t start = zck_torch_tensor_file_offset(f, t);
      *off = start + zck_torch_tensor_numel(t) / 2 * esize;
      snprintf(desc, desc_len, "tensor %s (%s, bytes %llu..%llu)", v[i].name, zck_dtype_name(t->dtype),
               (unsigned long long)start, (unsigned long long)(start + zck_torch_tensor_nbytes(t)));
      if (!record_holding(start, zck_torch_tensor_nbytes(t))) die("the picked tensor lies in no record's data");
      found = 1;
    }
    zck_torch_named_free(v, n);
  }
  zck_torch_close(f);
  return found;
}

static void write_back(void) {
  int fd = open(g_file, O_WRONLY);
  if (fd < 0 || pwrite(fd, g_buf, g_len, 0) != (ssize_t)g_len || close(fd) != 0) die(strerror(errno));
}

int main(int argc, char **argv) {
  int recrc = 0, a = 1;
  if (argc > 1 && strcmp(argv[1], "flip") == 0) a++;
  else a = argc; /* usage */
  if (a < argc && strcmp(argv[a], "--recrc") == 0) recrc = 1, a++;
  if (argc - a != 2) {
    fprintf(stderr, "usage: zck_damage flip [--recrc] FILE @fp32|@exp_avg|@lp|@data.pkl|TENSOR\n");
    return 1;
  }
  g_file = argv[a];
  const char *what = argv[a + 1];
  load();
  walk_zip();
  uint64_t off = 0;
  char desc[700];
  if (!locate(what, &off, desc, sizeof desc)) {
    printf("%s: no %s\n", g_file, what);
    return 2;
  }
  const record *found = record_holding(off, 1);
  if (!found) die("the byte to flip lies in no record's data");
  record rec = *found, *r = &rec; /* a copy: the directory is walked again below */
  if (r->crc != crc_of(r)) die("the record's CRC does not match before the damage");
  unsigned char before = g_buf[off];
  g_buf[off] ^= 1;
  uint32_t crc = crc_of(r);
  if (crc == r->crc) die("the flip left the CRC unchanged");
  if (recrc) {
    put32(g_buf + r->cd_crc_pos, crc);
    put32(g_buf + r->lh_crc_pos, crc);
  }
  write_back();
  /* read back: the damage is on disk, and where it was meant to be */
  unsigned char *want = g_buf;
  size_t want_len = g_len;
  g_buf = NULL;
  free(g_rec);
  g_rec = NULL;
  g_nrec = 0;
  load();
  walk_zip();
  if (g_len != want_len || memcmp(g_buf, want, g_len) != 0 || g_buf[off] == before) die("the damage did not reach the file");
  const record *again = record_holding(off, 1);
  if (!again || (crc_of(again) == again->crc) == !recrc) die("the record's CRC state is not what was meant");
  printf("%s: record %s: byte %llu (record bytes %llu..%llu, %s): 0x%02x -> 0x%02x; CRC %08x -> %08x%s\n", g_file,
         r->name, (unsigned long long)off, (unsigned long long)r->data_off,
         (unsigned long long)(r->data_off + r->size), desc, before, g_buf[off], r->crc, crc,
         recrc ? " (CRC fields rewritten: a valid zip)" : " (directory keeps the old CRC)");
  free(want);
  free(g_buf);
  free(g_rec);
  return 0;
}
