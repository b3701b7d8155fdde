/* fuzz_manifest.c: libFuzzer target for the zckpt-manifest.json parser. A manifest that
 * parses must print and re-parse to itself (no differences), keep every tensor inside its
 * file, and name only safe relative paths; one that does not gives a one-line error. What
 * the tree-less tensor-table reader reads, the cJSON tree reads to the same manifest. */
#include "manifest.h"

#include <stdlib.h>
#include <string.h>

static void same_as_tree(const uint8_t *data, size_t size) {
  zck_manifest *p = NULL, *t = NULL;
  if (zck__manifest_parse_plain("fuzz.json", (const char *)data, size, &p) != ZCK_OK) return;
  if (zck__manifest_parse_tree("fuzz.json", (const char *)data, size, &t) != ZCK_OK) abort();
  char *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  if (zck_manifest_to_json(p, &a, &na) != ZCK_OK || zck_manifest_to_json(t, &b, &nb) != ZCK_OK) abort();
  if (na != nb || memcmp(a, b, na)) abort();
  free(a);
  free(b);
  zck_manifest_free(p);
  zck_manifest_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  same_as_tree(data, size);
  zck_manifest *m = NULL;
  if (zck_manifest_parse("fuzz.json", (const char *)data, size, &m) != ZCK_OK) {
    if (!zck_last_error()[0] || strchr(zck_last_error(), '\n')) abort();
    return 0;
  }
  for (size_t i = 0; i < m->n_files; i++) {
    const char *p = m->files[i].path;
    size_t n = strlen(p);
    if (!n || p[0] == '/' || !strcmp(p, "..") || !strncmp(p, "../", 3) || strstr(p, "/../") ||
        (n >= 3 && !strcmp(p + n - 3, "/..")) || strchr(p, '\\'))
      abort();
  }
  for (size_t i = 0; i < m->n_tensors; i++) {
    const zck_manifest_tensor *t = &m->tensors[i];
    if (t->file >= m->n_files || t->offset + t->nbytes > m->files[t->file].size) abort();
  }
  char *text = NULL;
  size_t len = 0;
  if (zck_manifest_to_json(m, &text, &len) != ZCK_OK) abort();
  zck_manifest *m2 = NULL;
  if (zck_manifest_parse("again.json", text, len, &m2) != ZCK_OK) abort();
  if (zck_manifest_compare(m, m2, NULL, 0, NULL, NULL) != 0) abort();
  free(text);
  zck_manifest_free(m);
  zck_manifest_free(m2);
  return 0;
}
