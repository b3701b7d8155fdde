/* files_floor.c: the floor of writing a DeepSpeed universal folder of many parameters:
 * the same folders and files (zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt), each written
 * with one write of its size, then one syncfs, from THREADS threads. No serialization,
 * no hashing, no checks: only what the file system charges per folder and file.
 *
 * usage: files_floor OUT_DIR N_PARAMS [FILE_BYTES [THREADS]]   (defaults 1700 bytes, 2)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct job {
  const char *root;
  long first, last;
  size_t bytes;
  int failed;
} job;

static void *run(void *arg) {
  job *j = arg;
  char *buf = calloc(1, j->bytes ? j->bytes : 1);
  static const char *const parts[] = {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"};
  char path[4096];
  for (long i = j->first; buf && i < j->last && !j->failed; i++) {
    snprintf(path, sizeof path, "%s/zero/model.layers.%ld.mlp.experts.%ld.w1.weight", j->root, i / 1000, i % 1000);
    if (mkdir(path, 0755) != 0) { perror(path); j->failed = 1; break; }
    size_t n = strlen(path);
    for (int k = 0; k < 3; k++) {
      snprintf(path + n, sizeof path - n, "/%s", parts[k]);
      int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || write(fd, buf, j->bytes) != (ssize_t)j->bytes || close(fd) != 0) { perror(path); j->failed = 1; break; }
      path[n] = 0;
    }
  }
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: files_floor OUT_DIR N_PARAMS [FILE_BYTES [THREADS]]\n");
    return 2;
  }
  const char *root = argv[1];
  long n = atol(argv[2]);
  size_t bytes = argc > 3 ? (size_t)atol(argv[3]) : 1700;
  int threads = argc > 4 ? atoi(argv[4]) : 2;
  if (threads < 1) threads = 1;
  char zero[4096];
  snprintf(zero, sizeof zero, "%s/zero", root);
  if ((mkdir(root, 0755) != 0 && errno != EEXIST) || mkdir(zero, 0755) != 0) { perror(zero); return 1; }
  pthread_t *t = calloc((size_t)threads, sizeof *t);
  job *j = calloc((size_t)threads, sizeof *j);
  for (int k = 0; k < threads; k++) {
    j[k] = (job){root, n * k / threads, n * (k + 1) / threads, bytes, 0};
    pthread_create(&t[k], NULL, run, &j[k]);
  }
  int failed = 0;
  for (int k = 0; k < threads; k++) {
    pthread_join(t[k], NULL);
    failed |= j[k].failed;
  }
  int fd = open(root, O_RDONLY | O_DIRECTORY);
  if (fd < 0 || syncfs(fd) != 0) { perror(root); return 1; }
  close(fd);
  free(t);
  free(j);
  return failed;
}
