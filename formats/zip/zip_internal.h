/* zip_internal.h: record layouts and helpers shared by the zip reader and writer.
 *
 * Byte layout (all little-endian, as torch.save writes it):
 *   local header   "PK\3\4" ver(2) flags(2) method(2) time(2) date(2) crc(4) comp(4) uncomp(4)
 *                  name_len(2) extra_len(2) | name | extra               (30 + n + x bytes)
 *   data           the stored bytes
 *   descriptor     "PK\7\8" crc(4) comp uncomp (u32 each, or u64 each for ZIP64 entries)
 *   central entry  "PK\1\2" made(2) ver(2) flags(2) method(2) time(2) date(2) crc(4) comp(4)
 *                  uncomp(4) name_len(2) extra_len(2) comment_len(2) disk(2) iattr(2) eattr(4)
 *                  local_header_offset(4) | name | extra | comment        (46 + n + x + c bytes)
 *   ZIP64 end      "PK\6\6" record_size(8) made(2) ver(2) disk(4) cd_disk(4) n_disk(8)
 *                  n_total(8) cd_size(8) cd_offset(8)                     (56 bytes)
 *   ZIP64 locator  "PK\6\7" disk(4) zip64_end_offset(8) total_disks(4)    (20 bytes)
 *   end record     "PK\5\6" disk(2) cd_disk(2) n_disk(2) n_total(2) cd_size(4) cd_offset(4)
 *                  comment_len(2) | comment                               (22 + c bytes)
 */
#ifndef ZCK_ZIP_INTERNAL_H
#define ZCK_ZIP_INTERNAL_H

#include "zip.h"

#define ZCK_ZIP_LOCAL_SIG 0x04034b50u
#define ZCK_ZIP_CENTRAL_SIG 0x02014b50u
#define ZCK_ZIP_DESCRIPTOR_SIG 0x08074b50u
#define ZCK_ZIP_END_SIG 0x06054b50u
#define ZCK_ZIP64_END_SIG 0x06064b50u
#define ZCK_ZIP64_LOCATOR_SIG 0x07064b50u

#define ZCK_ZIP_LOCAL_SIZE 30
#define ZCK_ZIP_CENTRAL_SIZE 46
#define ZCK_ZIP_END_SIZE 22
#define ZCK_ZIP64_END_SIZE 56
#define ZCK_ZIP64_LOCATOR_SIZE 20

#define ZCK_ZIP64_EXTRA_ID 0x0001
#define ZCK_ZIP_PAD_EXTRA_ID 0x4246 /* 'F','B': torch's alignment padding field */
#define ZCK_ZIP_ALIGN 64           /* torch's kFieldAlignment */
#define ZCK_ZIP_U32_MAX 0xFFFFFFFFu
#define ZCK_ZIP_U16_MAX 0xFFFFu

#define ZCK_ZIP_FLAG_ENCRYPTED 0x0001u
#define ZCK_ZIP_FLAG_DESCRIPTOR 0x0008u
#define ZCK_ZIP_FLAG_PATCH 0x0020u
#define ZCK_ZIP_FLAG_STRONG_ENCRYPTION 0x0040u
#define ZCK_ZIP_FLAG_UTF8 0x0800u

/* ---- name table: open addressing over entry indices, hashed case-insensitively so that
 * names equal up to case (ambiguous under miniz's case-insensitive lookup) collide. */
typedef const char *(*zck__zip_name_fn)(const void *ctx, size_t index);

typedef struct zck__zip_names {
  uint32_t *slot;   /* index + 1; 0 = empty */
  size_t cap;       /* power of two */
  size_t count;
} zck__zip_names;

bool zck__zip_names_init(zck__zip_names *t, size_t expected);
void zck__zip_names_free(zck__zip_names *t);
/* Index of the entry whose name equals `name` ignoring ASCII case, or SIZE_MAX. */
size_t zck__zip_names_find_nocase(const zck__zip_names *t, const char *name, zck__zip_name_fn fn, const void *ctx);
/* Index of the entry named exactly `name`, or SIZE_MAX. */
size_t zck__zip_names_find(const zck__zip_names *t, const char *name, zck__zip_name_fn fn, const void *ctx);
/* Inserts index (its name already absent up to case); grows as needed. */
bool zck__zip_names_insert(zck__zip_names *t, size_t index, zck__zip_name_fn fn, const void *ctx);

/* Why a name is unsafe (NULL if fine): empty, NUL byte, leading '/', '\\', a ".." component. */
const char *zck__zip_name_problem(const char *name, size_t len);
/* A printable, bounded copy of a name for one-line messages (non-printables as \xNN). */
void zck__zip_name_for_message(char *dst, size_t cap, const char *name, size_t len);

#endif
