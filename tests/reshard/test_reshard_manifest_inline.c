/* test_reshard_manifest_inline.c: the manifest of a reshard, hashed by the writer as the
 * copy writes (lib/stream_hash.c), is byte for byte the manifest computed by reading the files
 * back (zck_manifest_write_dir), for every DeepSpeed fixture resharded to stages 1-3 and
 * W = 1..4; with 4 KiB chunks (many chunk hashes per file) and the default 64 MiB; with a
 * budget so small that every file stops streaming and is finished by reading (the slow
 * path, same bytes). Every file takes its hashes and its tensor list from the writer (the
 * tensors named from its pickle tree before the tree is freed, so no file is parsed again),
 * and in the normal runs the writer streams the data from memory (only the zip records at
 * the ends are read). */
#include "deepspeed/deepspeed.h"
#include "deepspeed/ds_writer.h"
#include "manifest.h"
#include "rs_util.h"

static char *read_all(const char *path, size_t *n) {
  unsigned char *d = NULL;
  if (zt_read_file(path, &d, n) != 0) ZT_FAIL("cannot read %s", path);
  return (char *)d;
}

struct run { int stage; uint32_t world; uint64_t chunk, budget; };

static uint64_t total_streamed, total_reread;

static void check(const char *ckpt, const char *root, const struct run *r, bool expect_streaming) {
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(ckpt, NULL, &c));
  zck_ds_write_opts o;
  zck_ds_write_opts_from(c, &o);
  o.stage = r->stage;
  o.world_size = r->world;
  if (r->stage == 3) o.round_robin = false;
  zck_ds_writer *w = NULL;
  ZT_OK(zck_ds_writer_create(root, zck_ds_model(c), &o, &w));
  zck__ds_writer_hash_inline(w, r->chunk, r->budget);
  zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
  eo.threads = 3;
  if (!getenv("RS_BIG")) eo.staging_bytes = 4096; /* many pieces per storage, from several threads */
  ZT_OK(zck_ds_copy(c, w, &eo));
  ZT_OK(zck_ds_writer_commit(w));
  uint64_t streamed = 0, reread = 0;
  const zck__manifest_known *k = zck__ds_writer_known(w, &streamed, &reread);
  ZT_ASSERT(k);
  char *tag = rs_path("%s/%s", root, o.tag ? o.tag : "global_step0");
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.kind = "deepspeed";
  mo.chunk_size = r->chunk;
  size_t from_known = 0;
  ZT_OK(zck__manifest_write_dir_known(tag, &mo, k, &from_known));
  char *mpath = rs_path("%s/%s", tag, ZCK_MANIFEST_NAME);
  size_t na, nb;
  char *a = read_all(mpath, &na);
  ZT_OK(zck_manifest_write_dir(tag, &mo)); /* the same, read back */
  char *b = read_all(mpath, &nb);
  if (na != nb || memcmp(a, b, na)) ZT_FAIL("%s -> %s: manifests differ (%zu / %zu bytes)", ckpt, root, na, nb);
  size_t nfiles = (size_t)zck_ds_writer_model_files(w) + r->world;
  if (from_known != nfiles) ZT_FAIL("%s -> %s: %zu of %zu files hashed by the writer", ckpt, root, from_known, nfiles);
  for (size_t i = 0; i < k->n_files; i++) /* named from the writer's trees: no file parsed again */
    if (!k->files[i].described) ZT_FAIL("%s -> %s: %s: its tensors are not named by the writer", ckpt, root, k->files[i].path);
  if (expect_streaming && streamed == 0) ZT_FAIL("%s -> %s: nothing streamed", ckpt, root);
  total_streamed += streamed;
  total_reread += reread;
  free(a);
  free(b);
  free(mpath);
  free(tag);
  zck_ds_writer_free(w);
  zck_ds_close(c);
}

int main(int argc, char **argv) {
  if (argc == 5) { /* test_reshard_manifest_inline CKPT OUT STAGE W: one reshard (benchmarks) */
    struct run r = {atoi(argv[3]), (uint32_t)atoi(argv[4]), 0, 0};
    check(argv[1], argv[2], &r, true);
    fprintf(stderr, "%llu bytes hashed as written, %llu read back\n", (unsigned long long)total_streamed,
            (unsigned long long)total_reread);
    return 0;
  }
  char *dir = zt_fixture("deepspeed");
  DIR *d = opendir(dir);
  if (!d) zt_skip("no DeepSpeed fixtures");
  char *tmp = zt_tmpdir();
  size_t n_runs = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char *ckpt = rs_path("%s/%s/ckpt", dir, e->d_name);
    if (!rs_exists(ckpt)) { free(ckpt); continue; }
    static const struct run runs[] = {
        {1, 1, 4096, 0}, {2, 3, 4096, 0}, {3, 4, 4096, 0}, {2, 4, 0, 0}, {3, 2, 0, 0},
        {1, 2, 4096, 1}, {3, 3, 4096, 1}, /* budget of 1 byte: every file finished by reading */
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
      char *root = rs_path("%s/%s-%zu", tmp, e->d_name, i);
      check(ckpt, root, &runs[i], runs[i].budget != 1);
      free(root);
      n_runs++;
    }
    free(ckpt);
  }
  closedir(d);
  fprintf(stderr, "%zu reshards: %llu bytes hashed as written, %llu read back (zip records, slow path)\n", n_runs,
          (unsigned long long)total_streamed, (unsigned long long)total_reread);
  ZT_ASSERT(n_runs > 0);
  free(dir);
  free(tmp);
  printf("ok\n");
  return 0;
}
