/* zip_read.c: the zip reader. Opens an archive by its end records and central directory,
 * checks every entry against the file (each refusal one line naming the file and what is
 * wrong) and resolves each entry's data offset from its local header, so tensor bytes
 * are later read in place with one pread. Only the end records, the central directory and
 * the local headers are read at open. */
#include "zip_internal.h"

#include <stdlib.h>
#include <string.h>

struct zck_zip {
  const zck__source *src;
  zck_zip_entry *entries;
  size_t count;
  char *name_arena;       /* all names, NUL-terminated, one allocation */
  zck__zip_names names;
};

/* The central directory is read whole; beyond this it is a hostile file, not a checkpoint. */
#define ZCK_ZIP_MAX_CD ((uint64_t)1 << 30)
#define ZCK_ZIP_MAX_EOCD_SEARCH (0xFFFFu + ZCK_ZIP_END_SIZE)

#define ZFAIL(st, fmt, ...) zck__fail((st), "%s: " fmt, src->name, ##__VA_ARGS__)
#define ULL(x) ((unsigned long long)(x))

static const char *zck__zip_entry_name(const void *ctx, size_t i) { return ((const zck_zip *)ctx)->entries[i].name; }

/* ---- end records */

typedef struct {
  uint64_t n_entries, cd_size, cd_offset;
  uint64_t dir_end;        /* where the directory must end: the first end record */
  uint32_t disk;
} zck__zip_end;

static zck_status zck__zip_check_start(const zck__source *src, bool *empty_ok) {
  static const uint8_t legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  uint8_t head[sizeof legacy] = {0};
  size_t n = src->size < sizeof head ? (size_t)src->size : sizeof head;
  ZCK_TRY(zck__source_read(src, head, n, 0));
  if (n == sizeof head && !memcmp(head, legacy, sizeof legacy))
    return ZFAIL(ZCK_ERR_UNSUPPORTED, "legacy (pre-1.6 / non-zip) torch format, not a zip archive");
  if (n >= 8 && !memcmp(head, "PYTORCH1", 8))
    return ZFAIL(ZCK_ERR_UNSUPPORTED, "preview-format torch file (starts with PYTORCH1), not a zip archive");
  if (src->size < ZCK_ZIP_END_SIZE)
    return ZFAIL(ZCK_ERR_FORMAT, "not a zip archive: %llu bytes, shorter than an end record (22)", ULL(src->size));
  uint32_t sig = zck__le32(head);
  /* An archive with no entries starts with its end record. */
  *empty_ok = sig == ZCK_ZIP_END_SIG || sig == ZCK_ZIP64_END_SIG;
  if (sig != ZCK_ZIP_LOCAL_SIG && !*empty_ok)
    return ZFAIL(ZCK_ERR_FORMAT, "not a zip archive: starts with %02x %02x %02x %02x, not PK\\3\\4", head[0], head[1],
                 head[2], head[3]);
  return ZCK_OK;
}

static zck_status zck__zip_find_end(const zck__source *src, uint64_t *eocd_pos, uint8_t eocd[ZCK_ZIP_END_SIZE]) {
  uint64_t tail_len = src->size < ZCK_ZIP_MAX_EOCD_SEARCH ? src->size : ZCK_ZIP_MAX_EOCD_SEARCH;
  uint64_t tail_off = src->size - tail_len;
  uint8_t *buf = zck__malloc((size_t)tail_len);
  if (!buf) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__source_read(src, buf, (size_t)tail_len, tail_off);
  if (s != ZCK_OK) { free(buf); return s; }
  /* Backwards, the first signature whose comment fits inside the file. */
  for (size_t i = (size_t)tail_len - ZCK_ZIP_END_SIZE;; i--) {
    if (zck__le32(buf + i) == ZCK_ZIP_END_SIG && i + ZCK_ZIP_END_SIZE + zck__le16(buf + i + 20) <= tail_len) {
      memcpy(eocd, buf + i, ZCK_ZIP_END_SIZE);
      *eocd_pos = tail_off + i;
      free(buf);
      return ZCK_OK;
    }
    if (i == 0) break;
  }
  free(buf);
  return ZFAIL(ZCK_ERR_FORMAT, "not a zip archive: no end-of-central-directory record in the last %llu bytes",
               ULL(tail_len));
}

static zck_status zck__zip_read_end(const zck__source *src, zck__zip_end *end) {
  uint8_t e[ZCK_ZIP_END_SIZE] = {0};
  uint64_t pos = 0;
  ZCK_TRY(zck__zip_find_end(src, &pos, e));
  uint32_t disk = zck__le16(e + 4), cd_disk = zck__le16(e + 6);
  uint64_t n_disk = zck__le16(e + 8), n_total = zck__le16(e + 10);
  uint64_t cd_size = zck__le32(e + 12), cd_offset = zck__le32(e + 16);
  end->dir_end = pos;

  uint8_t loc[ZCK_ZIP64_LOCATOR_SIZE] = {0};
  bool zip64 = false;
  if (pos >= ZCK_ZIP64_LOCATOR_SIZE) {
    ZCK_TRY(zck__source_read(src, loc, sizeof loc, pos - ZCK_ZIP64_LOCATOR_SIZE));
    zip64 = zck__le32(loc) == ZCK_ZIP64_LOCATOR_SIG;
  }
  if (zip64) {
    uint64_t loc_pos = pos - ZCK_ZIP64_LOCATOR_SIZE;
    uint32_t z_disk = zck__le32(loc + 4), total_disks = zck__le32(loc + 16);
    uint64_t z_off = zck__le64(loc + 8);
    if (total_disks != 1 || z_disk != 0)
      return ZFAIL(ZCK_ERR_UNSUPPORTED, "multi-disk archive: ZIP64 locator says disk %u of %u disks", z_disk, total_disks);
    if (z_off > loc_pos || loc_pos - z_off < ZCK_ZIP64_END_SIZE)
      return ZFAIL(ZCK_ERR_FORMAT, "ZIP64 locator at offset %llu points to offset %llu, which leaves no room for the 56-byte ZIP64 end record",
                   ULL(loc_pos), ULL(z_off));
    uint8_t z[ZCK_ZIP64_END_SIZE] = {0};
    ZCK_TRY(zck__source_read(src, z, sizeof z, z_off));
    if (zck__le32(z) != ZCK_ZIP64_END_SIG)
      return ZFAIL(ZCK_ERR_FORMAT, "no ZIP64 end record at offset %llu (the locator's target)", ULL(z_off));
    uint64_t rec = zck__le64(z + 4);
    if (rec < 44 || rec > loc_pos - z_off - 12)
      return ZFAIL(ZCK_ERR_FORMAT, "ZIP64 end record at offset %llu: record size %llu is outside 44..%llu", ULL(z_off),
                   ULL(rec), ULL(loc_pos - z_off - 12));
    uint64_t z_n_disk = zck__le64(z + 24), z_n_total = zck__le64(z + 32);
    uint64_t z_cd_size = zck__le64(z + 40), z_cd_offset = zck__le64(z + 48);
    /* Classic fields that are not sentinels must agree, or readers that use one or the
     * other would see different archives. */
    if ((n_total != ZCK_ZIP_U16_MAX && n_total != z_n_total) || (n_disk != ZCK_ZIP_U16_MAX && n_disk != z_n_disk) ||
        (cd_size != ZCK_ZIP_U32_MAX && cd_size != z_cd_size) || (cd_offset != ZCK_ZIP_U32_MAX && cd_offset != z_cd_offset))
      return ZFAIL(ZCK_ERR_FORMAT,
                   "end record (%llu entries, directory %llu bytes at %llu) and ZIP64 end record (%llu entries, %llu bytes at %llu) disagree",
                   ULL(n_total), ULL(cd_size), ULL(cd_offset), ULL(z_n_total), ULL(z_cd_size), ULL(z_cd_offset));
    disk = zck__le32(z + 16);
    cd_disk = zck__le32(z + 20);
    n_disk = z_n_disk;
    n_total = z_n_total;
    cd_size = z_cd_size;
    cd_offset = z_cd_offset;
    end->dir_end = z_off;
  } else if (cd_size == ZCK_ZIP_U32_MAX || cd_offset == ZCK_ZIP_U32_MAX) {
    return ZFAIL(ZCK_ERR_FORMAT, "end record holds ZIP64 sentinel values but there is no ZIP64 locator");
  }
  if (!((disk == 0 && cd_disk == 0) || (disk == 1 && cd_disk == 1)))
    return ZFAIL(ZCK_ERR_UNSUPPORTED, "multi-disk archive (disk %u, directory on disk %u)", disk, cd_disk);
  if (n_disk != n_total)
    return ZFAIL(ZCK_ERR_FORMAT, "end record: %llu entries on this disk but %llu in total", ULL(n_disk), ULL(n_total));
  if (n_total > ZCK_ZIP_U32_MAX)
    return ZFAIL(ZCK_ERR_FORMAT, "end record: %llu entries, more than 2^32-1", ULL(n_total));
  if (cd_size >= ((uint64_t)1 << 32))
    return ZFAIL(ZCK_ERR_FORMAT, "central directory of %llu bytes (4 GiB or more)", ULL(cd_size));
  if (cd_size < n_total * ZCK_ZIP_CENTRAL_SIZE)
    return ZFAIL(ZCK_ERR_FORMAT, "central directory of %llu bytes cannot hold %llu entries", ULL(cd_size), ULL(n_total));
  uint64_t cd_end;
  if (!zck__add_u64(cd_offset, cd_size, &cd_end) || cd_end > end->dir_end)
    return ZFAIL(ZCK_ERR_FORMAT, "central directory (%llu bytes at offset %llu) runs past the end records at offset %llu",
                 ULL(cd_size), ULL(cd_offset), ULL(end->dir_end));
  end->n_entries = n_total;
  end->cd_size = cd_size;
  end->cd_offset = cd_offset;
  end->disk = disk;
  return ZCK_OK;
}

/* ---- central directory */

/* Reads the ZIP64 extra field's values for the fields that hold sentinels. */
static zck_status zck__zip_parse_extra(const zck__source *src, const char *shown, const uint8_t *x, size_t xlen,
                                       uint64_t *uncomp, uint64_t *comp, uint64_t *lho, uint32_t *disk) {
  bool need_u = *uncomp == ZCK_ZIP_U32_MAX, need_c = *comp == ZCK_ZIP_U32_MAX, need_o = *lho == ZCK_ZIP_U32_MAX;
  bool need_d = *disk == ZCK_ZIP_U16_MAX, seen = false;
  size_t q = 0;
  while (q < xlen) {
    if (xlen - q < 4)
      return ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": extra field ends with %zu stray bytes", shown, xlen - q);
    uint16_t id = zck__le16(x + q), len = zck__le16(x + q + 2);
    q += 4;
    if (len > xlen - q)
      return ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": extra field 0x%04x of %u bytes runs past the %zu-byte extra area", shown,
                   id, len, xlen);
    if (id == ZCK_ZIP64_EXTRA_ID && !seen) {
      seen = true;
      size_t want = 8u * (need_u + need_c + need_o) + 4u * need_d, r = q;
      if (len < want)
        return ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": ZIP64 extra field has %u bytes but the sentinels need %zu", shown,
                     len, want);
      if (need_u) { *uncomp = zck__le64(x + r); r += 8; }
      if (need_c) { *comp = zck__le64(x + r); r += 8; }
      if (need_o) { *lho = zck__le64(x + r); r += 8; }
      if (need_d) { *disk = zck__le32(x + r); }
    }
    q += len;
  }
  if (!seen && (need_u || need_c || need_o || need_d))
    return ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": ZIP64 sentinel (0xFFFFFFFF) without a ZIP64 extra field", shown);
  return ZCK_OK;
}

static zck_status zck__zip_parse_cd(zck_zip *z, const zck__zip_end *end, const uint8_t *cd, uint64_t *lhos) {
  const zck__source *src = z->src;
  size_t p = 0, cd_size = (size_t)end->cd_size;
  char *arena = z->name_arena;
  char shown[96];
  for (size_t i = 0; i < z->count; i++) {
    uint64_t at = end->cd_offset + p;
    if (cd_size - p < ZCK_ZIP_CENTRAL_SIZE)
      return ZFAIL(ZCK_ERR_FORMAT, "central directory entry %zu at offset %llu: header runs past the end of the directory", i,
                   ULL(at));
    const uint8_t *h = cd + p;
    if (zck__le32(h) != ZCK_ZIP_CENTRAL_SIG)
      return ZFAIL(ZCK_ERR_FORMAT, "central directory entry %zu at offset %llu: bad signature %08x", i, ULL(at), zck__le32(h));
    uint16_t flags = zck__le16(h + 8), method = zck__le16(h + 10);
    uint32_t crc = zck__le32(h + 16);
    uint64_t comp = zck__le32(h + 20), uncomp = zck__le32(h + 24), lho = zck__le32(h + 42);
    size_t nlen = zck__le16(h + 28), xlen = zck__le16(h + 30), clen = zck__le16(h + 32);
    uint32_t disk = zck__le16(h + 34);
    if (cd_size - p - ZCK_ZIP_CENTRAL_SIZE < nlen + xlen + clen)
      return ZFAIL(ZCK_ERR_FORMAT, "central directory entry %zu at offset %llu: name, extra and comment (%zu bytes) run past the end of the directory",
                   i, ULL(at), nlen + xlen + clen);
    const char *name = (const char *)h + ZCK_ZIP_CENTRAL_SIZE;
    zck__zip_name_for_message(shown, sizeof shown, name, nlen);
    const char *bad = zck__zip_name_problem(name, nlen);
    if (bad) return ZFAIL(ZCK_ERR_FORMAT, "central directory entry %zu \"%s\": unsafe name: %s", i, shown, bad);
    if (flags & (ZCK_ZIP_FLAG_ENCRYPTED | ZCK_ZIP_FLAG_STRONG_ENCRYPTION))
      return ZFAIL(ZCK_ERR_UNSUPPORTED, "entry \"%s\" is encrypted (flags 0x%04x)", shown, flags);
    if (flags & ZCK_ZIP_FLAG_PATCH)
      return ZFAIL(ZCK_ERR_UNSUPPORTED, "entry \"%s\" holds patch data (flags 0x%04x)", shown, flags);
    ZCK_TRY(zck__zip_parse_extra(src, shown, h + ZCK_ZIP_CENTRAL_SIZE + nlen, xlen, &uncomp, &comp, &lho, &disk));
    if (disk != end->disk)
      return ZFAIL(ZCK_ERR_UNSUPPORTED, "entry \"%s\" lives on disk %u (multi-disk archive)", shown, disk);
    if (method == 0 && comp != uncomp)
      return ZFAIL(ZCK_ERR_FORMAT, "stored entry \"%s\": compressed size %llu != uncompressed size %llu", shown, ULL(comp),
                   ULL(uncomp));
    if (method != 0 && uncomp > 0 && comp == 0)
      return ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": %llu bytes compressed into 0", shown, ULL(uncomp));
    uint64_t end_min;
    if (!zck__add_u64(lho, ZCK_ZIP_LOCAL_SIZE, &end_min) || !zck__add_u64(end_min, comp, &end_min))
      return ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": local header offset %llu + size %llu overflows", shown, ULL(lho), ULL(comp));
    if (end_min > end->cd_offset)
      return ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": local header at offset %llu + 30 + %llu data bytes runs past the entries area (%llu bytes; file %llu)",
                   shown, ULL(lho), ULL(comp), ULL(end->cd_offset), ULL(src->size));
    memcpy(arena, name, nlen);
    arena[nlen] = 0;
    zck_zip_entry *e = &z->entries[i];
    e->name = arena;
    arena += nlen + 1;
    e->size = uncomp;
    e->comp_size = comp;
    e->crc32 = crc;
    e->method = method;
    lhos[i] = lho;
    size_t other = zck__zip_names_find_nocase(&z->names, e->name, zck__zip_entry_name, z);
    if (other != SIZE_MAX) {
      if (strcmp(z->entries[other].name, e->name)) {
        char shown2[96];
        zck__zip_name_for_message(shown2, sizeof shown2, z->entries[other].name, strlen(z->entries[other].name));
        return ZFAIL(ZCK_ERR_FORMAT, "entry names \"%s\" and \"%s\" differ only in case", shown2, shown);
      }
      return ZFAIL(ZCK_ERR_FORMAT, "duplicate entry name \"%s\" (central directory entries %zu and %zu)", shown, other, i);
    }
    if (!zck__zip_names_insert(&z->names, i, zck__zip_entry_name, z)) return ZCK_ERR_NO_MEMORY;
    p += ZCK_ZIP_CENTRAL_SIZE + nlen + xlen + clen;
  }
  if (p != cd_size)
    return ZFAIL(ZCK_ERR_FORMAT, "central directory has %zu bytes after its %zu entries", cd_size - p, z->count);
  return ZCK_OK;
}

/* ---- local headers and data ranges */

typedef struct { uint64_t start, end; size_t index; } zck__zip_range;

static int zck__zip_range_cmp(const void *a, const void *b) {
  const zck__zip_range *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

static zck_status zck__zip_resolve_locals(zck_zip *z, const zck__zip_end *end, const uint64_t *lhos, zck__zip_range *ranges) {
  const zck__source *src = z->src;
  uint8_t *buf = zck__malloc(ZCK_ZIP_LOCAL_SIZE + 0xFFFF);
  if (!buf) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  char shown[96], lshown[96];
  for (size_t i = 0; i < z->count && s == ZCK_OK; i++) {
    zck_zip_entry *e = &z->entries[i];
    size_t nlen = strlen(e->name);
    zck__zip_name_for_message(shown, sizeof shown, e->name, nlen);
    /* The central directory check put lho + 30 inside the file; the name may not be. */
    uint64_t avail = end->cd_offset - lhos[i];
    size_t want = ZCK_ZIP_LOCAL_SIZE + nlen;
    if (want > avail) want = (size_t)avail;
    s = zck__source_read(src, buf, want, lhos[i]);
    if (s != ZCK_OK) break;
    if (zck__le32(buf) != ZCK_ZIP_LOCAL_SIG) {
      s = ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": no local header at offset %llu (found %08x)", shown, ULL(lhos[i]), zck__le32(buf));
      break;
    }
    size_t lnlen = zck__le16(buf + 26), lxlen = zck__le16(buf + 28);
    if (lnlen != nlen || want < ZCK_ZIP_LOCAL_SIZE + nlen || memcmp(buf + ZCK_ZIP_LOCAL_SIZE, e->name, nlen)) {
      size_t have = want - ZCK_ZIP_LOCAL_SIZE < lnlen ? want - ZCK_ZIP_LOCAL_SIZE : lnlen;
      zck__zip_name_for_message(lshown, sizeof lshown, (const char *)buf + ZCK_ZIP_LOCAL_SIZE, have);
      s = ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": local header at offset %llu names \"%s\" (%zu bytes) instead", shown,
                ULL(lhos[i]), lshown, lnlen);
      break;
    }
    uint64_t data_end = lhos[i] + ZCK_ZIP_LOCAL_SIZE + lnlen + lxlen; /* < 2^64: lho < cd_offset, the rest < 2^17 */
    e->data_offset = data_end;
    if (!zck__add_u64(data_end, e->comp_size, &data_end)) {
      s = ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": data offset %llu + size %llu overflows", shown, ULL(e->data_offset), ULL(e->comp_size));
      break;
    }
    if (data_end > end->cd_offset) {
      s = ZFAIL(ZCK_ERR_FORMAT, "entry \"%s\": data (%llu bytes at offset %llu) runs past the entries area (central directory at %llu, file %llu bytes)",
                shown, ULL(e->comp_size), ULL(e->data_offset), ULL(end->cd_offset), ULL(src->size));
      break;
    }
    ranges[i] = (zck__zip_range){lhos[i], data_end, i};
  }
  free(buf);
  return s;
}

static zck_status zck__zip_check_overlaps(const zck_zip *z, zck__zip_range *r) {
  const zck__source *src = z->src;
  qsort(r, z->count, sizeof *r, zck__zip_range_cmp);
  for (size_t k = 1; k < z->count; k++) {
    if (r[k].start < r[k - 1].end) {
      char a[96], b[96];
      const char *na = z->entries[r[k - 1].index].name, *nb = z->entries[r[k].index].name;
      zck__zip_name_for_message(a, sizeof a, na, strlen(na));
      zck__zip_name_for_message(b, sizeof b, nb, strlen(nb));
      return ZFAIL(ZCK_ERR_FORMAT, "entries \"%s\" (bytes %llu..%llu) and \"%s\" (from byte %llu) overlap", a,
                   ULL(r[k - 1].start), ULL(r[k - 1].end), b, ULL(r[k].start));
    }
  }
  return ZCK_OK;
}

/* ---- open / close */

zck_status zck_zip_open(const zck__source *src, zck_zip **out) {
  *out = NULL;
  bool empty_ok = false;
  zck__zip_end end = {0};
  ZCK_TRY(zck__zip_check_start(src, &empty_ok));
  ZCK_TRY(zck__zip_read_end(src, &end));
  if (empty_ok && end.n_entries)
    return ZFAIL(ZCK_ERR_FORMAT, "not a zip archive: starts with an end record but lists %llu entries", ULL(end.n_entries));
  if (end.cd_size > ZCK_ZIP_MAX_CD)
    return ZFAIL(ZCK_ERR_LIMIT, "central directory of %llu bytes exceeds the %llu-byte limit", ULL(end.cd_size), ULL(ZCK_ZIP_MAX_CD));

  zck_status s = ZCK_ERR_NO_MEMORY;
  uint8_t *cd_copy = NULL;
  uint64_t *lhos = NULL;
  zck__zip_range *ranges = NULL;
  zck_zip *z = zck__calloc(1, sizeof *z);
  if (!z) return ZCK_ERR_NO_MEMORY;
  z->src = src;
  z->count = (size_t)end.n_entries;
  if (z->count) {
    /* Counts are bounded by cd_size / 46, and cd_size by the file: allocations follow the input. */
    z->entries = zck__calloc(z->count, sizeof *z->entries);
    z->name_arena = zck__malloc((size_t)end.cd_size);
    lhos = zck__malloc(z->count * sizeof *lhos);
    ranges = zck__malloc(z->count * sizeof *ranges);
    if (!z->entries || !z->name_arena || !lhos || !ranges) goto done;
  }
  if (!zck__zip_names_init(&z->names, z->count)) goto done;
  const uint8_t *cd = zck__source_peek(src, end.cd_offset, end.cd_size);
  if (!cd && end.cd_size) {
    cd_copy = zck__malloc((size_t)end.cd_size);
    if (!cd_copy) goto done;
    ZCK_CHECK_GOTO(zck__source_read(src, cd_copy, (size_t)end.cd_size, end.cd_offset), s, done);
    cd = cd_copy;
  }
  if (!z->count && end.cd_size) {
    s = ZFAIL(ZCK_ERR_FORMAT, "central directory has %llu bytes but the end record lists no entries", ULL(end.cd_size));
    goto done;
  }
  if (z->count) {
    ZCK_CHECK_GOTO(zck__zip_parse_cd(z, &end, cd, lhos), s, done);
    ZCK_CHECK_GOTO(zck__zip_resolve_locals(z, &end, lhos, ranges), s, done);
    ZCK_CHECK_GOTO(zck__zip_check_overlaps(z, ranges), s, done);
  }
  s = ZCK_OK;
done:
  free(cd_copy);
  free(lhos);
  free(ranges);
  if (s != ZCK_OK) {
    zck_zip_close(z);
    return s;
  }
  *out = z;
  return ZCK_OK;
}

void zck_zip_close(zck_zip *z) {
  if (!z) return;
  zck__zip_names_free(&z->names);
  free(z->entries);
  free(z->name_arena);
  free(z);
}

size_t zck_zip_count(const zck_zip *z) { return z->count; }

const zck_zip_entry *zck_zip_entry_at(const zck_zip *z, size_t i) { return i < z->count ? &z->entries[i] : NULL; }

const zck_zip_entry *zck_zip_find(const zck_zip *z, const char *name) {
  size_t i = zck__zip_names_find(&z->names, name, zck__zip_entry_name, z);
  return i == SIZE_MAX ? NULL : &z->entries[i];
}

const zck__source *zck_zip_source(const zck_zip *z) { return z->src; }

/* ---- reading entries */

zck_status zck_zip_read_range(const zck_zip *z, const zck_zip_entry *e, void *dst, uint64_t n, uint64_t off) {
  const zck__source *src = z->src;
  char shown[96];
  if (e->method != 0) {
    zck__zip_name_for_message(shown, sizeof shown, e->name, strlen(e->name));
    return ZFAIL(ZCK_ERR_UNSUPPORTED, "entry \"%s\" is compressed (method %u); zckpt reads only stored entries", shown,
                 e->method);
  }
  uint64_t stop;
  if (!zck__add_u64(off, n, &stop) || stop > e->size || n > SIZE_MAX) {
    zck__zip_name_for_message(shown, sizeof shown, e->name, strlen(e->name));
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: entry \"%s\": bytes %llu..%llu requested but the entry has %llu", src->name, shown,
                     ULL(off), ULL(off) + ULL(n), ULL(e->size));
  }
  return zck__source_read(src, dst, (size_t)n, e->data_offset + off);
}

zck_status zck_zip_read_entry(const zck_zip *z, const zck_zip_entry *e, void *dst) {
  ZCK_TRY(zck_zip_read_range(z, e, dst, e->size, 0));
  uint32_t crc = zck_crc32(0, dst, (size_t)e->size);
  if (crc != e->crc32) {
    const zck__source *src = z->src;
    char shown[96];
    zck__zip_name_for_message(shown, sizeof shown, e->name, strlen(e->name));
    return ZFAIL(ZCK_ERR_DAMAGED, "entry \"%s\": CRC-32 mismatch: the directory says %08x, the data has %08x", shown,
                 e->crc32, crc);
  }
  return ZCK_OK;
}
