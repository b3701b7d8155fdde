/* fuzz_replay_main.c: runs a libFuzzer target over every file of a corpus (files or
 * directories given as arguments), so fuzz findings replay as ordinary ctest tests. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) { fprintf(stderr, "cannot open %s\n", path); return 1; }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

static int replay(const char *path, int *count) {
  struct stat st;
  if (stat(path, &st) != 0) { fprintf(stderr, "missing corpus %s\n", path); return 1; }
  if (!S_ISDIR(st.st_mode)) { (*count)++; return replay_file(path); }
  struct dirent **names;
  int n = scandir(path, &names, NULL, alphasort);
  int rc = 0;
  for (int i = 0; i < n; i++) {
    if (names[i]->d_name[0] != '.') {
      char *child = NULL;
      if (asprintf(&child, "%s/%s", path, names[i]->d_name) >= 0) { rc |= replay(child, count); free(child); }
    }
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  int count = 0, rc = 0;
  for (int i = 1; i < argc; i++) rc |= replay(argv[i], &count);
  printf("replayed %d inputs\n", count);
  if (count == 0) { fprintf(stderr, "empty corpus\n"); return 1; }
  return rc;
}
