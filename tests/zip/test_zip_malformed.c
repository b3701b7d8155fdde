/* test_zip_malformed.c: one hand-made corrupt archive per failure mode of the zip reader,
 * each built from a valid archive by changing bytes, each checked for its status and its
 * one-line message (the file's name and what is wrong, no internal check code). With ZCK_ZIP_DUMP_DIR set, every crafted file
 * is also written there (that is how the fuzz seed corpus was made). */
#include "test.h"
#include "zip/zip.h"

#include <stdbool.h>

static const char *NAMES[] = {"a/d0", "a/d1", "a/d2"};
static const size_t SIZES[] = {10, 100, 2};
#define N 3

typedef struct { uint8_t *d; size_t n; } blob;

static blob build(bool zip64) {
  char *dir = zt_tmpdir();
  char *path = zck__path_join(dir, "base.zip");
  zck__outfile of;
  zck_zip_writer *w;
  ZT_OK(zck__outfile_create(&of, path));
  ZT_OK(zck_zip_writer_create(&of, &w));
  zck_zip_writer_force_zip64(w, zip64);
  for (size_t i = 0; i < N; i++) {
    uint8_t buf[100];
    for (size_t k = 0; k < SIZES[i]; k++) buf[k] = (uint8_t)('A' + i + k);
    ZT_OK(zck_zip_writer_add(w, NAMES[i], buf, SIZES[i]));
  }
  ZT_OK(zck_zip_writer_finish(w));
  zck_zip_writer_free(w);
  ZT_OK(zck__outfile_commit(&of));
  blob b;
  ZT_ASSERT(zt_read_file(path, &b.d, &b.n) == 0);
  free(path);
  free(dir);
  return b;
}

static blob copy(blob b) {
  blob c = {malloc(b.n + 256), b.n};
  memcpy(c.d, b.d, b.n);
  return c;
}

/* The archive without its ZIP64 end record and locator: a classic zip. */
static blob strip_zip64(blob b) {
  blob c = copy(b);
  memmove(c.d + c.n - 22 - 76, c.d + c.n - 22, 22);
  c.n -= 76;
  return c;
}

static size_t eocd(blob b) { return b.n - 22; }
static size_t z64eocd(blob b) { return b.n - 22 - 76; }
static size_t locator(blob b) { return b.n - 22 - 20; }
static size_t cd_off(blob b) { return (size_t)zck__le64(b.d + z64eocd(b) + 48); }
static size_t cd_entry(blob b, size_t i) {
  size_t p = cd_off(b);
  for (size_t k = 0; k < i; k++) p += 46 + zck__le16(b.d + p + 28) + zck__le16(b.d + p + 30) + zck__le16(b.d + p + 32);
  return p;
}
static size_t lho(blob b, size_t i) { return zck__le32(b.d + cd_entry(b, i) + 42); }

static int dumped;
static void dump(blob b, const char *tag) {
  const char *dir = getenv("ZCK_ZIP_DUMP_DIR");
  if (!dir) return;
  char path[512];
  snprintf(path, sizeof path, "%s/%02d-%s.zip", dir, dumped++, tag);
  ZT_ASSERT(zt_write_file(path, b.d, b.n) == 0);
}

/* Opening must fail with this status and a message containing both fragments. */
static void expect_open(blob b, const char *tag, zck_status st, const char *what) {
  dump(b, tag);
  zck__source src;
  zck__source_memory(&src, "bad.zip", b.d, b.n);
  zck_zip *z = (zck_zip *)1;
  zck_status s = zck_zip_open(&src, &z);
  if (s != st) ZT_FAIL("%s: expected %s, got %s (%s)", tag, zck_status_name(st), zck_status_name(s), zck_last_error());
  ZT_ASSERT(z == NULL);
  const char *msg = zck_last_error();
  if (!strstr(msg, "bad.zip: ") || !strstr(msg, what) || strstr(msg, "[Z-") || strchr(msg, '\n'))
    ZT_FAIL("%s: message \"%s\" lacks \"%s\" or is not one plain line", tag, msg, what);
  zck__source_close(&src);
  free(b.d);
}

static void put16(blob b, size_t at, uint16_t v) { ZT_ASSERT(at + 2 <= b.n); zck__put16(b.d + at, v); }
static void put32(blob b, size_t at, uint32_t v) { ZT_ASSERT(at + 4 <= b.n); zck__put32(b.d + at, v); }
static void put64(blob b, size_t at, uint64_t v) { ZT_ASSERT(at + 8 <= b.n); zck__put64(b.d + at, v); }

int main(void) {
  blob base = build(false), big = build(true), classic = strip_zip64(base);
  blob c;
  dump(base, "valid");
  dump(big, "valid-zip64");
  dump(classic, "valid-classic");

  /* all three bases open */
  blob bases[] = {base, big, classic};
  for (int i = 0; i < 3; i++) {
    zck__source src;
    zck_zip *z;
    zck__source_memory(&src, "ok.zip", bases[i].d, bases[i].n);
    ZT_OK(zck_zip_open(&src, &z));
    ZT_EQ_U64(zck_zip_count(z), N);
    zck_zip_close(z);
    zck__source_close(&src);
  }

  /* shorter than an end record */
  c = copy(base); c.n = 21;
  expect_open(c, "short", ZCK_ERR_FORMAT, "shorter than an end record");
  /* not PK\3\4 */
  c = copy(base); c.d[0] = 'X';
  expect_open(c, "magic", ZCK_ERR_FORMAT, "not PK\\3\\4");
  /* PYTORCH1 */
  c = copy(base); memcpy(c.d, "PYTORCH1", 8);
  expect_open(c, "pytorch1", ZCK_ERR_UNSUPPORTED, "PYTORCH1");
  /* the legacy pickle format */
  c = copy(base); memcpy(c.d, "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14);
  expect_open(c, "legacy", ZCK_ERR_UNSUPPORTED, "legacy (pre-1.6");
  /* an end record first, yet entries listed */
  c = copy(classic); memcpy(c.d, "PK\5\6", 4);
  expect_open(c, "endfirst", ZCK_ERR_FORMAT, "starts with an end record");

  /* no end record; an end record whose comment runs past the file */
  c = copy(base); c.d[eocd(c)] = 'X';
  expect_open(c, "noeocd", ZCK_ERR_FORMAT, "no end-of-central-directory");
  c = copy(base); put16(c, eocd(c) + 20, 1);
  expect_open(c, "comment", ZCK_ERR_FORMAT, "no end-of-central-directory");

  /* locator total disks, locator target, record size */
  c = copy(base); put32(c, locator(c) + 16, 2);
  expect_open(c, "disks", ZCK_ERR_UNSUPPORTED, "of 2 disks");
  c = copy(base); put64(c, locator(c) + 8, c.n - 50);
  expect_open(c, "locpast", ZCK_ERR_FORMAT, "leaves no room");
  c = copy(base); put64(c, locator(c) + 8, 0);
  expect_open(c, "loctarget", ZCK_ERR_FORMAT, "no ZIP64 end record at offset 0");
  c = copy(base); put64(c, z64eocd(c) + 4, 40);
  expect_open(c, "recsize", ZCK_ERR_FORMAT, "record size 40");

  /* counts on this disk != total; multi-disk; end records that disagree */
  c = copy(classic); put16(c, eocd(c) + 8, 2);
  expect_open(c, "ndisk", ZCK_ERR_FORMAT, "2 entries on this disk but 3 in total");
  c = copy(base); put64(c, z64eocd(c) + 24, 2); put16(c, eocd(c) + 8, 0xFFFF);
  expect_open(c, "ndisk64", ZCK_ERR_FORMAT, "2 entries on this disk but 3 in total");
  c = copy(classic); put16(c, eocd(c) + 4, 1);
  expect_open(c, "multidisk", ZCK_ERR_UNSUPPORTED, "multi-disk archive (disk 1, directory on disk 0)");
  c = copy(base); put16(c, eocd(c) + 10, 2);
  expect_open(c, "disagree", ZCK_ERR_FORMAT, "disagree");

  /* too many entries; a directory of 4 GiB */
  c = copy(big); put64(c, z64eocd(c) + 24, 1ull << 33); put64(c, z64eocd(c) + 32, 1ull << 33);
  expect_open(c, "count", ZCK_ERR_FORMAT, "more than 2^32-1");
  c = copy(big); put64(c, z64eocd(c) + 40, 1ull << 32);
  expect_open(c, "cdsize", ZCK_ERR_FORMAT, "4 GiB or more");

  /* directory too small for its entries; past the end records; bytes left over */
  c = copy(classic); put32(c, eocd(c) + 12, 100);
  expect_open(c, "cdsmall", ZCK_ERR_FORMAT, "cannot hold 3 entries");
  c = copy(classic); put32(c, eocd(c) + 16, zck__le32(c.d + eocd(c) + 16) + 1);
  expect_open(c, "cdpast", ZCK_ERR_FORMAT, "runs past the end records");
  c = copy(classic); put16(c, eocd(c) + 8, 2); put16(c, eocd(c) + 10, 2);
  expect_open(c, "cdtrail", ZCK_ERR_FORMAT, "bytes after its 2 entries");

  c = copy(classic); put16(c, eocd(c) + 8, 0); put16(c, eocd(c) + 10, 0);
  expect_open(c, "cdnoentries", ZCK_ERR_FORMAT, "lists no entries");

  /* bad entry signature; a name running past the directory; a broken extra chain */
  c = copy(base); c.d[cd_entry(c, 1)] = 'Q';
  expect_open(c, "cdsig", ZCK_ERR_FORMAT, "bad signature");
  c = copy(base); put16(c, cd_entry(c, 2) + 28, 200);
  expect_open(c, "cdname", ZCK_ERR_FORMAT, "run past the end of the directory");
  c = copy(big); put16(c, cd_entry(c, 0) + 46 + 4 + 2, 200);
  expect_open(c, "extra", ZCK_ERR_FORMAT, "extra field 0x0001 of 200 bytes");
  c = copy(base); put16(c, cd_entry(c, 2) + 28, 2); put16(c, cd_entry(c, 2) + 30, 2); /* name "a/", extra "d2" */
  expect_open(c, "extratail", ZCK_ERR_FORMAT, "2 stray bytes");

  /* stored entry whose sizes differ; a compressed entry of 0 bytes for 100 */
  c = copy(base); put32(c, cd_entry(c, 1) + 20, 99);
  expect_open(c, "compsize", ZCK_ERR_FORMAT, "compressed size 99 != uncompressed size 100");
  c = copy(base); put16(c, cd_entry(c, 1) + 10, 8); put32(c, cd_entry(c, 1) + 20, 0);
  expect_open(c, "compzero", ZCK_ERR_FORMAT, "100 bytes compressed into 0");

  /* local header + data past the entries area */
  c = copy(base); put32(c, cd_entry(c, 2) + 42, (uint32_t)cd_off(c) - 31);
  expect_open(c, "lhopast", ZCK_ERR_FORMAT, "runs past the entries area");

  /* entry on another disk */
  c = copy(base); put16(c, cd_entry(c, 1) + 34, 1);
  expect_open(c, "entrydisk", ZCK_ERR_UNSUPPORTED, "lives on disk 1");

  /* encryption and patch flags */
  c = copy(base); put16(c, cd_entry(c, 0) + 8, 0x0809);
  expect_open(c, "encrypted", ZCK_ERR_UNSUPPORTED, "\"a/d0\" is encrypted");
  c = copy(base); put16(c, cd_entry(c, 0) + 8, 0x0848);
  expect_open(c, "strongenc", ZCK_ERR_UNSUPPORTED, "is encrypted");
  c = copy(base); put16(c, cd_entry(c, 0) + 8, 0x0828);
  expect_open(c, "patch", ZCK_ERR_UNSUPPORTED, "patch data");

  /* no local header where the directory says; data past the entries area */
  c = copy(base); c.d[lho(c, 1)] = 'Q';
  expect_open(c, "localsig", ZCK_ERR_FORMAT, "no local header at offset");
  c = copy(base); put16(c, lho(c, 2) + 28, 60000);
  expect_open(c, "localextra", ZCK_ERR_FORMAT, "runs past the entries area");

  /* local name differs from the directory's; local name length differs */
  c = copy(base); c.d[lho(c, 1) + 30 + 3] = '7';
  expect_open(c, "localname", ZCK_ERR_FORMAT, "names \"a/d7\"");
  c = copy(base); put16(c, lho(c, 1) + 26, 3);
  expect_open(c, "localnamelen", ZCK_ERR_FORMAT, "(3 bytes) instead");

  /* sentinels without a ZIP64 field; ZIP64 field too short; end record sentinels */
  c = copy(base); put32(c, cd_entry(c, 1) + 20, 0xFFFFFFFF); put32(c, cd_entry(c, 1) + 24, 0xFFFFFFFF);
  expect_open(c, "sentinel", ZCK_ERR_FORMAT, "without a ZIP64 extra field");
  c = copy(big); put16(c, cd_entry(c, 0) + 46 + 4 + 2, 16); put16(c, cd_entry(c, 0) + 30, 20);
  expect_open(c, "z64short", ZCK_ERR_FORMAT, "sentinels need 24");
  c = copy(classic); put32(c, eocd(c) + 16, 0xFFFFFFFF);
  expect_open(c, "eocdsentinel", ZCK_ERR_FORMAT, "no ZIP64 locator");

  /* offset + size overflow (ZIP64 values) */
  c = copy(big); put64(c, cd_entry(c, 0) + 46 + 4 + 4 + 16, UINT64_MAX - 8);
  expect_open(c, "overflow", ZCK_ERR_FORMAT, "overflows");
  c = copy(big); put64(c, cd_entry(c, 0) + 46 + 4 + 4, UINT64_MAX - 2); put64(c, cd_entry(c, 0) + 46 + 4 + 4 + 8, UINT64_MAX - 2);
  expect_open(c, "overflowsize", ZCK_ERR_FORMAT, "overflows");

  /* an entry whose data runs over the next entry's local header */
  c = copy(base); put32(c, cd_entry(c, 0) + 20, 200); put32(c, cd_entry(c, 0) + 24, 200);
  expect_open(c, "overlap", ZCK_ERR_FORMAT, "\"a/d0\" (bytes 0..");

  /* duplicate names; names equal up to case */
  c = copy(base); c.d[cd_entry(c, 1) + 46 + 3] = '0';
  expect_open(c, "duplicate", ZCK_ERR_FORMAT, "duplicate entry name \"a/d0\"");
  c = copy(base); memcpy(c.d + cd_entry(c, 1) + 46, "A/D0", 4);
  expect_open(c, "case", ZCK_ERR_FORMAT, "\"a/d0\" and \"A/D0\" differ only in case");

  /* NUL, leading '/', backslash, '..' */
  c = copy(base); c.d[cd_entry(c, 1) + 46 + 1] = 0;
  expect_open(c, "nul", ZCK_ERR_FORMAT, "NUL byte");
  c = copy(base); memcpy(c.d + cd_entry(c, 1) + 46, "/a/d", 4);
  expect_open(c, "absolute", ZCK_ERR_FORMAT, "leading '/'");
  c = copy(base); c.d[cd_entry(c, 1) + 46 + 1] = '\\';
  expect_open(c, "backslash", ZCK_ERR_FORMAT, "backslash");
  c = copy(base); memcpy(c.d + cd_entry(c, 1) + 46, "../x", 4);
  expect_open(c, "dotdot", ZCK_ERR_FORMAT, "'..' path component");
  c = copy(base); put16(c, cd_entry(c, 1) + 28, 0); put16(c, cd_entry(c, 1) + 30, 4);
  expect_open(c, "emptyname", ZCK_ERR_FORMAT, "empty name");

  /* a compressed entry is listed, but reading it is unsupported */
  c = copy(base); put16(c, cd_entry(c, 1) + 10, 8);
  dump(c, "deflated");
  {
    zck__source src;
    zck_zip *z;
    zck__source_memory(&src, "m.zip", c.d, c.n);
    ZT_OK(zck_zip_open(&src, &z));
    const zck_zip_entry *e = zck_zip_find(z, "a/d1");
    ZT_EQ_INT(e->method, 8);
    uint8_t buf[100];
    ZT_ERR(zck_zip_read_entry(z, e, buf), ZCK_ERR_UNSUPPORTED, "m.zip: entry \"a/d1\" is compressed (method 8)");
    ZT_ERR(zck_zip_read_range(z, e, buf, 1, 0), ZCK_ERR_UNSUPPORTED, "m.zip: entry \"a/d1\" is compressed (method 8)");
    ZT_OK(zck_zip_read_entry(z, zck_zip_find(z, "a/d0"), buf));
    zck_zip_close(z);
    zck__source_close(&src);
  }
  free(c.d);

  /* a damaged data byte opens fine; the entry read reports the CRC, naming the entry */
  c = copy(base);
  {
    zck__source src;
    zck_zip *z;
    zck__source_memory(&src, "m.zip", c.d, c.n);
    ZT_OK(zck_zip_open(&src, &z));
    const zck_zip_entry *e = zck_zip_find(z, "a/d1");
    c.d[e->data_offset + 50] ^= 1;
    dump(c, "crc");
    uint8_t buf[100];
    ZT_ERR(zck_zip_read_entry(z, e, buf), ZCK_ERR_DAMAGED, "m.zip: entry \"a/d1\": CRC-32 mismatch");
    ZT_OK(zck_zip_read_range(z, e, buf, 100, 0)); /* ranges are not checked */
    zck_zip_close(z);
    zck__source_close(&src);
  }
  free(c.d);

  /* truncation anywhere fails cleanly (never crashes); every prefix of the archive */
  for (size_t n = 0; n < base.n; n++) {
    zck__source src;
    zck_zip *z = NULL;
    zck__source_memory(&src, "t.zip", base.d, n);
    ZT_ASSERT(zck_zip_open(&src, &z) != ZCK_OK);
    ZT_ASSERT(z == NULL);
    zck__source_close(&src);
  }
  /* an empty archive (just an end record) is valid and has no entries */
  {
    static const uint8_t empty[22] = {'P', 'K', 5, 6};
    zck__source src;
    zck_zip *z;
    zck__source_memory(&src, "e.zip", empty, sizeof empty);
    ZT_OK(zck_zip_open(&src, &z));
    ZT_EQ_U64(zck_zip_count(z), 0);
    ZT_ASSERT(zck_zip_find(z, "x") == NULL);
    zck_zip_close(z);
    zck__source_close(&src);
  }
  free(base.d);
  free(big.d);
  free(classic.d);
  return 0;
}
