/* ds_files.c: from a user path to a tag folder and its classified files. See ds_files.h. */
#include "ds_files.h"

#include "deepspeed/deepspeed.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Rank numbers above this are taken as garbage, not a real job. */
#define ZCK__DS_MAX_RANK (1u << 20)
#define ZCK__DS_MAX_LATEST 4096

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !memcmp(s + n - m, suffix, m);
}

static bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Decimal rank as DeepSpeed prints it: no sign, no leading zeros. Returns the end or NULL. */
static const char *parse_rank(const char *s, uint32_t *out) {
  if (*s < '0' || *s > '9') return NULL;
  if (*s == '0' && s[1] >= '0' && s[1] <= '9') return NULL;
  uint64_t v = 0;
  while (*s >= '0' && *s <= '9') {
    v = v * 10 + (uint64_t)(*s++ - '0');
    if (v > ZCK__DS_MAX_RANK) return NULL;
  }
  *out = (uint32_t)v;
  return s;
}

/* "{mp:02d}": at least two digits. */
static const char *parse_mp(const char *s, uint32_t *out) {
  size_t nd = 0;
  uint64_t v = 0;
  while (s[nd] >= '0' && s[nd] <= '9') {
    v = v * 10 + (uint64_t)(s[nd] - '0');
    if (v > ZCK__DS_MAX_RANK) return NULL;
    nd++;
  }
  if (nd < 2 || (nd > 2 && s[0] == '0')) return NULL;
  *out = (uint32_t)v;
  return s + nd;
}

static const char *skip(const char *s, const char *lit) {
  size_t n = strlen(lit);
  return strncmp(s, lit, n) ? NULL : s + n;
}

typedef enum { NAME_OTHER, NAME_MODEL, NAME_Z3_MODEL, NAME_OPTIM, NAME_EXPERT, NAME_PIPE_LAYER, NAME_UNKNOWN_STATES } name_kind;

/* Classifies a file name of the tag folder; fills dp/mp/prefix for the known kinds. */
static name_kind classify(const char *name, uint32_t *dp, uint32_t *mp, zck__ds_prefix *prefix) {
  const char *p;
  /* layer_{idx:02d}-model_states.pt (PipelineModule.ckpt_layer_path, no tensor parallelism): dp = the layer */
  if ((p = skip(name, "layer_")) && (p = parse_mp(p, dp)) && !strcmp(p, "-model_states.pt")) return NAME_PIPE_LAYER;
  if (!strncmp(name, "layer_", 6) && ends_with(name, "-model_states.pt")) return NAME_UNKNOWN_STATES;
  if (ends_with(name, "_model_states.pt")) {
    if ((p = skip(name, "mp_rank_")) && (p = parse_mp(p, mp)) && !strcmp(p, "_model_states.pt")) return NAME_MODEL;
    if ((p = skip(name, "zero_pp_rank_")) && (p = parse_rank(p, dp)) && (p = skip(p, "_mp_rank_")) &&
        (p = parse_mp(p, mp)) && !strcmp(p, "_model_states.pt"))
      return NAME_Z3_MODEL;
    /* layer_<L>_expert_<E>_mp_rank_XX_model_states.pt (engine.py _get_expert_ckpt_name): dp = E, the layer is
     * read back from the name by ds_autoep.c, which alone decides whether such files are accepted */
    uint32_t layer;
    if ((p = skip(name, "layer_")) && (p = parse_rank(p, &layer)) && (p = skip(p, "_expert_")) && (p = parse_rank(p, dp)) &&
        (p = skip(p, "_mp_rank_")) && (p = parse_mp(p, mp)) && !strcmp(p, "_model_states.pt"))
      return NAME_EXPERT;
    return NAME_UNKNOWN_STATES;
  }
  if (ends_with(name, "optim_states.pt")) {
    *prefix = ZCK__DS_PREFIX_NONE;
    p = name;
    if (skip(p, "bf16_")) { *prefix = ZCK__DS_PREFIX_BF16; p += 5; }
    else if (skip(p, "fp16_")) { *prefix = ZCK__DS_PREFIX_FP16; p += 5; }
    if ((p = skip(p, "zero_pp_rank_")) && (p = parse_rank(p, dp)) && (p = skip(p, "_mp_rank_")) &&
        (p = parse_mp(p, mp)) && (!strcmp(p, "_optim_states.pt") || !strcmp(p, "optim_states.pt") /* DS-17 */))
      return NAME_OPTIM;
    return NAME_UNKNOWN_STATES;
  }
  return NAME_OTHER;
}

static const char *prefix_str(zck__ds_prefix p) {
  return p == ZCK__DS_PREFIX_BF16 ? "bf16_" : p == ZCK__DS_PREFIX_FP16 ? "fp16_" : "";
}

long zck_ds_name_rank(const char *name, size_t len) {
  static const char key[] = "zero_pp_rank_", tail[] = "_mp_rank_";
  for (size_t i = 0; i + sizeof key - 1 < len; i++) {
    if (memcmp(name + i, key, sizeof key - 1)) continue;
    const char *p = name + i + sizeof key - 1, *end = name + len;
    long r = 0;
    size_t digits = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++)
      if (r < 1000000000L) r = r * 10 + (*p - '0');
    if (digits && (size_t)(end - p) >= sizeof tail - 1 && !memcmp(p, tail, sizeof tail - 1)) return r;
  }
  return -1;
}

long zck_ds_name_mp(const char *name, size_t len) {
  static const char key[] = "mp_rank_";
  long found = -1;
  for (size_t i = 0; i + sizeof key - 1 < len; i++) {
    if (memcmp(name + i, key, sizeof key - 1)) continue;
    const char *p = name + i + sizeof key - 1, *end = name + len;
    long r = 0;
    size_t digits = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++)
      if (r < 1000000000L) r = r * 10 + (*p - '0');
    if (digits >= 2) found = r;
  }
  return found;
}

char *zck__ds_optim_name_mp(zck__ds_prefix prefix, uint32_t dp_rank, uint32_t mp_rank) {
  return zck__sprintf("%szero_pp_rank_%u_mp_rank_%02u_optim_states.pt", prefix_str(prefix), dp_rank, mp_rank);
}

char *zck__ds_model_name_mp(int stage, uint32_t dp_rank, uint32_t mp_rank) {
  if (stage == 3) return zck__sprintf("zero_pp_rank_%u_mp_rank_%02u_model_states.pt", dp_rank, mp_rank);
  return zck__sprintf("mp_rank_%02u_model_states.pt", mp_rank);
}

char *zck__ds_optim_name(zck__ds_prefix prefix, uint32_t dp_rank) { return zck__ds_optim_name_mp(prefix, dp_rank, 0); }
char *zck__ds_model_name(int stage, uint32_t dp_rank) { return zck__ds_model_name_mp(stage, dp_rank, 0); }

zck_status zck__ds_check_tag(const char *tag, const char *where) {
  /* DS-02 / DS-03: the tag is joined to the root, so it must be one plain path component. */
  if (!*tag) return zck__fail(ZCK_ERR_FORMAT, "%s: empty tag", where);
  if (tag[0] == '/' || strchr(tag, '/') || strchr(tag, '\\') || !strcmp(tag, ".") || !strcmp(tag, "..") ||
      strstr(tag, ".."))
    return zck__fail(ZCK_ERR_FORMAT, "%s: tag '%.200s' is not a plain folder name (contains '/', '\\' or '..')",
                     where, tag);
  for (const unsigned char *c = (const unsigned char *)tag; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      return zck__fail(ZCK_ERR_FORMAT, "%s: tag contains control character 0x%02x", where, *c);
  return ZCK_OK;
}

static void rankfile_free(zck__ds_rankfile *f) {
  free(f->name);
  free(f->path);
  memset(f, 0, sizeof *f);
}

void zck__ds_fileset_free(zck__ds_fileset *fs) {
  if (!fs) return;
  free(fs->root);
  free(fs->tag);
  free(fs->dir);
  rankfile_free(&fs->model);
  for (size_t i = 0; i < fs->n_z3_models; i++) rankfile_free(&fs->z3_models[i]);
  for (size_t i = 0; i < fs->n_optims; i++) rankfile_free(&fs->optims[i]);
  for (size_t i = 0; i < fs->n_experts; i++) rankfile_free(&fs->experts[i]);
  free(fs->experts);
  for (size_t i = 0; i < fs->n_layers; i++) rankfile_free(&fs->layers[i]);
  free(fs->layers);
  free(fs->z3_models);
  free(fs->optims);
  memset(fs, 0, sizeof *fs);
}

static int cmp_rank(const void *a, const void *b) {
  const zck__ds_rankfile *x = a, *y = b;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static zck_status push(zck__ds_rankfile **arr, size_t *n, uint32_t rank, const char *dir, const char *name,
                       uint64_t size) {
  zck__ds_rankfile *na = zck__realloc(*arr, (*n + 1) * sizeof **arr);
  if (!na) return ZCK_ERR_NO_MEMORY;
  *arr = na;
  zck__ds_rankfile *f = &na[*n];
  memset(f, 0, sizeof *f);
  f->rank = rank;
  f->size = size;
  f->name = zck__strdup(name);
  f->path = zck__path_join(dir, name);
  (*n)++;
  if (!f->name || !f->path) return ZCK_ERR_NO_MEMORY;
  return ZCK_OK;
}

/* Reads `latest`: the tag with surrounding whitespace stripped (DeepSpeed writes no newline,
 * other tools do). */
static zck_status read_latest(const char *latest_path, char **tag) {
  char *buf = NULL;
  size_t len = 0;
  zck_status s = zck__read_small_file(latest_path, ZCK__DS_MAX_LATEST, &buf, &len);
  if (s != ZCK_OK) return s;   /* io's message names the file */
  if (strlen(buf) != len) {
    free(buf);
    return zck__fail(ZCK_ERR_FORMAT, "%s: contains a NUL byte; expected the tag name", latest_path);
  }
  char *b = buf, *e = buf + len;
  while (b < e && (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r' || *b == '\v' || *b == '\f')) b++;
  while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r' || e[-1] == '\v' || e[-1] == '\f'))
    e--;
  if (b == e) {
    free(buf);
    return zck__fail(ZCK_ERR_FORMAT, "%s: empty (expected the tag name, e.g. global_step500)", latest_path);
  }
  *tag = zck__strndup(b, (size_t)(e - b));
  free(buf);
  if (!*tag) return ZCK_ERR_NO_MEMORY;
  zck_status ts = zck__ds_check_tag(*tag, latest_path);
  if (ts != ZCK_OK) { free(*tag); *tag = NULL; }
  return ts;
}

/* 1 if dir directly holds *_model_states.pt or *_optim_states.pt files. */
static int has_states_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  int found = 0;
  while (!found && (e = readdir(d)))
    if (ends_with(e->d_name, "_model_states.pt") || ends_with(e->d_name, "optim_states.pt")) found = 1;
  closedir(d);
  return found;
}

/* Lists subfolders that look like tags, for the "pass a tag" hint. */
static void list_tag_dirs(const char *root, char *out, size_t cap) {
  out[0] = 0;
  DIR *d = opendir(root);
  if (!d) return;
  struct dirent *e;
  size_t used = 0, count = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char *child = zck__path_join(root, e->d_name);
    if (child && is_dir(child) && has_states_files(child)) {
      if (count < 8) {
        int w = snprintf(out + used, cap - used, "%s%s", count ? ", " : "", e->d_name);
        if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
      }
      count++;
    }
    free(child);
  }
  closedir(d);
  if (count > 8 && used + 8 < cap) snprintf(out + used, cap - used, ", ...");
}

static char *strip_slashes(const char *path) {
  char *p = zck__strdup(path);
  if (!p) return NULL;
  size_t n = strlen(p);
  while (n > 1 && p[n - 1] == '/') p[--n] = 0;
  return p;
}

/* Splits "a/b/c" into parent "a/b" and base "c". */
static zck_status split_path(const char *path, char **parent, char **base) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    *parent = zck__strdup(".");
    *base = zck__strdup(path);
  } else {
    *parent = slash == path ? zck__strdup("/") : zck__strndup(path, (size_t)(slash - path));
    *base = zck__strdup(slash + 1);
  }
  return *parent && *base ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

static zck_status resolve(const char *user_path, const char *tag, zck__ds_fileset *fs) {
  struct stat st;
  if (stat(user_path, &st) != 0) return zck__fail_errno(errno, "%s: cannot open checkpoint", user_path);
  if (!S_ISDIR(st.st_mode))
    return zck__fail(ZCK_ERR_INVALID_ARG,
                     "%s: not a directory (pass the checkpoint folder that holds 'latest', or a tag folder)",
                     user_path);
  char *path = strip_slashes(user_path);
  if (!path) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  if (tag) {
    ZCK_CHECK_GOTO(zck__ds_check_tag(tag, "--tag"), s, out);
    fs->root = path;
    path = NULL;
    fs->tag = zck__strdup(tag);
    fs->dir = zck__path_join(fs->root, tag);
    if (!fs->tag || !fs->dir) { s = ZCK_ERR_NO_MEMORY; goto out; }
    if (!is_dir(fs->dir)) {
      s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: tag folder '%s' does not exist", fs->root, tag);
      goto out;
    }
    goto out;
  }
  char *latest = zck__path_join(path, "latest");
  if (!latest) { s = ZCK_ERR_NO_MEMORY; goto out; }
  if (lstat(latest, &st) == 0) {
    s = read_latest(latest, &fs->tag);
    if (s == ZCK_OK) {
      fs->root = path;
      path = NULL;
      fs->tag_from_latest = true;
      fs->dir = zck__path_join(fs->root, fs->tag);
      if (!fs->dir) s = ZCK_ERR_NO_MEMORY;
      else if (!is_dir(fs->dir))  /* DS-02 */
        s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: names tag '%s' but folder %s does not exist", latest, fs->tag,
                      fs->dir);
    }
    free(latest);
    goto out;
  }
  free(latest);
  if (has_states_files(path)) {
    /* A tag folder given directly. */
    ZCK_CHECK_GOTO(split_path(path, &fs->root, &fs->tag), s, out);
    fs->dir = path;
    path = NULL;
    goto out;
  }
  { /* DS-01 */
    char found[512];
    list_tag_dirs(path, found, sizeof found);
    if (found[0])
      s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no 'latest' file; pass a tag (tag folders here: %s)", path, found);
    else
      s = zck__fail(ZCK_ERR_NOT_FOUND,
                    "%s: not a DeepSpeed checkpoint: no 'latest' file and no *_model_states.pt / *_optim_states.pt "
                    "files (pass the save folder or a tag folder)", path);
  }
out:
  free(path);
  return s;
}

static zck_status scan(zck__ds_fileset *fs) {
  DIR *d = opendir(fs->dir);
  if (!d) return zck__fail_errno(errno, "%s: cannot list the tag folder", fs->dir);
  zck_status s = ZCK_OK;
  struct dirent *e;
  bool seen_prefix[3] = {false, false, false};
  char first_of_prefix[3][256] = {{0}};
  while (s == ZCK_OK && (e = readdir(d))) {
    const char *name = e->d_name;
    if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
    if (!strcmp(name, "offloaded_tensors")) { fs->has_offload_dir = true; continue; }
    uint32_t dp = 0, mp = 0;
    zck__ds_prefix prefix = ZCK__DS_PREFIX_NONE;
    name_kind k = classify(name, &dp, &mp, &prefix);
    if (k == NAME_OTHER) continue;
    if (k == NAME_UNKNOWN_STATES && !strncmp(name, "expp_rank_", 10)) {  /* engine.py _get_optimizer_ckpt_name */
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s/%s: a deepspeed.moe checkpoint without ZeRO (stage 0, per expert-parallel "
                    "rank optimizer files): not supported, as by ds_to_universal.py", fs->dir, name);
      break;
    }
    if (k == NAME_UNKNOWN_STATES && !strncmp(name, "layer_", 6) && strstr(name, "-model_") &&
        strstr(name, "-model_") != strstr(name, "-model_states.pt")) {  /* layer_XX-model_YY-model_states.pt */
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s/%s: a PipelineModule layer file of a tensor-parallel run (pipeline and "
                    "tensor parallelism together): not supported", fs->dir, name);
      break;
    }
    if (k == NAME_UNKNOWN_STATES) {  /* DS-11 */
      s = zck__fail(ZCK_ERR_UNSUPPORTED,
                    "%s/%s: unsupported checkpoint layout (MoE expert, pipeline-layer or unknown states file); "
                    "zckpt reads plain ZeRO checkpoints only", fs->dir, name);
      break;
    }
    if (k == NAME_PIPE_LAYER) {  /* every stage's: ds_pipe.c reads them all */
      s = push(&fs->layers, &fs->n_layers, dp, fs->dir, name, 0);
      continue;
    }
    /* AutoTP: every mp rank's files form a ZeRO checkpoint of their own; keep this one's */
    if (mp >= fs->n_mp) fs->n_mp = mp + 1;
    if (mp != fs->mp) continue;
    char *full = zck__path_join(fs->dir, name);
    if (!full) { s = ZCK_ERR_NO_MEMORY; break; }
    struct stat st;
    if (stat(full, &st) != 0) {
      s = zck__fail_errno(errno, "%s: cannot stat", full);
      free(full);
      break;
    }
    free(full);
    if (!S_ISREG(st.st_mode)) {
      s = zck__fail(ZCK_ERR_FORMAT, "%s/%s: not a regular file", fs->dir, name);
      break;
    }
    if (st.st_size == 0) {  /* DS-04 / DS-16 */
      s = zck__fail(ZCK_ERR_TRUNCATED,
                    "%s/%s: incomplete checkpoint: the file is empty (a rank did not finish writing?)", fs->dir, name);
      break;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (k == NAME_MODEL) {
      if (fs->model.name) {
        s = zck__fail(ZCK_ERR_FORMAT, "%s: duplicate model-states file %s", fs->dir, name);
        break;
      }
      fs->model.name = zck__strdup(name);
      fs->model.path = zck__path_join(fs->dir, name);
      fs->model.size = size;
      if (!fs->model.name || !fs->model.path) s = ZCK_ERR_NO_MEMORY;
    } else if (k == NAME_Z3_MODEL) {
      s = push(&fs->z3_models, &fs->n_z3_models, dp, fs->dir, name, size);
    } else if (k == NAME_EXPERT) {
      s = push(&fs->experts, &fs->n_experts, dp, fs->dir, name, size);
    } else {
      if (!seen_prefix[prefix]) snprintf(first_of_prefix[prefix], sizeof first_of_prefix[prefix], "%s", name);
      seen_prefix[prefix] = true;
      fs->prefix = prefix;
      s = push(&fs->optims, &fs->n_optims, dp, fs->dir, name, size);
    }
  }
  closedir(d);
  if (s != ZCK_OK) return s;

  int nprefix = seen_prefix[0] + seen_prefix[1] + seen_prefix[2];
  if (nprefix > 1) {  /* DS-10 */
    int a = seen_prefix[0] ? 0 : 1, b = seen_prefix[2] ? 2 : 1;
    return zck__fail(ZCK_ERR_FORMAT,
                     "%s: optimizer files with two name prefixes (%s and %s): stale files from another run; "
                     "remove one set", fs->dir, first_of_prefix[a], first_of_prefix[b]);
  }
  if (fs->model.name && fs->n_z3_models)
    return zck__fail(ZCK_ERR_FORMAT,
                     "%s: both %s (stage 0-2) and %s (stage 3) present: stale files from another run", fs->dir,
                     fs->model.name, fs->z3_models[0].name);
  if (!fs->model.name && !fs->n_z3_models) {
    if (fs->n_optims)
      return zck__fail(ZCK_ERR_NOT_FOUND,
                       "%s: incomplete checkpoint: no model-states file (mp_rank_%02u_model_states.pt or "
                       "zero_pp_rank_0_mp_rank_%02u_model_states.pt)", fs->dir, fs->mp, fs->mp);
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no DeepSpeed checkpoint files in the tag folder", fs->dir);
  }
  /* no optimizer files beside mp_rank_00_model_states.pt: ZeRO-0 keeps its optimizer state
   * in the model file (ds_zero0.c decides, once the file is read) */
  if (!fs->n_optims && fs->n_z3_models)  /* DS-05 */
    return zck__fail(ZCK_ERR_UNSUPPORTED,
                     "%s: no *_optim_states.pt files: not a ZeRO checkpoint (stage 0 or a non-ZeRO optimizer), or "
                     "incomplete", fs->dir);
  if (fs->has_offload_dir && !fs->n_z3_models)  /* DS-47: only ZeRO-3 swaps its optimizer (ds_offload.c) */
    return zck__fail(ZCK_ERR_UNSUPPORTED,
                     "%s/offloaded_tensors: NVMe-offloaded optimizer states outside a stage-3 checkpoint", fs->dir);

  if (fs->n_optims) qsort(fs->optims, fs->n_optims, sizeof *fs->optims, cmp_rank);
  if (fs->n_z3_models) qsort(fs->z3_models, fs->n_z3_models, sizeof *fs->z3_models, cmp_rank);
  for (size_t i = 1; i < fs->n_optims; i++)
    if (fs->optims[i].rank == fs->optims[i - 1].rank)  /* DS-12: old and new name of the same rank */
      return zck__fail(ZCK_ERR_FORMAT, "%s: two optimizer files for dp rank %u: %s and %s", fs->dir,
                       fs->optims[i].rank, fs->optims[i - 1].name, fs->optims[i].name);
  return ZCK_OK;
}

zck_status zck__ds_find(const char *path, const char *tag, zck__ds_fileset *fs) {
  return zck__ds_find_mp(path, tag, 0, fs);
}

zck_status zck__ds_find_mp(const char *path, const char *tag, uint32_t mp, zck__ds_fileset *fs) {
  memset(fs, 0, sizeof *fs);
  fs->mp = mp;
  fs->n_mp = 1;
  zck_status s = resolve(path, tag, fs);
  if (s == ZCK_OK) s = scan(fs);
  if (s != ZCK_OK) zck__ds_fileset_free(fs);
  return s;
}

/* Checks that files are ranks 0..w-1 exactly, naming the first missing or extra one. */
static zck_status check_set(const char *dir, const zck__ds_rankfile *f, size_t n, uint32_t w, const char *what,
                            const char *who, char *(*name_of)(uint32_t, const void *), const void *ctx) {
  size_t i = 0;
  for (uint32_t r = 0; r < w; r++) {
    if (i < n && f[i].rank == r) { i++; continue; }
    char *missing = name_of(r, ctx);
    zck_status s = zck__fail(ZCK_ERR_NOT_FOUND,
                             "%s/%s: missing %s file for dp rank %u: world size %u (from %s) but %zu %s files found "
                             "(a rank did not save, or an old checkpoint was overwritten)",
                             dir, missing ? missing : "?", what, r, w, who, n, what);
    free(missing);
    return s;
  }
  if (i < n)  /* DS-13: files beyond w */
    return zck__fail(ZCK_ERR_MISMATCH,
                     "%s/%s: extra %s file: dp rank %u, but world size is %u (from %s); stale file from a larger "
                     "run?", dir, f[i].name, what, f[i].rank, w, who);
  return ZCK_OK;
}

static char *optim_name_cb(uint32_t r, const void *ctx) {
  const zck__ds_fileset *fs = ctx;
  return zck__ds_optim_name_mp(fs->prefix, r, fs->mp);
}
static char *z3_model_name_cb(uint32_t r, const void *ctx) { return zck__ds_model_name_mp(3, r, ((const zck__ds_fileset *)ctx)->mp); }

zck_status zck__ds_check_ranks(const zck__ds_fileset *fs, uint32_t w, int stage, const char *who) {
  ZCK_TRY(check_set(fs->dir, fs->optims, fs->n_optims, w, "optimizer", who, optim_name_cb, fs));
  if (stage == 3) {
    if (fs->model.name)
      return zck__fail(ZCK_ERR_FORMAT, "%s/%s: a stage 0-2 model file in a stage-3 checkpoint (from %s)", fs->dir,
                       fs->model.name, who);
    ZCK_TRY(check_set(fs->dir, fs->z3_models, fs->n_z3_models, w, "model-states", who, z3_model_name_cb, fs));
  } else {
    if (fs->n_z3_models)
      return zck__fail(ZCK_ERR_FORMAT, "%s/%s: a stage-3 model file in a stage-%d checkpoint (from %s)", fs->dir,
                       fs->z3_models[0].name, stage, who);
    if (!fs->model.name)
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s/mp_rank_%02u_model_states.pt: missing (stage %d checkpoint)", fs->dir,
                       fs->mp, stage);
  }
  return ZCK_OK;
}
