/* side_copy.c: a source's other files (an HF checkpoint-N/'s trainer_state.json, scheduler.pt, rng_state_<r>.pth,
 * config and tokenizer files, model.safetensors, zero_to_fp32.py, ...) copied into a job's output as they are, each
 * checked as far as its own format allows, in the pass that copies it:
 *   - a zip archive (torch.save: scheduler.pt, rng_state_<r>.pth, training_args.bin): every record's CRC-32
 *     (zck_zip_copy_file_checked); a .pt / .pth / .bin file whose first bytes are not a zip's but whose tail holds a
 *     zip end record is a damaged archive, refused as such;
 *   - safetensors: the header parses and its tensors tile the file exactly (zck_st_open); the tensor bytes carry no
 *     checksum;
 *   - JSON (up to 256 MiB): the text is JSON as Python's json module writes it (NaN, Infinity and -Infinity
 *     included), in UTF-8;
 *   - anything else (scripts, tokenizer.model, merges.txt, a legacy torch pickle) has no check of its own and is
 *     copied unchecked.
 * A file that fails its check stops the job with one line naming it; the output is never committed. */
#include <stdlib.h>
#include <string.h>

#include "side_copy.h"
#include "safetensors/safetensors.h"
#include "zip/zip.h"

#define ZCK_SIDE_CHUNK ((size_t)1 << 20)
/* A JSON side file is checked whole in memory (tokenizer.json is tens of MB at most); a bigger one is copied
 * unchecked. */
#define ZCK_SIDE_JSON_MAX ((uint64_t)256 << 20)

/* The bytes as they are, for a file of no check. */
static zck_status zck__copy_file(const char *from, const char *to) {
  zck__source src;
  ZCK_TRY(zck__source_open(&src, from));
  zck__outfile f;
  zck_status st = zck__outfile_create(&f, to);
  uint8_t *buf = st == ZCK_OK ? zck__malloc(ZCK_SIDE_CHUNK) : NULL;
  if (st == ZCK_OK && !buf) st = ZCK_ERR_NO_MEMORY;
  for (uint64_t off = 0; st == ZCK_OK && off < src.size;) {
    size_t n = src.size - off > ZCK_SIDE_CHUNK ? ZCK_SIDE_CHUNK : (size_t)(src.size - off);
    st = zck__source_read(&src, buf, n, off);
    if (st == ZCK_OK) st = zck__outfile_pwrite(&f, buf, n, off);
    off += n;
  }
  free(buf);
  if (st == ZCK_OK) st = zck__outfile_commit(&f);
  else zck__outfile_abort(&f);
  zck__source_close(&src);
  return st;
}

// ---- JSON as Python's json module writes it

/* Where the text stops being JSON: NULL when it is one JSON value. Iterative (a stack of the open containers), so a
 * hostile nesting depth costs memory bounded by the file, never the C stack. */
static const char *zck__json_problem(const uint8_t *s, size_t n, size_t *at) {
  uint8_t *stack = zck__malloc(n + 1);   /* '{' or '[' per open container: at most one per byte */
  if (!stack) { *at = 0; return "out of memory"; }
  size_t depth = 0, i = 0;
  const char *why = NULL;
  enum { VALUE, AFTER_VALUE, KEY } want = VALUE;   /* KEY: a string key (or '}' right after '{') */
  bool first = false;   /* just after '{' or '[': the container may close at once */
#define WS() while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++
#define FAIL(w) do { why = (w); goto done; } while (0)
  for (;;) {
    WS();
    if (want == AFTER_VALUE) {
      if (!depth) { if (i != n) FAIL("text after the value"); break; }
      if (i == n) FAIL("ends inside an object or array");
      if (s[i] == ',') { i++; want = stack[depth - 1] == '{' ? KEY : VALUE; first = false; continue; }
      if (s[i] == (stack[depth - 1] == '{' ? '}' : ']')) { i++; depth--; continue; }
      FAIL("expected ',' or the container's end");
    }
    if (i == n) FAIL("ends where a value is due");
    if (first && s[i] == (want == KEY ? '}' : ']')) { i++; depth--; want = AFTER_VALUE; first = false; continue; }
    first = false;
    if (want == KEY && s[i] != '"') FAIL("expected a string key");
    uint8_t c = s[i];
    if (c == '{' || c == '[') {
      stack[depth++] = c;
      i++;
      want = c == '{' ? KEY : VALUE;
      first = true;
      continue;
    }
    if (c == '"') {
      for (i++;;) {
        if (i == n) FAIL("unterminated string");
        uint8_t b = s[i];
        if (b == '"') { i++; break; }
        if (b < 0x20) FAIL("control character in a string");
        if (b == '\\') {
          if (i + 1 == n) FAIL("unterminated string");
          uint8_t e = s[i + 1];
          if (e == 'u') {
            for (int k = 2; k < 6; k++)
              if (i + k >= n || !strchr("0123456789abcdefABCDEF", s[i + k]) || !s[i + k]) FAIL("bad \\u escape");
            i += 6;
          } else if (e && strchr("\"\\/bfnrt", e)) {
            i += 2;
          } else {
            FAIL("bad escape");
          }
          continue;
        }
        if (b < 0x80) { i++; continue; }
        /* UTF-8: the lead byte says how many continuation bytes follow; no overlong forms, no surrogates */
        size_t len = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!len || n - i < len) FAIL("invalid UTF-8 in a string");
        for (size_t k = 1; k < len; k++)
          if ((s[i + k] & 0xC0) != 0x80) FAIL("invalid UTF-8 in a string");
        if ((b == 0xE0 && s[i + 1] < 0xA0) || (b == 0xED && s[i + 1] > 0x9F) || (b == 0xF0 && s[i + 1] < 0x90) ||
            (b == 0xF4 && s[i + 1] > 0x8F))
          FAIL("invalid UTF-8 in a string");
        i += len;
      }
      if (want == KEY) {
        WS();
        if (i == n || s[i] != ':') FAIL("expected ':' after a key");
        i++;
        want = VALUE;
        continue;
      }
    } else if (n - i >= 4 && !memcmp(s + i, "true", 4)) i += 4;
    else if (n - i >= 5 && !memcmp(s + i, "false", 5)) i += 5;
    else if (n - i >= 4 && !memcmp(s + i, "null", 4)) i += 4;
    else if (n - i >= 3 && !memcmp(s + i, "NaN", 3)) i += 3;
    else if (n - i >= 8 && !memcmp(s + i, "Infinity", 8)) i += 8;
    else if (n - i >= 9 && !memcmp(s + i, "-Infinity", 9)) i += 9;
    else if (c == '-' || (c >= '0' && c <= '9')) {
      /* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
      if (s[i] == '-') i++;
      if (i == n || s[i] < '0' || s[i] > '9') FAIL("bad number");
      if (s[i] == '0') i++;
      else while (i < n && s[i] >= '0' && s[i] <= '9') i++;
      if (i < n && s[i] == '.') {
        i++;
        if (i == n || s[i] < '0' || s[i] > '9') FAIL("bad number");
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
      }
      if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i == n || s[i] < '0' || s[i] > '9') FAIL("bad number");
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
      }
    } else {
      FAIL("not a JSON value");
    }
    want = AFTER_VALUE;
  }
#undef WS
#undef FAIL
done:
  free(stack);
  *at = i;
  return why;
}

zck_status zck__json_check(const char *name, const void *text, size_t n) {
  size_t at = 0;
  const char *why = zck__json_problem(text, n, &at);
  return why ? zck__fail(ZCK_ERR_DAMAGED, "%s: not JSON: %s at byte %zu", name, why, at) : ZCK_OK;
}

/* The file read whole, checked, then written from the same bytes. */
static zck_status zck__copy_json(const char *from, const char *to) {
  zck__source src;
  ZCK_TRY(zck__source_open(&src, from));
  if (src.size > ZCK_SIDE_JSON_MAX) {
    zck__source_close(&src);
    return zck__copy_file(from, to);
  }
  size_t n = (size_t)src.size;
  uint8_t *text = zck__malloc(n + 1);
  zck_status st = text ? zck__source_read(&src, text, n, 0) : ZCK_ERR_NO_MEMORY;
  zck__source_close(&src);
  if (st == ZCK_OK) st = zck__json_check(from, text, n);
  zck__outfile f;
  if (st == ZCK_OK) st = zck__outfile_create(&f, to);
  if (st == ZCK_OK) {
    st = zck__outfile_pwrite(&f, text, n, 0);
    if (st == ZCK_OK) st = zck__outfile_commit(&f);
    else zck__outfile_abort(&f);
  }
  free(text);
  return st;
}

// ---- which check a file gets

static bool zck__ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), t = strlen(tail);
  return n >= t && !strcmp(s + n - t, tail);
}

/* A zip archive: it starts as one, or it is named as torch.save names its files and ends with a zip end record
 * (an archive whose first bytes were damaged, which must not pass as a file of no format). */
static zck_status zck__looks_zip(const char *path, bool *zip) {
  zck__source src;
  ZCK_TRY(zck__source_open(&src, path));
  uint8_t head[4] = {0};
  zck_status st = src.size >= 4 ? zck__source_read(&src, head, 4, 0) : ZCK_OK;
  *zip = st == ZCK_OK && src.size >= 4 && head[0] == 'P' && head[1] == 'K' &&
         ((head[2] == 3 && head[3] == 4) || (head[2] == 5 && head[3] == 6));
  bool torch_name = zck__ends_with(path, ".pt") || zck__ends_with(path, ".pth") || zck__ends_with(path, ".bin");
  if (st == ZCK_OK && !*zip && torch_name && src.size >= 22) {
    /* an end record (22 bytes and a comment of at most 64 KiB) lies in the last 65557 bytes */
    uint64_t tail = src.size < 0xFFFFu + 22 ? src.size : 0xFFFFu + 22;
    uint8_t *buf = zck__malloc((size_t)tail);
    st = buf ? zck__source_read(&src, buf, (size_t)tail, src.size - tail) : ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; st == ZCK_OK && i + 4 <= tail && !*zip; i++)
      *zip = buf[i] == 'P' && buf[i + 1] == 'K' && buf[i + 2] == 5 && buf[i + 3] == 6;
    free(buf);
  }
  zck__source_close(&src);
  return st;
}

zck_status zck__copy_side_file(const char *from, const char *to) {
  if (zck__ends_with(from, ".safetensors")) {
    /* the header and sizes; the tensor bytes have no checksum to check */
    zck_st_file *sf = NULL;
    zck_status st = zck_st_open(from, &sf);
    zck_st_close(sf);
    return st == ZCK_OK ? zck__copy_file(from, to) : st;
  }
  if (zck__ends_with(from, ".json")) return zck__copy_json(from, to);
  bool zip = false;
  ZCK_TRY(zck__looks_zip(from, &zip));
  return zip ? zck_zip_copy_file_checked(from, to, 0, NULL) : zck__copy_file(from, to);
}
