/* fuzz_torch.c: libFuzzer target for the .pt reader: any bytes, opened as an in-memory
 * torch.save file, must open or fail cleanly; an opened file must name its tensors, read
 * each one (whole or first elements) and answer the weights_only check.
 * Inputs starting with "ZPKL" are instead: u8 storage count n (<= 16), n u16le record
 * sizes, then a data.pkl; the harness wraps them into a valid archive, so mutations reach
 * the persistent-id and tensor-geometry checks instead of the zip parser. */
#include "torch/torch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_entry(zck__buf *z, zck__buf *cd, const char *name, const uint8_t *p, size_t n) {
  uint32_t off = (uint32_t)z->len, crc = 0;   /* the reader checks CRCs only on whole-entry reads */
  uint16_t nl = (uint16_t)strlen(name);
  zck__buf_u32le(z, 0x04034b50); zck__buf_u16le(z, 0); zck__buf_u16le(z, 0); zck__buf_u16le(z, 0);
  zck__buf_u32le(z, 0); zck__buf_u32le(z, crc); zck__buf_u32le(z, (uint32_t)n); zck__buf_u32le(z, (uint32_t)n);
  zck__buf_u16le(z, nl); zck__buf_u16le(z, 0); zck__buf_append(z, name, nl); zck__buf_append(z, p, n);
  zck__buf_u32le(cd, 0x02014b50); zck__buf_u16le(cd, 0); zck__buf_u16le(cd, 0); zck__buf_u16le(cd, 0);
  zck__buf_u16le(cd, 0); zck__buf_u32le(cd, 0); zck__buf_u32le(cd, crc); zck__buf_u32le(cd, (uint32_t)n);
  zck__buf_u32le(cd, (uint32_t)n); zck__buf_u16le(cd, nl); zck__buf_u16le(cd, 0); zck__buf_u16le(cd, 0);
  zck__buf_u16le(cd, 0); zck__buf_u16le(cd, 0); zck__buf_u32le(cd, 0); zck__buf_u32le(cd, off);
  zck__buf_append(cd, name, nl);
}

/* The "ZPKL" form as a stored zip; 0 if the input is too short. */
static int synth(const uint8_t *d, size_t n, zck__buf *z) {
  if (n < 5) return 0;
  size_t ns = d[4] % 17, pos = 5;
  if (n < pos + 2 * ns) return 0;
  zck__buf cd;
  zck__buf_init(&cd);
  static uint8_t fill[65536];
  if (!fill[0])
    for (size_t i = 0; i < sizeof fill; i++) fill[i] = (uint8_t)(i * 37 + 11);
  put_entry(z, &cd, "archive/data.pkl", d + pos + 2 * ns, n - pos - 2 * ns);
  for (size_t i = 0; i < ns; i++) {
    char name[48];
    snprintf(name, sizeof name, "archive/data/%zu", i);
    put_entry(z, &cd, name, fill, zck__le16(d + pos + 2 * i));
  }
  put_entry(z, &cd, "archive/version", (const uint8_t *)"3\n", 2);
  uint32_t cd_off = (uint32_t)z->len;
  zck__buf_append(z, cd.data, cd.len);
  zck__buf_u32le(z, 0x06054b50); zck__buf_u16le(z, 0); zck__buf_u16le(z, 0);
  zck__buf_u16le(z, (uint16_t)(ns + 2)); zck__buf_u16le(z, (uint16_t)(ns + 2));
  zck__buf_u32le(z, (uint32_t)cd.len); zck__buf_u32le(z, cd_off); zck__buf_u16le(z, 0);
  zck__buf_free(&cd);
  return !z->failed;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zck__buf z;
  zck__buf_init(&z);
  if (size >= 4 && !memcmp(data, "ZPKL", 4)) {
    if (!synth(data, size, &z)) { zck__buf_free(&z); return 0; }
    data = z.data;
    size = z.len;
  }
  zck__source src;
  zck__source_memory(&src, "fuzz.pt", data, size);
  zck_torch_open_opts o = ZCK_TORCH_OPEN_OPTS_INIT;
  o.limits.max_depth = 64;
  o.limits.max_objects = 1 << 16;
  zck_torch_file *f = NULL;
  if (zck_torch_open_source(&src, &o, &f) == ZCK_OK) {
    zck_torch_named *v = NULL;
    size_t n = 0;
    if (zck_torch_state_dict(f, zck_torch_root(f), &v, &n) == ZCK_OK) zck_torch_named_free(v, n);
    (void)zck_torch_check_weights_only(f);
    uint8_t *buf = malloc(1 << 16);
    for (size_t i = 0; i < zck_torch_tensor_count(f); i++) {
      const zck_torch_tensor *t = zck_torch_tensor_at(f, i);
      uint64_t es = zck_dtype_size(t->dtype), cnt = t->numel;
      if (cnt * es > (1 << 16)) cnt = (1 << 16) / es;   /* expanded views can be huge */
      /* validated geometry reads; the only failure left is a record whose bytes do not match
       * its CRC-32 (checked as it is read) */
      zck_status rs = zck_torch_tensor_read(f, t, buf, 0, cnt);
      if (rs != ZCK_OK && rs != ZCK_ERR_DAMAGED) abort();
      rs = t->numel > 1 ? zck_torch_tensor_read(f, t, buf, t->numel - 1, 1) : ZCK_OK;
      if (rs != ZCK_OK && rs != ZCK_ERR_DAMAGED) abort();
      (void)zck_torch_tensor_contiguous(t);
      (void)zck_torch_tensor_file_offset(f, t);
    }
    free(buf);
    zck_torch_close(f);
  }
  zck__source_close(&src);
  zck__buf_free(&z);
  return 0;
}
