/* test_verify.c: zck_verify on real fixtures: clean inputs pass; one flipped byte inside
 * tensor data is found and named (the zip record and its tensor without a manifest, the
 * exact tensor and byte range with one); truncation, a deleted rank file, a corrupt
 * manifest, an interrupted save, and injected read errors each give the right result and
 * a one-line message. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"
#include "safetensors/safetensors.h"
#include "test.h"
#include "torch/torch.h"
#include "zck.h"

static bool exists(const char *p) { struct stat sb; return stat(p, &sb) == 0; }

static char *join(const char *a, const char *b) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", a, b) < 0) abort();
  return p;
}

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

static const char *result_name(zck_verify_result r) {
  return r == ZCK_VERIFY_CLEAN ? "clean" : r == ZCK_VERIFY_DAMAGED ? "damaged" : "unchecked";
}

static void dump(const zck_verify_report *r) {
  zck_verify_report_print(r, 0, stderr);
}

/* Runs verify; the result must be `want`; returns the report (caller frees). */
static zck_verify_report *expect(const char *path, const zck_verify_opts *o, zck_verify_result want) {
  zck_verify_report *r = NULL;
  zck_status st = zck_verify(path, o, &r);
  if (!r) ZT_FAIL("%s: no report: %s", path, zck_last_error());
  if (r->result != want) {
    dump(r);
    ZT_FAIL("%s: %s, expected %s", path, result_name(r->result), result_name(want));
  }
  ZT_EQ_INT(st == ZCK_OK, want == ZCK_VERIFY_CLEAN);
  if (want == ZCK_VERIFY_DAMAGED) ZT_EQ_INT(st, ZCK_ERR_DAMAGED);
  for (size_t i = 0; i < r->n_findings; i++) ZT_ASSERT(!strchr(r->findings[i].message, '\n'));
  return r;
}

/* The first finding of this severity and check whose message holds every needle. */
static const zck_verify_finding *find(const zck_verify_report *r, zck_verify_severity sev, const char *check,
                                      const char *n1, const char *n2) {
  for (size_t i = 0; i < r->n_findings; i++) {
    const zck_verify_finding *f = &r->findings[i];
    if (f->severity != sev || (check && strcmp(f->check, check))) continue;
    if ((n1 && !strstr(f->message, n1)) || (n2 && !strstr(f->message, n2))) continue;
    return f;
  }
  dump(r);
  ZT_FAIL("no %s finding with \"%s\" / \"%s\"", check ? check : "", n1 ? n1 : "", n2 ? n2 : "");
  return NULL;
}

static void flip_byte(const char *path, uint64_t off) {
  FILE *f = fopen(path, "r+b");
  ZT_ASSERT(f);
  ZT_ASSERT(fseek(f, (long)off, SEEK_SET) == 0);
  int c = fgetc(f);
  ZT_ASSERT(c != EOF);
  ZT_ASSERT(fseek(f, (long)off, SEEK_SET) == 0);
  fputc(c ^ 0x20, f);
  fclose(f);
}

/* Where a named tensor's bytes are in a .pt file (the name as verify prints it). */
static uint64_t torch_tensor_offset(const char *path, const char *name, uint64_t *nbytes) {
  zck_torch_file *tf = NULL;
  ZT_OK(zck_torch_open(path, NULL, &tf));
  zck_torch_named *named = NULL;
  size_t count = 0;
  ZT_OK(zck_torch_state_dict(tf, zck_torch_root(tf), &named, &count));
  uint64_t off = 0;
  bool found = false;
  for (size_t i = 0; i < count && !found; i++) {
    if (strcmp(named[i].name, name)) continue;
    found = true;
    off = zck_torch_tensor_file_offset(tf, named[i].tensor);
    *nbytes = zck_torch_tensor_nbytes(named[i].tensor);
  }
  if (!found) ZT_FAIL("%s: no tensor %s", path, name);
  zck_torch_named_free(named, count);
  zck_torch_close(tf);
  return off;
}

static char **ds_cases(size_t *n) {
  char *root = zt_fixture("deepspeed");
  DIR *d = opendir(root);
  char **v = NULL;
  *n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char *ck = NULL;
    if (asprintf(&ck, "%s/%s/ckpt", root, e->d_name) < 0) abort();
    if (exists(ck)) {
      v = realloc(v, (*n + 1) * sizeof *v);
      v[(*n)++] = ck;
    } else {
      free(ck);
    }
  }
  if (d) closedir(d);
  free(root);
  return v;
}

static void test_clean_fixtures(void) {
  size_t n = 0;
  char **cases = ds_cases(&n);
  for (size_t i = 0; i < n; i++) {
    /* every fixture is read by the jobs (BF16_Optimizer ones too), so each verifies clean */
    zck_verify_report *r = expect(cases[i], NULL, ZCK_VERIFY_CLEAN);
    ZT_EQ_STR(r->kind, "deepspeed");
    ZT_ASSERT(!r->manifest);
    ZT_ASSERT(r->records > 0);
    find(r, ZCK_VERIFY_NOTE, "coverage", "no zckpt-manifest.json", NULL); /* says what was not checked */
    zck_verify_report_free(r);
    free(cases[i]);
  }
  free(cases);
  if (!n) fprintf(stderr, "note: no DeepSpeed fixtures\n");
  static const char *torch[] = {"dtypes.pt", "extra_dtypes.pt", "min_zip_nopad.pt", "min_zip_padded.pt", "module_state_dict.pt",
                                "nested.pt", "numpy_objects.pt", "scalars_empty.pt", "views.pt"};
  for (size_t i = 0; i < sizeof torch / sizeof torch[0]; i++) {
    char *p = zt_fixture("torch");
    char *f = join(p, torch[i]);
    if (exists(f)) {
      zck_verify_report *r = expect(f, NULL, ZCK_VERIFY_CLEAN);
      ZT_EQ_STR(r->kind, "torch");
      ZT_ASSERT(r->single_file);
      zck_verify_report_free(r);
    }
    free(f);
    free(p);
  }
  /* the legacy format cannot be checked: exit 1, not "damaged" */
  char *legacy = zt_fixture("torch/legacy.pt");
  if (exists(legacy)) {
    zck_verify_report *r = expect(legacy, NULL, ZCK_VERIFY_UNCHECKED);
    find(r, ZCK_VERIFY_UNCHECKABLE, "structure", "legacy", NULL);
    zck_verify_report_free(r);
  }
  free(legacy);
  static const char *st[] = {"dtypes.safetensors", "empty.safetensors", "empty_no_metadata.safetensors",
                             "extended_dtypes.safetensors", "no_metadata.safetensors", "save_model_tied.safetensors",
                             "gpt2_sharded", "hub_sharded", "gpt2_sharded/model.safetensors.index.json"};
  for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
    char *p = zt_fixture("safetensors");
    char *f = join(p, st[i]);
    if (exists(f)) {
      zck_verify_report *r = expect(f, NULL, ZCK_VERIFY_CLEAN);
      ZT_EQ_STR(r->kind, "safetensors");
      zck_verify_report_free(r);
    }
    free(f);
    free(p);
  }
}

static const char *OPTIM1 = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt";
static const char *VICTIM = "optimizer_state_dict.single_partition_of_fp32_groups.0";

static void test_deepspeed_damage(const char *tmp) {
  char *src = zt_fixture("deepspeed/s2w2_bf16/ckpt");
  if (!exists(src)) { fprintf(stderr, "note: s2w2_bf16 missing, damage tests skipped\n"); free(src); return; }
  char name[64];

  /* 1. a flipped byte without a manifest: the zip CRC names the record and its tensor */
  char *ck = join(tmp, "flip");
  sh("cp -r '%s' '%s'", src, ck);
  char *tag = join(ck, "global_step2");
  char *f = join(tag, OPTIM1);
  uint64_t nbytes = 0, off = torch_tensor_offset(f, VICTIM, &nbytes);
  flip_byte(f, off + nbytes / 2);
  zck_verify_report *r = expect(ck, NULL, ZCK_VERIFY_DAMAGED);
  const zck_verify_finding *x = find(r, ZCK_VERIFY_DAMAGE, "zip-crc", OPTIM1, VICTIM);
  ZT_ASSERT(strstr(x->message, "CRC-32 is ") && !strstr(x->message, "[Z-"));
  ZT_ASSERT(x->offset >= 0 && (uint64_t)x->offset <= off && (uint64_t)x->offset + x->length >= off + nbytes);
  ZT_EQ_STR(x->file, f);
  zck_verify_report_free(r);
  /* structure-only reads no data: it cannot see it */
  zck_verify_opts so = ZCK_VERIFY_OPTS_INIT;
  so.skip_data = 1;
  r = expect(ck, &so, ZCK_VERIFY_CLEAN);
  zck_verify_report_free(r);

  /* 2. with a manifest (written from the clean copy): the exact tensor and byte range */
  char *ck2 = join(tmp, "flip_manifest");
  sh("cp -r '%s' '%s'", src, ck2);
  char *tag2 = join(ck2, "global_step2");
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.chunk_size = 1024;
  ZT_OK(zck_manifest_write_dir(tag2, &mo));
  r = expect(ck2, NULL, ZCK_VERIFY_CLEAN);
  ZT_ASSERT(r->manifest && strstr(r->manifest, "zckpt-manifest.json"));
  ZT_ASSERT(r->tensors > 10);
  zck_verify_report_free(r);
  char *f2 = join(tag2, OPTIM1);
  flip_byte(f2, off + nbytes / 2);
  r = expect(ck2, NULL, ZCK_VERIFY_DAMAGED);
  x = find(r, ZCK_VERIFY_DAMAGE, "tensor-xxh3", OPTIM1, VICTIM);
  ZT_EQ_STR(x->tensor, VICTIM);
  ZT_EQ_U64(x->offset, off);
  ZT_EQ_U64(x->length, nbytes);
  snprintf(name, sizeof name, "bytes %llu..%llu", (unsigned long long)off, (unsigned long long)(off + nbytes));
  ZT_ASSERT(strstr(x->message, name));
  x = find(r, ZCK_VERIFY_DAMAGE, "chunk-xxh3", OPTIM1, NULL); /* the 1 KiB chunk holding the byte */
  ZT_ASSERT((uint64_t)x->offset <= off + nbytes / 2 && off + nbytes / 2 < (uint64_t)x->offset + x->length);
  ZT_EQ_U64(x->length, 1024);
  find(r, ZCK_VERIFY_DAMAGE, "file-xxh3", OPTIM1, NULL);
  find(r, ZCK_VERIFY_DAMAGE, "zip-crc", OPTIM1, VICTIM);
  /* no other tensor is blamed */
  for (size_t i = 0; i < r->n_findings; i++)
    if (r->findings[i].tensor && !strcmp(r->findings[i].check, "tensor-xxh3")) ZT_EQ_STR(r->findings[i].tensor, VICTIM);
  zck_verify_report_free(r);

  /* 3. truncated: damaged, "truncated" (manifest) or the zip reader's end-of-directory error */
  ZT_ASSERT(truncate(f2, 6000) == 0);
  r = expect(ck2, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "size", OPTIM1, "truncated: 6000 bytes");
  find(r, ZCK_VERIFY_DAMAGE, "structure", OPTIM1, "no end-of-central-directory record");
  zck_verify_report_free(r);
  char *ck3 = join(tmp, "trunc");
  sh("cp -r '%s' '%s'", src, ck3);
  char *f3 = NULL;
  if (asprintf(&f3, "%s/global_step2/%s", ck3, OPTIM1) < 0) abort();
  ZT_ASSERT(truncate(f3, 6000) == 0);
  r = expect(ck3, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "structure", OPTIM1, NULL);
  zck_verify_report_free(r);

  /* 4. a deleted rank file: named, with and without a manifest */
  ZT_ASSERT(unlink(f3) == 0);
  r = expect(ck3, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "structure", OPTIM1, "rank 1");
  zck_verify_report_free(r);
  ZT_ASSERT(unlink(f2) == 0);
  r = expect(ck2, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "missing-file", OPTIM1, "missing");
  zck_verify_report_free(r);

  /* 5. a corrupt manifest: could not check (exit 1), a clear message */
  char *mp = join(tag2, "zckpt-manifest.json");
  ZT_ASSERT(zt_write_file(mp, "{\"format\": \"zckpt-manifest\", \"files\": [", 39) == 0);
  r = expect(ck2, NULL, ZCK_VERIFY_UNCHECKED);
  find(r, ZCK_VERIFY_UNCHECKABLE, "manifest", "zckpt-manifest.json: malformed manifest: not valid JSON", NULL);
  ZT_EQ_U64(r->files, 0);
  zck_verify_report_free(r);
  zck_verify_report *r2 = NULL;
  ZT_ERR(zck_verify(ck2, NULL, &r2), ZCK_ERR_FORMAT, "malformed manifest");
  zck_verify_report_free(r2);

  /* 6. an interrupted zckpt save: partial marker, no manifest */
  char *ck4 = join(tmp, "partial");
  sh("cp -r '%s' '%s'", src, ck4);
  char *tag4 = join(ck4, "global_step2");
  ZT_OK(zck_manifest_mark_partial(tag4));
  r = expect(ck4, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "incomplete", "incomplete checkpoint", NULL);
  zck_verify_report_free(r);
  zck_verify_opts fo = ZCK_VERIFY_OPTS_INIT;
  fo.force = 1;
  r = expect(ck4, &fo, ZCK_VERIFY_CLEAN);
  find(r, ZCK_VERIFY_NOTE, "incomplete", "--force", NULL);
  zck_verify_report_free(r);
  ZT_ERR(zck_manifest_check_complete(tag4, 0), ZCK_ERR_DAMAGED, "incomplete");

  /* 7. --tag names a tag (ck's global_step2 is damaged above); a missing one is nothing
   * checked, not damage: a sound checkpoint asked about a tag it lacks is not "damaged" */
  zck_verify_opts to = ZCK_VERIFY_OPTS_INIT;
  to.tag = "global_step2";
  r = expect(ck, &to, ZCK_VERIFY_DAMAGED);
  zck_verify_report_free(r);
  to.tag = "global_step9";
  r = expect(ck4, &to, ZCK_VERIFY_UNCHECKED);
  find(r, ZCK_VERIFY_UNCHECKABLE, "read", "tag folder 'global_step9' does not exist", NULL);
  zck_verify_report_free(r);

  free(src); free(ck); free(tag); free(f); free(ck2); free(tag2); free(f2); free(ck3); free(f3);
  free(mp); free(ck4); free(tag4);
}

static void test_safetensors_damage(const char *tmp) {
  char *src = zt_fixture("safetensors/hub_sharded");
  if (!exists(src)) { free(src); return; }
  char *d = join(tmp, "st");
  sh("cp -r '%s' '%s'", src, d);
  char *shard = join(d, "model-00002-of-00003.safetensors");
  zck_st_file *sf = NULL;
  ZT_OK(zck_st_open(shard, &sf));
  ZT_ASSERT(zck_st_count(sf) > 0);
  const zck_st_tensor *t = NULL;
  for (size_t i = 0; i < zck_st_count(sf) && !t; i++)
    if (zck_st_tensor_at(sf, i)->nbytes > 0) t = zck_st_tensor_at(sf, i);
  ZT_ASSERT(t);
  char *tname = strdup(t->name);
  uint64_t off = t->offset, nb = t->nbytes;
  zck_st_close(sf);
  /* without a manifest: no checksum, so the flip is invisible; verify says so */
  flip_byte(shard, off + nb - 1);
  zck_verify_report *r = expect(d, NULL, ZCK_VERIFY_CLEAN);
  find(r, ZCK_VERIFY_NOTE, "coverage", "carry no checksums", NULL);
  zck_verify_report_free(r);
  flip_byte(shard, off + nb - 1); /* restore */
  ZT_OK(zck_manifest_write_dir(d, NULL));
  r = expect(d, NULL, ZCK_VERIFY_CLEAN);
  ZT_ASSERT(r->manifest);
  zck_verify_report_free(r);
  flip_byte(shard, off + nb - 1);
  r = expect(d, NULL, ZCK_VERIFY_DAMAGED);
  const zck_verify_finding *x = find(r, ZCK_VERIFY_DAMAGE, "tensor-xxh3", "model-00002-of-00003.safetensors", tname);
  ZT_EQ_U64(x->offset, off);
  zck_verify_report_free(r);
  /* the single file, checked against its folder's manifest */
  r = expect(shard, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "tensor-xxh3", NULL, tname);
  ZT_ASSERT(r->single_file);
  zck_verify_report_free(r);
  /* a shard named by the index deleted */
  ZT_ASSERT(unlink(shard) == 0);
  r = expect(d, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "missing-file", "model-00002-of-00003.safetensors", NULL);
  find(r, ZCK_VERIFY_DAMAGE, "structure", "model-00002-of-00003.safetensors", NULL);
  zck_verify_report_free(r);
  free(tname);
  free(shard);
  free(d);
  free(src);
}

static void test_torch_damage(const char *tmp) {
  char *src = zt_fixture("torch/module_state_dict.pt");
  if (!exists(src)) { free(src); return; }
  char *f = join(tmp, "m.pt");
  sh("cp '%s' '%s'", src, f);
  zck_torch_file *tf = NULL;
  ZT_OK(zck_torch_open(f, NULL, &tf));
  const zck_torch_tensor *t = NULL;
  for (size_t i = 0; i < zck_torch_tensor_count(tf) && !t; i++)
    if (zck_torch_tensor_nbytes(zck_torch_tensor_at(tf, i)) > 0) t = zck_torch_tensor_at(tf, i);
  ZT_ASSERT(t);
  uint64_t off = zck_torch_tensor_file_offset(tf, t);
  zck_torch_close(tf);
  flip_byte(f, off);
  zck_verify_report *r = expect(f, NULL, ZCK_VERIFY_DAMAGED);
  find(r, ZCK_VERIFY_DAMAGE, "zip-crc", "m.pt", "(tensor ");
  zck_verify_report_free(r);
  /* a path that does not exist: could not check */
  char *none = join(tmp, "nothing-here");
  zck_verify_report *r2 = NULL;
  zck_status st = zck_verify(none, NULL, &r2);
  ZT_EQ_INT(st, ZCK_ERR_NOT_FOUND);
  ZT_ASSERT(r2 && r2->result == ZCK_VERIFY_UNCHECKED);
  ZT_ASSERT(strstr(zck_last_error(), "nothing-here"));
  zck_verify_report_free(r2);
  /* text and JSON print */
  r = expect(src, NULL, ZCK_VERIFY_CLEAN);
  char *out = join(tmp, "report.json");
  FILE *fo = fopen(out, "w");
  ZT_OK(zck_verify_report_print(r, 1, fo));
  ZT_OK(zck_verify_report_print(r, 0, fo));
  fclose(fo);
  zck_verify_report_free(r);
  free(out);
  free(none);
  free(f);
  free(src);
}

/* Every injected read error gives "could not check" (never "damaged", never a crash), with
 * or without a manifest; once the fault no longer hits, the result is clean. */
static void test_read_faults(const char *tmp) {
  char *src = zt_fixture("deepspeed/s1w2_bf16/ckpt");
  if (!exists(src)) { free(src); return; }
  char *ck = join(tmp, "faults");
  sh("cp -r '%s' '%s'", src, ck);
  for (int with_manifest = 0; with_manifest < 2; with_manifest++) {
    if (with_manifest) {
      char *tag = join(ck, "global_step2");
      ZT_OK(zck_manifest_write_dir(tag, NULL));
      free(tag);
    }
    zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
    o.threads = 1;
    /* a probe read (sniffing a file's magic) may fail harmlessly: the file is read again;
     * the run of clean results at the end means the fault no longer hits any read */
    unsigned unchecked = 0, clean_run = 0;
    uint64_t nth = 1;
    for (; nth < 5000 && clean_run < 50; nth++) {
      zck__io_fault_set(ZCK_IO_OP_READ, nth, EIO);
      zck_verify_report *r = NULL;
      zck_status st = zck_verify(ck, &o, &r);
      ZT_ASSERT(r);
      if (r->result == ZCK_VERIFY_DAMAGED) {
        dump(r);
        ZT_FAIL("read fault #%llu reported as damage", (unsigned long long)nth);
      }
      if (r->result == ZCK_VERIFY_CLEAN) {
        clean_run++;
      } else {
        clean_run = 0;
        unchecked++;
        ZT_ASSERT(st != ZCK_OK);
        if (!strstr(zck_last_error(), "Input/output error")) ZT_FAIL("read fault #%llu: %s", (unsigned long long)nth, zck_last_error());
      }
      zck_verify_report_free(r);
    }
    ZT_ASSERT(clean_run == 50);
    ZT_ASSERT(unchecked > 10);
    zck__io_fault_set(ZCK_IO_OP_READ, 0, 0);
  }
  free(ck);
  free(src);
}

int main(void) {
  char *tmp = zt_tmpdir();
  test_clean_fixtures();
  test_deepspeed_damage(tmp);
  test_safetensors_damage(tmp);
  test_torch_damage(tmp);
  test_read_faults(tmp);
  free(tmp);
  printf("ok\n");
  return 0;
}
