/* verify.c: `zckpt verify`: is this checkpoint whole, and if not, where is it damaged?
 *
 * Four steps, each adding findings to one report (verify_report.c):
 *   1. what PATH is: a DeepSpeed root / tag folder, an HF or safetensors folder, an index,
 *      a single .safetensors or .pt file; the folder its files are relative to ("base");
 *   2. the manifest of base, if any (a malformed one stops here: exit 1), and the partial
 *      marker of an interrupted zckpt save;
 *   3. structure (verify_structure.c): the DeepSpeed / universal reader (file set, world
 *      size, shapes add up), every .pt opened fully (zip directory, pickle, tensor
 *      geometry) and every .safetensors header, files in parallel, the HF index;
 *   4. data (verify_data.c), one parallel pass reading each file once: the CRC-32 of every
 *      zip record (names the record and the tensors in it), and with a manifest each file's
 *      size and XXH3, chunk hashes (byte ranges) and each tensor's XXH3 (names the tensor).
 * Damage is anything the files say against themselves or their manifest; what could not
 * be read or is not supported is "unchecked"; damage wins for the exit status.
 */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dcp/dcp.h"
#include "io.h"
#include "manifest.h"
#include "source.h"
#include "verify_internal.h"

bool zck__verify_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !memcmp(s + n - m, suffix, m);
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool zck__verify_exists_in(const char *dir, const char *name) {
  char *p = zck__path_join(dir, name);
  struct stat sb;
  bool r = p && stat(p, &sb) == 0;
  free(p);
  return r;
}

zck_verify_severity zck__verify_severity_of(zck_status s) {
  switch (s) {
  case ZCK_ERR_FORMAT: case ZCK_ERR_TRUNCATED: case ZCK_ERR_MISMATCH: case ZCK_ERR_NOT_FOUND: case ZCK_ERR_DAMAGED:
    return ZCK_VERIFY_DAMAGE;
  default:
    return ZCK_VERIFY_UNCHECKABLE;
  }
}

void zck__verify_add_status(vctx *c, zck_status s, const char *check, const char *file, const char *msg) {
  for (size_t i = 0; i < c->r->n; i++) /* the DeepSpeed reader and the file check may say the same */
    if (!strcmp(c->r->v[i].message, msg)) return;
  zck_verify_severity sev = zck__verify_severity_of(s);
  if (sev == ZCK_VERIFY_UNCHECKABLE && c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = s;
  zck__vreport_add(c->r, sev, check, file, NULL, -1, 0, "%s", msg);
}


/* A folder holding DeepSpeed rank files. */
static bool ds_files_in(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d))) found = zck__verify_ends_with(e->d_name, "_model_states.pt") || zck__verify_ends_with(e->d_name, "optim_states.pt");
  closedir(d);
  return found;
}

/* A DeepSpeed root or tag folder, as the jobs would take it: one with `latest` (any kind of
 * entry: a dangling link or a loop is the reader's to refuse, not a reason to verify the
 * folder as something else), with rank files, or a root whose `latest` is gone but whose
 * tag folders are there (the jobs refuse it: "no 'latest' file; pass a tag"). */
static bool ds_dir(const char *dir) {
  char *lp = zck__path_join(dir, "latest");
  struct stat sb;
  bool has_latest = lp && lstat(lp, &sb) == 0;
  free(lp);
  if (has_latest || ds_files_in(dir)) return true;
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char *sub = zck__path_join(dir, e->d_name);
    found = sub && is_dir(sub) && ds_files_in(sub);
    free(sub);
  }
  closedir(d);
  return found;
}

// ---- step 1: what PATH is

/* A torch Distributed Checkpoint: the files checked are those of the folder the reader
 * takes (an output_dir's newest checkpoint-N; Accelerate's save_state folder, holding the
 * model's and the optimizer's DCP folders). */
static zck_status resolve_dcp(vctx *c) {
  char *dir = NULL;
  ZCK_TRY(zck_dcp_resolve(c->path, &dir));
  c->is_dcp = true;
  zck__vreport_set(&c->r->kind, "dcp");
  const char *b = strrchr(dir, '/');
  if (b && !strcmp(b + 1, "pytorch_model_fsdp_0")) dir[b - dir] = 0;
  free(c->base);
  c->base = dir;
  return ZCK_OK;
}

/* A universal folder, or the parent whose latest_universal names it. */
static zck_status resolve_universal(vctx *c) {
  c->is_uv = true;
  zck__vreport_set(&c->r->kind, "universal");
  if (zck__verify_exists_in(c->path, "zero/optimizer_state.pt") || !zck__verify_exists_in(c->path, "latest_universal")) return ZCK_OK;
  char *lp = zck__path_join(c->path, "latest_universal"), *name = NULL;
  zck_status ls = lp ? zck__read_small_file(lp, 4096, &name, NULL) : ZCK_ERR_NO_MEMORY;
  free(lp);
  if (ls == ZCK_ERR_NO_MEMORY) return ls;
  if (ls == ZCK_ERR_IO) zck__verify_add_status(c, ls, "read", NULL, zck_last_error());
  else zck_clear_error(); /* a bad latest_universal is the universal reader's to explain */
  if (name) {
    size_t n = strlen(name);
    while (n && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ' || name[n - 1] == '\t')) name[--n] = 0;
    if (*name && !strchr(name, '/') && strcmp(name, "..") && strcmp(name, ".")) {
      char *d = zck__path_join(c->path, name);
      if (d && is_dir(d)) { free(c->base); c->base = d; d = NULL; }
      free(d);
    }
  }
  free(name);
  return ZCK_OK;
}

/* A Hugging Face Trainer output_dir of DeepSpeed checkpoints: no `latest` of its own, and
 * a checkpoint-N folder holding one (a Trainer run without DeepSpeed has none: its folder
 * is verified file by file, as before). */
static bool trainer_output_dir(const char *dir) {
  if (zck__verify_exists_in(dir, "latest")) return false;
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d))) {
    if (strncmp(e->d_name, "checkpoint-", 11)) continue;
    char *sub = zck__path_join(dir, e->d_name), *lp = sub ? zck__path_join(sub, "latest") : NULL;
    struct stat sb;
    found = lp && is_dir(sub) && lstat(lp, &sb) == 0;
    free(lp);
    free(sub);
  }
  closedir(d);
  return found;
}

/* PATH a Trainer output_dir: the checkpoint consolidate takes from it (the newest complete
 * checkpoint-N) is the one checked, so verify never says clean where consolidate refuses
 * (it checked every .pt below PATH one by one, and a checkpoint-N missing a rank file was
 * "clean"). None complete: damage (c->base stays NULL, nothing else checked). */
static zck_status resolve_output_dir(vctx *c) {
  char *picked = NULL, *skipped = NULL;
  zck_status st = zck_hf_last_checkpoint(c->path, &picked, &skipped);
  if (st == ZCK_ERR_NO_MEMORY) return st;
  if (st != ZCK_OK) {
    zck__verify_add_status(c, st, "structure", c->path, zck_last_error());
    zck_clear_error();
    return ZCK_OK;
  }
  zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", picked, NULL, -1, 0,
                   "%s: a Trainer output_dir: checked %s, the newest complete checkpoint (as consolidate takes it)%s%s",
                   c->path, picked, skipped ? "; " : "", skipped ? skipped : "");
  free(skipped);
  c->picked = picked;
  c->path = picked;
  return ZCK_OK;
}

static zck_status resolve(vctx *c) {
  struct stat sb;
  if (!c->o.tag && stat(c->path, &sb) == 0 && S_ISDIR(sb.st_mode) && trainer_output_dir(c->path)) {
    ZCK_TRY(resolve_output_dir(c));
    if (!c->picked) return ZCK_OK; /* reported: run() stops */
  }
  if (stat(c->path, &sb) != 0) {
    zck_status s = zck__fail_errno(errno, "%s: cannot verify", c->path);
    if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = s;
    zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "read", c->path, NULL, -1, 0, "%s", zck_last_error());
    return ZCK_OK; /* run() stops: nothing to check */
  }
  if (S_ISDIR(sb.st_mode)) {
    c->base = zck__strdup(c->path);
    if (!c->base) return ZCK_ERR_NO_MEMORY;
    if (zck__src_sniff(c->path) == ZCK__SRC_UNIVERSAL) return resolve_universal(c);
    if (!ds_dir(c->path)) return zck_dcp_is_checkpoint(c->path) ? resolve_dcp(c) : ZCK_OK;
    c->is_ds = true;
    zck__vreport_set(&c->r->kind, "deepspeed");
    /* a root: its files are those of the tag folder `latest` (or --tag) names */
    char *tag = NULL;
    if (c->o.tag) {
      tag = zck__strdup(c->o.tag);
    } else if (zck__verify_exists_in(c->path, "latest")) {
      char *lp = zck__path_join(c->path, "latest");
      zck_status ls = lp ? zck__read_small_file(lp, 4096, &tag, NULL) : ZCK_ERR_NO_MEMORY;
      free(lp);
      if (ls == ZCK_ERR_NO_MEMORY) return ls;
      if (ls == ZCK_ERR_IO) zck__verify_add_status(c, ls, "read", NULL, zck_last_error());
      else zck_clear_error(); /* a bad `latest` is the DeepSpeed reader's to explain */
      if (tag) { /* no trailing newline in DeepSpeed's file, but strip like the reader */
        size_t n = strlen(tag);
        while (n && (tag[n - 1] == '\n' || tag[n - 1] == '\r' || tag[n - 1] == ' ' || tag[n - 1] == '\t')) tag[--n] = 0;
      }
    }
    if (tag && *tag && !strchr(tag, '/') && strcmp(tag, "..") && strcmp(tag, ".")) {
      char *td = zck__path_join(c->path, tag);
      if (td && is_dir(td)) { free(c->base); c->base = td; td = NULL; }
      else if (td && c->o.tag) {
        /* --tag names what the user asked about, not what the checkpoint claims: a tag that
         * is not there is nothing checked (exit 1), not damage (exit 3: a script removing
         * damaged checkpoints would remove a sound one) */
        zck_status s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: tag folder '%s' does not exist", c->path, tag);
        if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = s;
        zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "read", td, NULL, -1, 0, "%s", zck_last_error());
        free(td);
        free(tag);
        free(c->base);
        c->base = NULL; /* run() stops: nothing to check */
        return ZCK_OK;
      }
      free(td);
    }
    free(tag);
    return ZCK_OK;
  }
  /* a file: its folder holds the manifest, if any */
  char *copy1 = zck__strdup(c->path), *copy2 = zck__strdup(c->path);
  if (!copy1 || !copy2) { free(copy1); free(copy2); return ZCK_ERR_NO_MEMORY; }
  c->base = zck__strdup(dirname(copy1));
  if (zck__verify_ends_with(c->path, ".index.json")) c->hf_index_given = true;
  else c->single = zck__strdup(basename(copy2));
  free(copy1);
  free(copy2);
  if (!c->base || (!c->hf_index_given && !c->single)) return ZCK_ERR_NO_MEMORY;
  return ZCK_OK;
}

// ---- step 2: the manifest

/* Only the single file's entry and tensors, for `zckpt verify DIR/model.safetensors`. */
static zck_status filter_manifest(zck_manifest *m, const char *rel, zck_manifest **out) {
  *out = NULL;
  ptrdiff_t fi = zck_manifest_find_file(m, rel);
  if (fi < 0) return ZCK_OK;
  zck_manifest *f = NULL;
  ZCK_TRY(zck_manifest_new(&f));
  f->kind = m->kind;
  f->chunk_size = m->chunk_size;
  zck_status st = m->has_layout ? zck_manifest_set_layout(f, &m->layout) : ZCK_OK;
  if (st == ZCK_OK) st = zck_manifest_add_file(f, rel, NULL);
  if (st == ZCK_OK) {
    zck_manifest_file *d = &f->files[0], *s = &m->files[fi];
    d->size = s->size;
    d->xxh3 = s->xxh3;
    d->hashed = s->hashed;
    if (s->n_chunks) {
      d->chunks = zck__malloc(s->n_chunks * sizeof *d->chunks);
      if (!d->chunks) st = ZCK_ERR_NO_MEMORY;
      else { memcpy(d->chunks, s->chunks, s->n_chunks * sizeof *d->chunks); d->n_chunks = s->n_chunks; }
    }
  }
  for (size_t i = 0; st == ZCK_OK && i < m->n_tensors; i++) {
    const zck_manifest_tensor *t = &m->tensors[i];
    if (t->file != (size_t)fi) continue;
    size_t k;
    st = zck_manifest_add_tensor(f, 0, t->name, t->dtype, t->ndim, t->shape, t->offset, t->nbytes, &k);
    if (st == ZCK_OK) { f->tensors[k].xxh3 = t->xxh3; f->tensors[k].hashed = t->hashed; }
  }
  if (st != ZCK_OK) { zck_manifest_free(f); return st; }
  *out = f;
  return ZCK_OK;
}

static zck_status load_manifest(vctx *c) {
  if (!c->single) {
    /* a folder that cannot be listed: say so (its manifest's open would fail first, and
     * name a file the user never asked about) */
    DIR *d = opendir(c->base);
    if (!d && errno != ENOENT) {
      zck_status s = zck__fail_errno(errno, "%s: cannot list the folder", c->base);
      c->r->first_unchecked = s;
      zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "read", c->base, NULL, -1, 0, "%s", zck_last_error());
      return ZCK_OK; /* run() stops: nothing to check */
    }
    if (d) closedir(d);
  }
  zck_manifest *m = NULL;
  zck_status st = zck_manifest_read(c->base, &m);
  char *mpath = zck__path_join(c->base, ZCK_MANIFEST_NAME);
  if (!mpath) { zck_manifest_free(m); return ZCK_ERR_NO_MEMORY; }
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    st = ZCK_OK;
    if (zck__verify_exists_in(c->base, ZCK_MANIFEST_PARTIAL_NAME)) {
      if (c->o.force)
        zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "incomplete", c->base, NULL, -1, 0,
                         "%s: marked incomplete (" ZCK_MANIFEST_PARTIAL_NAME ", no " ZCK_MANIFEST_NAME "); checked anyway (--force)", c->base);
      else
        zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "incomplete", c->base, NULL, -1, 0,
                         "%s: incomplete checkpoint: zckpt started writing it and never wrote " ZCK_MANIFEST_NAME
                         " (interrupted save?); --force checks the files anyway", c->base);
    } else if (c->single && zck__src_sniff(c->path) == ZCK__SRC_HDF5) {
      /* an HDF5 container carries its own checks: check_h5u says which it had */
    } else {
      zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                       "no " ZCK_MANIFEST_NAME ": structure checks only (zip CRCs, headers, shapes); no checksums of the data as written");
      /* NVMe-offloaded optimizer state: raw swap files that carry no CRC either */
      if (zck__verify_exists_in(c->base, "offloaded_tensors"))
        zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                         "%s/offloaded_tensors: NVMe swap files are raw bytes without checksums: only their presence and "
                         "sizes are checked (a flipped bit there cannot be seen without a manifest)", c->base);
    }
  } else if (st != ZCK_OK) {
    if (st == ZCK_ERR_NO_MEMORY) { free(mpath); return st; }
    /* a manifest that cannot be read gives nothing to check against: exit 1, not 3 */
    c->r->first_unchecked = st;
    zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "manifest", mpath, NULL, -1, 0, "%s", zck_last_error());
    st = ZCK_OK;
  } else if (c->single) {
    zck_manifest *f = NULL;
    st = filter_manifest(m, c->single, &f);
    if (st == ZCK_OK && !f)
      zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                       "%s: not listed in %s: structure checks only", c->path, mpath);
    if (f) zck__vreport_set(&c->r->manifest, mpath);
    c->expected = f;
  } else {
    c->expected = m;
    m = NULL;
    zck__vreport_set(&c->r->manifest, mpath);
    if (zck__verify_exists_in(c->base, ZCK_MANIFEST_PARTIAL_NAME))
      zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "incomplete", c->base, NULL, -1, 0,
                       "%s: a stale " ZCK_MANIFEST_PARTIAL_NAME " beside the manifest (a save interrupted after the manifest was written)",
                       c->base);
  }
  zck_manifest_free(m);
  free(mpath);
  return st;
}

// ---- the file list

static vf_type type_of(const char *rel, const char *full) {
  if (zck__verify_ends_with(rel, ".safetensors")) return VF_SAFETENSORS;
  if (zck__verify_ends_with(rel, ".pt") || zck__verify_ends_with(rel, ".bin") || zck__verify_ends_with(rel, ".pth") || zck__verify_ends_with(rel, ".ckpt")) {
    zck__source src;
    if (zck__source_open(&src, full) != ZCK_OK) { zck_clear_error(); return VF_TORCH; } /* the open says why */
    uint8_t head[4] = {0};
    bool zip = src.size >= 4 && zck__source_read(&src, head, 4, 0) == ZCK_OK && !memcmp(head, "PK\3\4", 4);
    bool legacy = src.size >= 2 && head[0] == 0x80; /* torch explains T-01 */
    zck__source_close(&src);
    zck_clear_error();
    if (zip || legacy || zck__verify_ends_with(rel, ".pt") || zck__verify_ends_with(rel, ".pth")) return VF_TORCH;
    return VF_OTHER; /* a .bin that is not torch */
  }
  return VF_OTHER;
}

/* Symlinks under dir that are not to folders (rank files kept elsewhere, deduplicated
 * storage), as relative paths: the manifest's listing never follows symlinks, but
 * DeepSpeed and every reader do, so verify checks what they would read. A dangling one is
 * listed too (its open says what is wrong). */
static zck_status add_symlinks(const char *dir, const char *rel, char ***paths, size_t *n, int depth) {
  if (depth > 16) return ZCK_OK;
  char *full = rel ? zck__path_join(dir, rel) : zck__strdup(dir);
  if (!full) return ZCK_ERR_NO_MEMORY;
  DIR *d = opendir(full);
  zck_status st = ZCK_OK;
  struct dirent *e;
  while (d && st == ZCK_OK && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || strstr(e->d_name, ".zck-tmp-")) continue;
    char *erel = rel ? zck__path_join(rel, e->d_name) : zck__strdup(e->d_name);
    char *efull = erel ? zck__path_join(dir, erel) : NULL;
    struct stat lsb, sb;
    if (!erel || !efull) {
      st = ZCK_ERR_NO_MEMORY;
    } else if (lstat(efull, &lsb) == 0) {
      if (S_ISDIR(lsb.st_mode)) {
        st = add_symlinks(dir, erel, paths, n, depth + 1);
      } else if (S_ISLNK(lsb.st_mode) && !(stat(efull, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        char **grown = realloc(*paths, (*n + 1) * sizeof **paths);
        if (!grown) st = ZCK_ERR_NO_MEMORY;
        else { *paths = grown; (*paths)[(*n)++] = erel; erel = NULL; }
      }
    }
    free(erel);
    free(efull);
  }
  if (d) closedir(d);
  free(full);
  return st == ZCK_ERR_NO_MEMORY ? zck__fail(st, "out of memory") : st;
}

/* The files of the manifest's folder that it does not list: added after the save (a copy
 * of a rank file, a param folder of another checkpoint), or left out by the manifest of
 * `verify --write-manifest`, which lists only what it checked (an HF folder's config.json).
 * DeepSpeed and zckpt's readers ignore them, so they are no damage, but the manifest is the
 * record of what the save wrote: each is one warning, and its bytes are not read (nothing
 * to check them against).
 * Only the paths zck_manifest_list_files gives, so exactly what the manifest's writer would
 * have listed: never the manifest, the partial marker, temporaries or symlinks (the writer
 * leaves those out on purpose; a symlink is still checked as DeepSpeed would read it). The
 * paths kept are compacted to the front of paths. */
static zck_status drop_unlisted(vctx *c, char **paths, size_t *n) {
  size_t kept = 0;
  for (size_t i = 0; i < *n; i++) {
    if (zck_manifest_find_file(c->expected, paths[i]) >= 0) { paths[kept++] = paths[i]; continue; }
    char *full = zck__path_join(c->base, paths[i]);
    if (!full) { /* the rest stays for the caller to free */
      memmove(paths + kept, paths + i, (*n - i) * sizeof *paths);
      *n = kept + (*n - i);
      return ZCK_ERR_NO_MEMORY;
    }
    zck__vreport_add(c->r, ZCK_VERIFY_WARNING, "extra-file", full, NULL, -1, 0,
                     "%s: not listed in " ZCK_MANIFEST_NAME " (added after it was written, or no file it covers): not read",
                     full);
    free(full);
    free(paths[i]);
  }
  *n = kept;
  return ZCK_OK;
}

static zck_status list_files(vctx *c) {
  char **paths = NULL;
  size_t n = 0;
  if (c->single) {
    paths = zck__malloc(sizeof *paths);
    if (!paths || !(paths[0] = zck__strdup(c->single))) { free(paths); return ZCK_ERR_NO_MEMORY; }
    n = 1;
  } else {
    zck_status st = zck_manifest_list_files(c->base, &paths, &n);
    if (st != ZCK_OK) {
      zck__verify_add_status(c, st == ZCK_ERR_NOT_FOUND ? ZCK_ERR_IO : st, "read", c->base, zck_last_error());
      return ZCK_OK;
    }
    if (c->expected && (st = drop_unlisted(c, paths, &n)) != ZCK_OK) {
      zck_manifest_free_paths(paths, n);
      return st;
    }
    if ((st = add_symlinks(c->base, NULL, &paths, &n, 0)) != ZCK_OK) {
      zck_manifest_free_paths(paths, n);
      return st;
    }
  }
  c->files = zck__calloc(n ? n : 1, sizeof *c->files);
  if (!c->files) { zck_manifest_free_paths(paths, n); return ZCK_ERR_NO_MEMORY; }
  for (size_t i = 0; i < n; i++) {
    vfile *f = &c->files[c->n_files++];
    f->rel = paths[i];
    paths[i] = NULL;
    f->full = zck__path_join(c->base, f->rel);
    if (!f->full) { zck_manifest_free_paths(paths, n); return ZCK_ERR_NO_MEMORY; }
    f->type = type_of(f->rel, f->full);
    f->mf = c->expected ? zck_manifest_find_file(c->expected, f->rel) : -1;
  }
  zck_manifest_free_paths(paths, n);
  return ZCK_OK;
}


// ---- the job

static void vctx_free(vctx *c) {
  for (size_t i = 0; i < c->n_files; i++) {
    vfile *f = &c->files[i];
    free(f->rel);
    free(f->full);
    free(f->open_error);
    for (size_t k = 0; k < f->n_warnings; k++) free(f->warnings[k]);
    free(f->warnings);
    for (size_t k = 0; k < f->n_recs; k++) {
      free(f->recs[k].name);
      free(f->recs[k].tensors);
    }
    free(f->recs);
  }
  free(c->files);
  free(c->base);
  free(c->single);
  free(c->picked);
  zck_manifest_free(c->expected);
}

static zck_status run(vctx *c) {
  ZCK_TRY(resolve(c));
  if (!c->base) return ZCK_OK; /* PATH does not exist (reported) */
  zck__vreport_set(&c->r->dir, c->base);
  c->r->pub.single_file = c->single != NULL;
  ZCK_TRY(load_manifest(c));
  if (c->r->first_unchecked != ZCK_OK) return ZCK_OK; /* a malformed manifest: nothing to check against */
  ZCK_TRY(list_files(c));
  ZCK_TRY(zck__verify_structure(c));
  if (c->o.skip_data) {
    zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0, "data not read (--structure-only): no CRCs, no checksums");
    for (size_t i = 0; i < c->n_files; i++) c->r->pub.files++;
    return ZCK_OK;
  }
  return zck__verify_data(c);
}

zck_status zck_verify(const char *path, const zck_verify_opts *opts, zck_verify_report **out) {
  ZCK_ASSERT(path && out);
  *out = NULL;
  ZCK_TRY(zck__src_refuse_known(path)); /* a layout it does not read is not "damaged" */
  vctx c;
  memset(&c, 0, sizeof c);
  c.path = path;
  zck_verify_opts dflt = ZCK_VERIFY_OPTS_INIT;
  c.o = opts ? *opts : dflt;
  ZCK_ASSERT(c.o.version >= 1);
  c.r = zck__vreport_new(path);
  if (!c.r) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck_status st = run(&c);
  vctx_free(&c);
  if (st == ZCK_ERR_NO_MEMORY) {
    zck_verify_report_free(&c.r->pub);
    return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory while verifying", path);
  }
  if (st != ZCK_OK) { /* a failure of verify itself, not of the checkpoint */
    if (c.r->first_unchecked == ZCK_OK) c.r->first_unchecked = st;
    zck__vreport_add(c.r, ZCK_VERIFY_UNCHECKABLE, "read", NULL, NULL, -1, 0, "%s", zck_last_error());
  }
  *out = &c.r->pub;
  return zck__vreport_finish(c.r);
}

zck_status zck_verify_write_manifest(const zck_verify_report *pub, const zck_manifest_opts *opts) {
  ZCK_ASSERT(pub);
  const zck__vreport *r = (const zck__vreport *)pub; /* pub is the first member */
  if (pub->result != ZCK_VERIFY_CLEAN)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: not clean: no manifest written", pub->path);
  if (pub->single_file || !pub->dir)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: a manifest is written for a folder, not a single file", pub->path);
  if (pub->manifest)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: already has " ZCK_MANIFEST_NAME, pub->dir);
  if (r->checked_lost) return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory while verifying", pub->path);
  return zck__manifest_write_dir_only(pub->dir, opts, (const char *const *)r->checked, r->n_checked);
}
