/* test_dcp_damage.c: damaged and hostile DCP folders, each made from a real fixture by one
 * change: the reader refuses every one in one line naming the file (the structure at
 * open, the bytes by CRC as the transfer streams them), and passes the intact copy. */
#include "dcp/dcp.h"
#include "io.h"
#include "pickle/pickle.h"
#include "test.h"
#include "transfer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CASE "llama_tied_w2_fp32"
/* FSDP2 + tensor parallel (dp 2 x tp 2): o_proj's chunks are 4 x 4 blocks of its 8 x 8 */
#define CASE_2D "llama_tp2_dp2_fp32"
static const char *const files[] = {".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"};

static char *fresh_copy_of(const char *tmp, const char *name, const char *fixture, size_t n_files) {
  char *dst = zck__path_join(tmp, name), rel[128];
  ZT_OK(zck__mkdirs(dst));
  for (size_t i = 0; i < n_files; i++) {
    snprintf(rel, sizeof rel, "dcp/%s/%s", fixture, files[i]);
    char *src = zt_fixture(rel), *to = zck__path_join(dst, files[i]);
    unsigned char *d;
    size_t n;
    ZT_ASSERT(!zt_read_file(src, &d, &n));
    ZT_ASSERT(!zt_write_file(to, d, n));
    free(d);
    free(src);
    free(to);
  }
  return dst;
}

static char *fresh_copy(const char *tmp, const char *name) { return fresh_copy_of(tmp, name, CASE, 3); }
static char *fresh_copy_2d(const char *tmp, const char *name) { return fresh_copy_of(tmp, name, CASE_2D, 5); }

/* Opens dir and streams every part into memory: the first error, or ZCK_OK. */
static zck_status read_all(const char *dir) {
  zck_dcp *c;
  zck_status s = zck_dcp_open(dir, NULL, &c);
  if (s) return s;
  const zck_model *m = zck_dcp_model(c);
  zck_state_view src, dst;
  zck_dcp_state(c, &src);
  memset(&dst, 0, sizeof dst);
  dst.model = m;
  uint64_t *numel = malloc(m->n_params * sizeof *numel);
  zck_model_numels(m, numel);
  zck_layout *l[ZCK_STATE_KINDS] = {0};
  zck_store *st[ZCK_STATE_KINDS] = {0};
  void *mem[ZCK_STATE_KINDS] = {0};
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    const zck_layout *sl = src.part[k].layout;
    if (!sl) continue;
    uint32_t *params = malloc(m->n_params * sizeof *params);
    size_t n = 0;
    uint64_t total = 0;
    for (uint32_t p = 0; p < m->n_params; p++)
      if (zck_layout_param_covered(sl, p)) params[n++] = p, total += numel[p];
    ZT_OK(zck_layout_whole(m->n_params, numel, params, n, &l[k]));
    mem[k] = calloc(total, 8);
    st[k] = calloc(n, sizeof *st[k]);
    char *at = mem[k];
    for (size_t i = 0; i < n; i++) {
      st[k][i] = zck_store_memory(at, ZCK_F64, numel[params[i]], "mem");
      at += numel[params[i]] * 8;
    }
    dst.part[k].layout = l[k];
    dst.part[k].stores = st[k];
    free(params);
  }
  s = zck_transfer(&src, &dst, 1, NULL);
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    zck_layout_free(l[k]);
    free(st[k]);
    free(mem[k]);
  }
  free(numel);
  zck_dcp_close(c);
  return s;
}

static void expect_refused(const char *dir, const char *file, const char *needle) {
  zck_status s = read_all(dir);
  if (s == ZCK_OK) ZT_FAIL("%s: read without error", dir);
  const char *msg = zck_last_error();
  char *path = zck__path_join(dir, file);
  if (!strstr(msg, path)) ZT_FAIL("message does not name %s: %s", path, msg);
  if (needle && !strstr(msg, needle)) ZT_FAIL("message lacks '%s': %s", needle, msg);
  if (strchr(msg, '\n')) ZT_FAIL("message is not one line: %s", msg);
  if (getenv("ZCK_TEST_VERBOSE")) fprintf(stderr, "refused: %s\n", msg);
  free(path);
}

static void patch_byte(const char *dir, const char *file, long off, int xor_or_truncate) {
  char *p = zck__path_join(dir, file);
  unsigned char *d;
  size_t n;
  ZT_ASSERT(!zt_read_file(p, &d, &n));
  if (xor_or_truncate) d[off < 0 ? (long)n + off : off] ^= (unsigned char)xor_or_truncate;
  else n = (size_t)off;
  ZT_ASSERT(!zt_write_file(p, d, n));
  free(d);
  free(p);
}

// ---- metadata edits through the pickle VM and emitter

typedef struct meta { zck_pk_doc *doc; zck_pk *state; char *path; } meta;

static meta meta_load(const char *dir) {
  meta m;
  m.path = zck__path_join(dir, ".metadata");
  unsigned char *d;
  size_t n;
  ZT_ASSERT(!zt_read_file(m.path, &d, &n));
  ZT_OK(zck_pickle_load(d, n, "meta", NULL, &m.doc));
  free(d);
  m.state = ((zck_pk *)zck_pk_doc_root(m.doc))->u.obj.state;
  return m;
}

static void meta_save(meta *m) {
  zck__buf b;
  zck__buf_init(&b);
  ZT_OK(zck_pickle_dump(zck_pk_doc_root(m->doc), &b));
  ZT_ASSERT(!zt_write_file(m->path, b.data, b.len));
  zck__buf_free(&b);
  zck_pk_doc_free(m->doc);
  free(m->path);
}

static zck_pk *dget(const zck_pk *dict, const char *k) {
  zck_pk *v = (zck_pk *)zck_pk_dict_get(dict, k);
  ZT_ASSERT(v);
  return v;
}

/* The state dict of chunk i of tensor entry key. */
static zck_pk *chunk_state(meta *m, const char *key, size_t i) {
  zck_pk *e = dget(dget(m->state, "state_dict_metadata"), key);
  return dget(e->u.obj.state, "chunks")->u.seq.items[i]->u.obj.state;
}

/* The _StorageInfo state of the i-th storage_data entry. */
static zck_pk *storage_info(meta *m, size_t i) {
  return dget(m->state, "storage_data")->u.dict.values[i]->u.obj.state;
}

int main(void) {
  char *tmp = zt_tmpdir();
  char *d;
  const char *E = "model.model.embed_tokens.weight";

  d = fresh_copy(tmp, "intact");
  ZT_OK(read_all(d));
  free(d);

  /* a bit flipped inside a chunk's data (item 0 is the embedding's first chunk: its data
   * starts at a 64-byte boundary after data.pkl) */
  d = fresh_copy(tmp, "bitflip");
  {
    zck_dcp *c;
    ZT_OK(zck_dcp_open(d, NULL, &c));
    zck_state_view v;
    zck_dcp_state(c, &v);
    uint64_t at = v.part[ZCK_STATE_FP32].stores[0].source->base + v.part[ZCK_STATE_FP32].stores[0].base + 5;
    zck_dcp_close(c);
    patch_byte(d, "__0_0.distcp", (long)at, 0x10);
  }
  expect_refused(d, "__0_0.distcp", "CRC-32 mismatch");
  free(d);

  d = fresh_copy(tmp, "truncated");
  patch_byte(d, "__1_0.distcp", 1000, 0);
  expect_refused(d, "__1_0.distcp", "truncated");
  free(d);

  d = fresh_copy(tmp, "missing");
  {
    char *p = zck__path_join(d, "__1_0.distcp");
    ZT_ASSERT(!unlink(p));
    free(p);
  }
  expect_refused(d, "__1_0.distcp", "missing");
  free(d);

  /* a .distcp of another save (another layout): the items no longer tile the file */
  d = fresh_copy(tmp, "other_save");
  {
    char *src = zt_fixture("dcp/llama_untied_w3_fp32/__1_0.distcp"), *to = zck__path_join(d, "__1_0.distcp");
    unsigned char *b;
    size_t n;
    ZT_ASSERT(!zt_read_file(src, &b, &n));
    ZT_ASSERT(!zt_write_file(to, b, n));
    free(b);
    free(src);
    free(to);
  }
  expect_refused(d, "__1_0.distcp", NULL);
  free(d);

  /* a chunk no item holds */
  d = fresh_copy(tmp, "missing_chunk");
  {
    meta m = meta_load(d);
    zck_pk *sd = dget(m.state, "storage_data");
    sd->u.dict.len--;   /* drop the last item */
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "a missing chunk");
  free(d);

  /* overlapping chunks: the second chunk of the embedding starts a row early */
  d = fresh_copy(tmp, "overlap");
  {
    meta m = meta_load(d);
    zck_pk *off = dget(chunk_state(&m, E, 1), "offsets");
    off->u.seq.items[0] = zck_pk_new_int(m.doc, off->u.seq.items[0]->u.i - 1);
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "overlap");
  free(d);

  /* a chunk cut across columns, leaving the other half of its rows in no chunk */
  d = fresh_copy(tmp, "columns");
  {
    meta m = meta_load(d);
    zck_pk *sz = dget(chunk_state(&m, E, 0), "sizes");
    sz->u.seq.items[1] = zck_pk_new_int(m.doc, 4);
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "in no chunk");
  free(d);

  /* 2-D blocks (FSDP2 + tensor parallel): the intact folder reads; a block moved a column
   * left overlaps its neighbour (the element count still adds up); a block a column
   * narrower leaves elements in no chunk; a bit flipped in a block fails its CRC */
  const char *O = "model.model.layers.0.self_attn.o_proj.weight";
  d = fresh_copy_2d(tmp, "blocks_intact");
  ZT_OK(read_all(d));
  free(d);
  d = fresh_copy_2d(tmp, "blocks_overlap");
  {
    meta m = meta_load(d);
    zck_pk *off = dget(chunk_state(&m, O, 1), "offsets");   /* [0, 4] */
    ZT_EQ_INT(off->u.seq.items[1]->u.i, 4);
    off->u.seq.items[1] = zck_pk_new_int(m.doc, 3);
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "chunks 0 and 1 overlap");
  free(d);
  d = fresh_copy_2d(tmp, "blocks_gap");
  {
    meta m = meta_load(d);
    zck_pk *sz = dget(chunk_state(&m, O, 3), "sizes");   /* [4, 4] at [4, 4] */
    sz->u.seq.items[1] = zck_pk_new_int(m.doc, 3);
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "in no chunk");
  free(d);
  d = fresh_copy_2d(tmp, "blocks_bitflip");
  {
    zck_dcp *c;
    ZT_OK(zck_dcp_open(d, NULL, &c));
    zck_state_view v;
    zck_dcp_state(c, &v);
    /* the block holding o_proj[0][0]: 4 x 4, one strided piece (4 runs of 4, 8 apart) */
    const zck_model *m = zck_dcp_model(c);
    int64_t p = zck_model_find_param(m, O + strlen("model."));
    ZT_ASSERT(p >= 0);
    const zck_layout *l = v.part[ZCK_STATE_FP32].layout;
    const zck_piece *pc = &l->pieces[l->param_first[p]];
    ZT_EQ_INT(l->param_first[p + 1] - l->param_first[p], 4);   /* 4 blocks */
    ZT_EQ_INT(pc->count, 16);
    ZT_EQ_INT(pc->run, 4);
    ZT_EQ_INT(pc->stride, 8);
    const zck_store *st = &v.part[ZCK_STATE_FP32].stores[pc->store];
    uint64_t at = st->source->base + st->base + 4 * 4 + 1;   /* inside its second row */
    ZT_ASSERT(strstr(st->source->name, "__0_0.distcp"));
    zck_dcp_close(c);
    patch_byte(d, "__0_0.distcp", (long)at, 0x10);
  }
  expect_refused(d, "__0_0.distcp", "CRC-32 mismatch");
  free(d);

  /* an item that says it is compressed */
  d = fresh_copy(tmp, "transform");
  {
    meta m = meta_load(d);
    zck_pk *l = zck_pk_new_list(m.doc);
    zck_pk_append(m.doc, l, zck_pk_new_str(m.doc, "zstd"));
    zck_pk_dict_set(m.doc, storage_info(&m, 3), zck_pk_new_str(m.doc, "transform_descriptors"), l);
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "unknown transform descriptor 'zstd'");
  free(d);

  /* a data file outside the folder */
  d = fresh_copy(tmp, "escape");
  {
    meta m = meta_load(d);
    zck_pk *si = storage_info(&m, 0);
    for (size_t i = 0; i < si->u.dict.len; i++)
      if (!strcmp(zck_pk_as_str(si->u.dict.keys[i]), "relative_path"))
        si->u.dict.values[i] = zck_pk_new_str(m.doc, "../__0_0.distcp");
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "not a file of the folder");
  free(d);

  /* a storage item pointing into the middle of another one */
  d = fresh_copy(tmp, "shifted");
  {
    meta m = meta_load(d);
    zck_pk *si = storage_info(&m, 1);
    for (size_t i = 0; i < si->u.dict.len; i++)
      if (!strcmp(zck_pk_as_str(si->u.dict.keys[i]), "offset"))
        si->u.dict.values[i] = zck_pk_new_int(m.doc, si->u.dict.values[i]->u.i - 8);
    meta_save(&m);
  }
  expect_refused(d, "__0_0.distcp", "overlaps");
  free(d);

  /* hostile pickles: a global outside DCP's classes, anywhere in the stream; not a
   * Metadata at the root; nesting past the VM's limit */
  d = fresh_copy(tmp, "hostile_global");
  {
    meta m = meta_load(d);
    zck_pk *args = zck_pk_new_tuple(m.doc, 1);
    args->u.seq.items[0] = zck_pk_new_str(m.doc, "touch /tmp/pwned");
    zck_pk *call = zck_pk_new_object(m.doc, zck_pk_new_global(m.doc, "os", "system"), args, 0, NULL);
    zck_pk_dict_set(m.doc, m.state, zck_pk_new_str(m.doc, "x"), call);
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "global os.system is not a class of DCP metadata");
  free(d);
  /* memo abuse: one ChunkStorageMetadata in the chunk lists of two tensors (the emitter
   * writes the second as a memo GET of an object the reader has already read and freed) */
  d = fresh_copy(tmp, "hostile_shared_chunk");
  {
    meta m = meta_load(d);
    zck_pk *sdm = dget(m.state, "state_dict_metadata");
    zck_pk *a = dget(dget(sdm, E)->u.obj.state, "chunks");
    zck_pk *b = NULL;   /* another tensor's */
    for (size_t i = 0; i < sdm->u.dict.len && !b; i++) {
      zck_pk *st = sdm->u.dict.values[i]->u.obj.state, *l = st ? (zck_pk *)zck_pk_dict_get(st, "chunks") : NULL;
      if (l && l != a && l->u.seq.len) b = l;
    }
    ZT_ASSERT(b);
    b->u.seq.items[0] = a->u.seq.items[0];
    meta_save(&m);
  }
  expect_refused(d, ".metadata", "already read");
  free(d);
  d = fresh_copy(tmp, "hostile_root");
  {
    char *p = zck__path_join(d, ".metadata");
    static const unsigned char pk[] = "\x80\x02}q\x00X\x01\x00\x00\x00" "aK\x01s.";
    ZT_ASSERT(!zt_write_file(p, pk, sizeof pk - 1));
    free(p);
  }
  expect_refused(d, ".metadata", "expected a Metadata");
  free(d);
  d = fresh_copy(tmp, "hostile_deep");
  {
    char *p = zck__path_join(d, ".metadata");
    size_t n = 100000;
    unsigned char *pk = malloc(n + 4);
    pk[0] = 0x80, pk[1] = 2;
    memset(pk + 2, ']', n - 2);   /* EMPTY_LIST forever, never closed */
    pk[n] = '.';
    ZT_ASSERT(!zt_write_file(p, pk, n + 1));
    free(pk);
    free(p);
  }
  expect_refused(d, ".metadata", NULL);
  free(d);
  d = fresh_copy(tmp, "empty_metadata");
  patch_byte(d, ".metadata", 0, 0);
  expect_refused(d, ".metadata", NULL);
  free(d);

  free(tmp);
  return 0;
}
