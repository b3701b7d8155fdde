/* test_convert_errors.c: convert's messages name the input file and say what is wrong:
 * an unreadable file gives the errno reason (was "not a torch .pt/.bin, ..."), a tensor
 * safetensors cannot hold names the file it came from. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

/* Converting `in` fails with a message holding needle (checked in a child that drops root,
 * which reads any file). Returns 0 when it did, 77 when the child could not drop root. */
static int unreadable_case(const char *tmp, const char *in, const char *out, const char *needle) {
  pid_t pid = fork();
  ZT_ASSERT(pid >= 0);
  if (pid == 0) {
    if (geteuid() == 0) {
      if (chmod(tmp, 0777) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
    }
    zck_status s = zck_convert_file(in, out, NULL);
    if (s == ZCK_OK) { fprintf(stderr, "convert of an unreadable file succeeded\n"); _exit(1); }
    if (!strstr(zck_last_error(), needle)) {
      fprintf(stderr, "message \"%s\" lacks \"%s\"\n", zck_last_error(), needle);
      _exit(1);
    }
    _exit(0);
  }
  int st = 0;
  ZT_ASSERT(waitpid(pid, &st, 0) == pid);
  ZT_ASSERT(WIFEXITED(st));
  return WEXITSTATUS(st);
}

int main(void) {
  char *dtypes = zt_fixture("torch/dtypes.pt"), *extra = zt_fixture("torch/extra_dtypes.pt");
  if (!exists(dtypes) || !exists(extra)) zt_skip("torch fixtures missing");
  char *tmp = zt_tmpdir();
  char in[4096], out[4096], needle[8192];

  /* complex128 has no safetensors dtype: the message names the input file */
  snprintf(out, sizeof out, "%s/extra.safetensors", tmp);
  zck_status s = zck_convert_file(extra, out, NULL);
  ZT_ASSERT(s == ZCK_ERR_UNSUPPORTED);
  snprintf(needle, sizeof needle, "%s: tensor c", extra);
  if (!strstr(zck_last_error(), needle) || !strstr(zck_last_error(), "cannot be stored in safetensors"))
    ZT_FAIL("message \"%s\" lacks \"%s\"", zck_last_error(), needle);
  ZT_ASSERT(!exists(out));

  /* an unreadable file: the reason, not "not a torch .pt/.bin" */
  snprintf(in, sizeof in, "%s/locked.pt", tmp);
  unsigned char *d = NULL;
  size_t n = 0;
  ZT_ASSERT(zt_read_file(dtypes, &d, &n) == 0);
  ZT_ASSERT(zt_write_file(in, d, n) == 0);
  free(d);
  ZT_ASSERT(chmod(in, 0) == 0);
  snprintf(out, sizeof out, "%s/unlocked.safetensors", tmp);
  snprintf(needle, sizeof needle, "%s: cannot open: Permission denied", in);
  int rc = unreadable_case(tmp, in, out, needle);
  chmod(in, 0644);
  chmod(tmp, 0700);
  if (rc == 77) zt_skip("cannot drop root to make a file unreadable");
  ZT_EQ_INT(rc, 0);
  ZT_ASSERT(!exists(out));
  free(dtypes);
  free(extra);
  free(tmp);
  return 0;
}
