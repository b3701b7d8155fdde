/* fuzz_manifest.c: libFuzzer target for the zckpt-manifest.json parser. A manifest that
 * parses must print and re-parse to itself (no differences), keep every tensor inside its
 * file, and name only safe relative paths; one that does not gives a one-line error. */
#include "manifest.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
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
