/* hf_last_checkpoint.c: the newest complete checkpoint-N of a Hugging Face Trainer
 * output_dir (zck_hf_last_checkpoint, zck.h).
 *
 * The candidates are those of transformers' trainer_utils.get_last_checkpoint: entries
 * whose name matches ^checkpoint\-(\d+)$ (Python's `$` also admits one trailing newline)
 * and that are folders (os.path.isdir: a link to a folder counts), taken by largest N,
 * the first in directory order among equal N (Python's max() over os.listdir). \d is
 * ASCII here: names with other Unicode digits are not taken. Where get_last_checkpoint
 * returns the largest N whatever it holds, a checkpoint a killed save left half written
 * is passed over here for the next one down. An FSDP checkpoint-N (a torch Distributed
 * Checkpoint, in it or in its pytorch_model_fsdp_0/) is complete once its .metadata is
 * there, which DCP writes after every data file. */
#include "dcp/dcp.h"
#include "error.h"
#include "util.h"
#include "zck.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ZCK__CKPT_PREFIX "checkpoint-"

typedef struct zck__hf_cand {
  char *name;
  const char *digits; /* N without its leading zeros (inside name) */
  size_t n_digits;
} zck__hf_cand;

/* "checkpoint-<digits>" with an optional trailing '\n': N's digits, else NULL. */
static const char *zck__hf_ckpt_number(const char *name, size_t *n) {
  if (strncmp(name, ZCK__CKPT_PREFIX, strlen(ZCK__CKPT_PREFIX))) return NULL;
  const char *d = name + strlen(ZCK__CKPT_PREFIX), *p = d;
  while (*p >= '0' && *p <= '9') p++;
  if (p == d || (*p && strcmp(p, "\n"))) return NULL;
  while (d < p - 1 && *d == '0') d++;
  *n = (size_t)(p - d);
  return d;
}

/* Larger N first; equal N keep their directory order (the sort is made stable by index). */
static int zck__hf_cand_cmp(const zck__hf_cand *a, const zck__hf_cand *b) {
  if (a->n_digits != b->n_digits) return a->n_digits > b->n_digits ? -1 : 1;
  return -memcmp(a->digits, b->digits, a->n_digits);
}

/* Why checkpoint folder ck is not complete, or NULL when it is: `latest` names a tag
 * folder that exists, and neither holds a zckpt manifest that fails its check. */
static char *zck__hf_incomplete(const char *ck) {
  char *latest = zck__path_join(ck, "latest"), *why = NULL, *tag_dir = NULL;
  char tag[256];
  FILE *f = latest ? fopen(latest, "rb") : NULL;
  struct stat st;
  char *dcp = f ? NULL : zck_dcp_dir_of(ck);
  if (dcp) {   /* an FSDP save (torch Distributed Checkpoint): its .metadata comes last */
    free(dcp);
    if (zck_manifest_check_complete(ck, 0) != ZCK_OK) why = zck__strdup(zck_last_error());
    goto done;
  }
  if (!f) {
    why = zck__sprintf("no `latest` (a DeepSpeed save writes it last)");
    goto done;
  }
  size_t n = fread(tag, 1, sizeof tag - 1, f);
  fclose(f);
  tag[n] = 0;
  if (strlen(tag) != n) n = 0, tag[0] = 0; /* a NUL inside: no tag name */
  /* DeepSpeed reads it with .strip() */
  while (n && isspace((unsigned char)tag[n - 1])) tag[--n] = 0;
  size_t lead = strspn(tag, " \t\n\r\v\f");
  memmove(tag, tag + lead, n - lead + 1);
  n -= lead;
  if (!n || strchr(tag, '/') || !strcmp(tag, ".") || !strcmp(tag, "..")) {
    why = zck__sprintf("`latest` names no tag folder");
    goto done;
  }
  tag_dir = zck__path_join(ck, tag);
  if (!tag_dir || stat(tag_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    why = zck__sprintf("`latest` names %s, which is not there", tag);
    goto done;
  }
  if (zck_manifest_check_complete(ck, 0) != ZCK_OK || zck_manifest_check_complete(tag_dir, 0) != ZCK_OK)
    why = zck__strdup(zck_last_error());
done:
  free(latest);
  free(tag_dir);
  if (!why) zck_clear_error();
  return why;
}

zck_status zck_hf_last_checkpoint(const char *output_dir, char **picked, char **skipped) {
  if (!output_dir || !picked) return zck__fail(ZCK_ERR_INVALID_ARG, "zck_hf_last_checkpoint: NULL argument");
  *picked = NULL;
  if (skipped) *skipped = NULL;
  DIR *d = opendir(output_dir);
  if (!d) return zck__fail_errno(errno, "%s: cannot open folder", output_dir);
  zck__hf_cand *c = NULL;
  size_t n = 0, cap = 0;
  zck_status st = ZCK_OK;
  struct dirent *e;
  while (st == ZCK_OK && (e = readdir(d))) {
    size_t nd;
    const char *digits = zck__hf_ckpt_number(e->d_name, &nd);
    if (!digits) continue;
    char *path = zck__path_join(output_dir, e->d_name);
    struct stat sb;
    bool dir = path && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode); /* follows links, as isdir */
    free(path);
    if (!dir) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      zck__hf_cand *grown = realloc(c, cap * sizeof *c);
      if (!grown) { st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory"); break; }
      c = grown;
    }
    c[n].name = zck__strdup(e->d_name);
    if (!c[n].name) { st = ZCK_ERR_NO_MEMORY; break; }
    c[n].digits = c[n].name + (digits - e->d_name);
    c[n].n_digits = nd;
    n++;
  }
  closedir(d);
  /* insertion sort, stable: equal N keep directory order (few entries) */
  for (size_t i = 1; st == ZCK_OK && i < n; i++) {
    zck__hf_cand x = c[i];
    size_t j = i;
    for (; j > 0 && zck__hf_cand_cmp(&x, &c[j - 1]) < 0; j--) c[j] = c[j - 1];
    c[j] = x;
  }
  if (st == ZCK_OK && n == 0)
    st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no checkpoint-N folder", output_dir);
  char *first_why = NULL;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    char *ck = zck__path_join(output_dir, c[i].name);
    char *why = ck ? zck__hf_incomplete(ck) : NULL;
    if (!ck) st = ZCK_ERR_NO_MEMORY;
    else if (!why) { *picked = ck; break; }
    else {
      if (!first_why) first_why = zck__sprintf("%s is incomplete: %s", c[i].name, why);
      free(ck);
      free(why);
    }
  }
  if (st == ZCK_OK && !*picked)
    st = zck__fail(ZCK_ERR_DAMAGED, "%s: no complete checkpoint-N folder (%s)", output_dir,
                   first_why ? first_why : "?");
  else if (st == ZCK_OK && skipped && first_why) {
    *skipped = first_why;
    first_why = NULL;
  }
  free(first_why);
  for (size_t i = 0; i < n; i++) free(c[i].name);
  free(c);
  return st;
}
