/* test_st_roundtrip.c: every dtype (0-dim and empty tensors included) written by the
 * safetensors writer reads back identically; the header follows the reference's layout
 * (metadata first, dtype-descending then name order, spaces to a multiple of 8); a writer
 * that is not committed, or whose I/O fails, leaves nothing behind. */
#include "test.h"
#include "safetensors/safetensors.h"
#include "st_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void fill(uint8_t *p, uint64_t n, unsigned seed) {
  for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + seed * 17 + (i >> 8));
}

typedef struct { char name[64]; zck_st_dtype dt; int ndim; uint64_t shape[3]; } spec;

int main(void) {
  char *dir = zt_tmpdir();
  spec specs[ZCK_ST_DTYPE_COUNT * 3];
  size_t ns = 0;
  for (int t = 0; t < ZCK_ST_DTYPE_COUNT; t++) {
    const char *dn = zck_st_dtype_name((zck_st_dtype)t);
    spec *s = &specs[ns++];
    snprintf(s->name, sizeof s->name, "w.%s", dn);
    s->dt = (zck_st_dtype)t; s->ndim = 2; s->shape[0] = 3; s->shape[1] = 4;
    s = &specs[ns++];
    snprintf(s->name, sizeof s->name, "empty.%s", dn);
    s->dt = (zck_st_dtype)t; s->ndim = 3; s->shape[0] = 2; s->shape[1] = 0; s->shape[2] = 5;
    if (zck_st_dtype_bits((zck_st_dtype)t) % 8 == 0) { /* a lone F4/F6 scalar is not whole bytes */
      s = &specs[ns++];
      snprintf(s->name, sizeof s->name, "scalar.%s", dn);
      s->dt = (zck_st_dtype)t; s->ndim = 0;
    }
  }

  /* ---- write */
  zck_st_writer *w;
  ZT_OK(zck_st_writer_new(&w));
  ZT_OK(zck_st_writer_set_metadata(w, "producer", "zckpt \"test\"\n\xc3\xa9"));
  size_t idx[ZCK_ST_DTYPE_COUNT * 3];
  for (size_t i = 0; i < ns; i++) ZT_OK(zck_st_writer_add(w, specs[i].name, specs[i].dt, specs[i].ndim, specs[i].shape, &idx[i]));
  ZT_ERR(zck_st_writer_add(w, "w.F32", ZCK_ST_F32, 0, NULL, NULL), ZCK_ERR_INVALID_ARG, "added twice");
  ZT_ERR(zck_st_writer_add(w, "__metadata__", ZCK_ST_F32, 0, NULL, NULL), ZCK_ERR_INVALID_ARG, "__metadata__");
  ZT_ERR(zck_st_writer_add(w, "f4.scalar", ZCK_ST_F4, 0, NULL, NULL), ZCK_ERR_INVALID_ARG, "whole number of bytes");
  ZT_ERR(zck_st_writer_add(w, "bad\xff", ZCK_ST_F32, 0, NULL, NULL), ZCK_ERR_INVALID_ARG, "UTF-8");
  ZT_OK(zck_st_writer_layout(w));
  ZT_EQ_U64(zck_st_writer_count(w), ns);
  size_t hlen;
  const uint8_t *hdr = zck_st_writer_header(w, &hlen);
  ZT_EQ_U64((hlen - 8) % 8, 0);
  ZT_EQ_U64(zck_st_writer_tensor(w, idx[0])->offset >= hlen, 1);
  ZT_ASSERT(!memcmp(hdr + 8, "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"zckpt \\\"test\\\"\\n\xc3\xa9\"},\"empty.U64\":{\"dtype\":\"U64\",\"shape\":[2,0,5],\"data_offsets\":[0,0]},\"scalar.U64\":{\"dtype\":\"U64\",\"shape\":[],\"data_offsets\":[0,8]},\"w.U64\":{\"dtype\":\"U64\",\"shape\":[3,4],\"data_offsets\":[8,104]}",
                    strlen("{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"zckpt \\\"test\\\"\\n\xc3\xa9\"},\"empty.U64\":{\"dtype\":\"U64\",\"shape\":[2,0,5],\"data_offsets\":[0,0]},\"scalar.U64\":{\"dtype\":\"U64\",\"shape\":[],\"data_offsets\":[0,8]},\"w.U64\":{\"dtype\":\"U64\",\"shape\":[3,4],\"data_offsets\":[8,104]}")));
  /* reference order: dtype descending, then name; back to back */
  {
    uint64_t covered = 0;
    for (size_t i = 0; i < ns; i++) {
      const zck_st_tensor *t = zck_st_writer_tensor(w, idx[i]);
      for (size_t j = 0; j < ns; j++) {
        const zck_st_tensor *u = zck_st_writer_tensor(w, idx[j]);
        bool t_first = t->st_dtype > u->st_dtype || (t->st_dtype == u->st_dtype && strcmp(t->name, u->name) < 0);
        if (t_first) ZT_ASSERT(t->end <= u->begin);
      }
      covered += t->nbytes;
    }
    ZT_EQ_U64(hlen + covered, zck_st_writer_file_size(w));
  }

  char *path = zck__path_join(dir, "all.safetensors");
  ZT_OK(zck_st_writer_open(w, path));
  ZT_ASSERT(!exists(path));
  /* fill in reverse order, the big ones in two halves: order does not matter */
  uint8_t buf[1024];
  for (size_t k = ns; k-- > 0;) {
    const zck_st_tensor *t = zck_st_writer_tensor(w, idx[k]);
    fill(buf, t->nbytes, (unsigned)k);
    uint64_t half = t->nbytes / 2;
    ZT_OK(zck_st_writer_write(w, idx[k], buf + half, half, t->nbytes - half));
    ZT_OK(zck_st_writer_write(w, idx[k], buf, 0, half));
  }
  ZT_OK(zck_st_writer_commit(w));
  ZT_ASSERT(exists(path));
  zck_st_writer_free(w);
  ZT_EQ_INT(dir_entries(dir), 1); /* no temporary left */

  /* ---- read back from the file and from memory */
  size_t flen;
  char *image = st_slurp(path, &flen);
  ZT_ASSERT(image);
  for (int pass = 0; pass < 2; pass++) {
    zck_st_file *f;
    zck__source ms;
    if (pass == 0) ZT_OK(zck_st_open(path, &f));
    else {
      zck__source_memory(&ms, "mem.safetensors", image, flen);
      ZT_OK(zck_st_open_source(&ms, &f));
    }
    ZT_EQ_U64(zck_st_count(f), ns);
    ZT_EQ_U64(zck_st_file_size(f), flen);
    ZT_EQ_U64(zck_st_data_start(f), 8 + zck_st_header_len(f));
    ZT_EQ_INT(zck_st_warning_count(f), 0);
    ZT_ASSERT(zck_st_has_metadata(f));
    ZT_EQ_U64(zck_st_metadata_count(f), 2);
    ZT_EQ_STR(zck_st_metadata_get(f, "format"), "pt");
    ZT_EQ_STR(zck_st_metadata_get(f, "producer"), "zckpt \"test\"\n\xc3\xa9");
    ZT_ASSERT(zck_st_metadata_get(f, "nope") == NULL);
    const char *k0;
    zck_st_metadata_at(f, 0, &k0, NULL);
    ZT_EQ_STR(k0, "format");
    for (size_t i = 0; i < ns; i++) {
      const zck_st_tensor *t = zck_st_find(f, specs[i].name);
      ZT_ASSERT(t);
      ZT_EQ_INT(t->st_dtype, specs[i].dt);
      ZT_EQ_INT(t->dtype, zck_st_dtype_to_zck(specs[i].dt));
      ZT_EQ_INT(t->ndim, specs[i].ndim);
      uint64_t numel = 1;
      for (int d = 0; d < t->ndim; d++) { ZT_EQ_U64(t->shape[d], specs[i].shape[d]); numel *= specs[i].shape[d]; }
      if (t->ndim == 0) ZT_ASSERT(t->shape == NULL);
      ZT_EQ_U64(t->numel, numel);
      ZT_EQ_U64(t->nbytes, numel * zck_st_dtype_bits(specs[i].dt) / 8);
      ZT_EQ_U64(t->offset, zck_st_data_start(f) + t->begin);
      uint8_t got[1024], want[1024];
      fill(want, t->nbytes, (unsigned)i);
      ZT_OK(zck_st_read(f, t, got, 0, t->nbytes));
      ZT_EQ_MEM(got, want, t->nbytes);
      if (t->nbytes > 3) {
        ZT_OK(zck_st_read(f, t, got, 2, 1));
        ZT_EQ_INT(got[0], want[2]);
      }
    }
    ZT_ASSERT(zck_st_find(f, "missing") == NULL);
    /* header order == the writer's order */
    for (size_t i = 1; i < ns; i++) ZT_ASSERT(zck_st_tensor_at(f, i - 1)->begin <= zck_st_tensor_at(f, i)->begin);
    zck_st_close(f);
    if (pass == 1) zck__source_close(&ms);
  }
  free(image);

  /* dtype helpers */
  zck_st_dtype sd;
  ZT_ASSERT(zck_st_dtype_parse("BF16", 4, &sd) && sd == ZCK_ST_BF16);
  ZT_ASSERT(!zck_st_dtype_parse("bf16", 4, &sd));
  ZT_ASSERT(zck_st_dtype_from_zck(ZCK_F8_E4M3, &sd) && sd == ZCK_ST_F8_E4M3);
  ZT_ASSERT(!zck_st_dtype_from_zck(ZCK_C128, &sd));
  ZT_EQ_INT(zck_st_dtype_to_zck(ZCK_ST_F8_E8M0), ZCK_DTYPE_INVALID);
  ZT_EQ_INT(zck_st_dtype_bits(ZCK_ST_F4), 4);

  /* ---- an empty file: {"__metadata__":{"format":"pt"}} padded to 40 bytes, like the reference */
  ZT_OK(zck_st_writer_new(&w));
  ZT_OK(zck_st_writer_layout(w));
  hdr = zck_st_writer_header(w, &hlen);
  ZT_EQ_U64(hlen, 40);
  ZT_ASSERT(!memcmp(hdr + 8, "{\"__metadata__\":{\"format\":\"pt\"}}       ", 32));
  zck_st_writer_free(w); /* never opened: nothing to clean */

  /* ---- abandoned writer: no file, no temporary */
  char *dir2 = zt_tmpdir();
  char *p2 = zck__path_join(dir2, "x.safetensors");
  uint64_t sh[1] = {4};
  ZT_OK(zck_st_writer_new(&w));
  ZT_OK(zck_st_writer_add(w, "a", ZCK_ST_F32, 1, sh, NULL));
  ZT_OK(zck_st_writer_layout(w));
  ZT_OK(zck_st_writer_open(w, p2));
  ZT_EQ_INT(dir_entries(dir2), 1); /* the temporary */
  zck_st_writer_free(w);
  ZT_EQ_INT(dir_entries(dir2), 0);

  /* ---- injected ENOSPC on a data write, then on the rename: nothing left */
  ZT_OK(zck_st_writer_new(&w));
  ZT_OK(zck_st_writer_add(w, "a", ZCK_ST_F32, 1, sh, NULL));
  ZT_OK(zck_st_writer_layout(w));
  ZT_OK(zck_st_writer_open(w, p2));
  zck__io_fault_set(ZCK_IO_OP_WRITE, 1, ENOSPC);
  ZT_ERR(zck_st_writer_write(w, 0, "abcd", 0, 4), ZCK_ERR_NO_SPACE, "x.safetensors");
  zck__io_fault_set(ZCK_IO_OP_WRITE, 0, 0);
  zck_st_writer_free(w);
  ZT_EQ_INT(dir_entries(dir2), 0);
  ZT_OK(zck_st_writer_new(&w));
  ZT_OK(zck_st_writer_add(w, "a", ZCK_ST_F32, 1, sh, NULL));
  ZT_OK(zck_st_writer_layout(w));
  ZT_OK(zck_st_writer_open(w, p2));
  ZT_OK(zck_st_writer_write(w, 0, "abcdefghijklmnop", 0, 16));
  zck__io_fault_set(ZCK_IO_OP_RENAME, 1, EIO);
  ZT_ERR(zck_st_writer_commit(w), ZCK_ERR_IO, "rename");
  zck__io_fault_set(ZCK_IO_OP_RENAME, 0, 0);
  zck_st_writer_free(w);
  ZT_EQ_INT(dir_entries(dir2), 0);

  free(p2);
  free(dir2);
  free(path);
  free(dir);
  return 0;
}
