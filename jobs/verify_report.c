/* verify_report.c: the findings of `zckpt verify`, and the report as text or JSON.
 *
 * Text: a header (what the path is, which manifest, what was read), one line per finding
 * ("damaged: FILE: tensor NAME: bytes A..B damaged: ..."), a result line. JSON: the same
 * fields, for scripts; offsets and lengths are integers.
 */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "verify_internal.h"

zck__vreport *zck__vreport_new(const char *path) {
  zck__vreport *r = zck__calloc(1, sizeof *r);
  if (!r) return NULL;
  r->path = zck__strdup(path);
  r->kind = zck__strdup("unknown");
  r->detail = zck__strdup("");
  if (!r->path || !r->kind || !r->detail) {
    zck_verify_report_free(&r->pub);
    return NULL;
  }
  return r;
}

void zck__vreport_set(char **field, const char *value) {
  char *d = value ? strdup(value) : NULL;
  if (value && !d) return; /* keep the old value rather than lose both */
  free(*field);
  *field = d;
}

void zck__vreport_checked(zck__vreport *r, const char *rel) {
  if (r->n_checked == r->cap_checked) {
    size_t cap = r->cap_checked ? 2 * r->cap_checked : 16;
    char **v = realloc(r->checked, cap * sizeof *v);
    if (!v) { r->checked_lost = true; return; }
    r->checked = v;
    r->cap_checked = cap;
  }
  if (!(r->checked[r->n_checked] = strdup(rel))) { r->checked_lost = true; return; }
  r->n_checked++;
}

static bool add_msg(zck__vreport *r, zck_verify_severity sev, const char *check, const char *file, const char *tensor,
                    int64_t offset, uint64_t length, const char *msg) {
  if (sev == ZCK_VERIFY_UNCHECKABLE && r->first_unchecked == ZCK_OK) r->first_unchecked = ZCK_ERR_IO;
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 16;
    zck_verify_finding *v = realloc(r->v, cap * sizeof *v);
    if (!v) return false;
    r->v = v;
    r->cap = cap;
  }
  zck_verify_finding *f = &r->v[r->n];
  f->severity = sev;
  f->check = check;
  f->file = file ? strdup(file) : NULL;
  f->tensor = tensor ? strdup(tensor) : NULL;
  f->offset = offset;
  f->length = length;
  f->message = strdup(msg);
  if (!f->message || (file && !f->file) || (tensor && !f->tensor)) {
    free((char *)f->file);
    free((char *)f->tensor);
    free((char *)f->message);
    return false;
  }
  r->n++;
  return true;
}

bool zck__vreport_add(zck__vreport *r, zck_verify_severity sev, const char *check, const char *file, const char *tensor,
                      int64_t offset, uint64_t length, const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* findings are one line each, whatever a file name or pickle string held */
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
  return add_msg(r, sev, check, file, tensor, offset, length, msg);
}

bool zck__vreport_add_unique(zck__vreport *r, zck_verify_severity sev, const char *check, const char *msg) {
  for (size_t i = 0; i < r->n; i++)
    if (!strcmp(r->v[i].message, msg)) return true;
  return zck__vreport_add(r, sev, check, NULL, NULL, -1, 0, "%s", msg);
}

zck_status zck__vreport_finish(zck__vreport *r) {
  bool damaged = false, unchecked = false;
  const char *first_damage = NULL, *first_unchecked = NULL;
  for (size_t i = 0; i < r->n; i++) {
    if (r->v[i].severity == ZCK_VERIFY_DAMAGE && !damaged) { damaged = true; first_damage = r->v[i].message; }
    if (r->v[i].severity == ZCK_VERIFY_UNCHECKABLE && !unchecked) { unchecked = true; first_unchecked = r->v[i].message; }
  }
  if (r->first_unchecked != ZCK_OK) unchecked = true;
  r->pub.path = r->path;
  r->pub.kind = r->kind;
  r->pub.detail = r->detail ? r->detail : "";
  r->pub.manifest = r->manifest;
  r->pub.dir = r->dir;
  r->pub.findings = r->v;
  r->pub.n_findings = r->n;
  r->pub.result = damaged ? ZCK_VERIFY_DAMAGED : unchecked ? ZCK_VERIFY_UNCHECKED : ZCK_VERIFY_CLEAN;
  if (damaged) return zck__fail(ZCK_ERR_DAMAGED, "%s", first_damage);
  if (unchecked)
    return zck__fail(r->first_unchecked != ZCK_OK ? r->first_unchecked : ZCK_ERR_IO, "%s",
                     first_unchecked ? first_unchecked : "some checks could not run");
  zck_clear_error();
  return ZCK_OK;
}

void zck_verify_report_free(zck_verify_report *pub) {
  if (!pub) return;
  zck__vreport *r = (zck__vreport *)pub; /* pub is the first member */
  for (size_t i = 0; i < r->n; i++) {
    free((char *)r->v[i].file);
    free((char *)r->v[i].tensor);
    free((char *)r->v[i].message);
  }
  free(r->v);
  for (size_t i = 0; i < r->n_checked; i++) free(r->checked[i]);
  free(r->checked);
  free(r->path);
  free(r->kind);
  free(r->detail);
  free(r->manifest);
  free(r->dir);
  free(r);
}

// ---- printing

static const char *severity_name(zck_verify_severity s) {
  switch (s) {
  case ZCK_VERIFY_NOTE: return "note";
  case ZCK_VERIFY_WARNING: return "warning";
  case ZCK_VERIFY_DAMAGE: return "damaged";
  case ZCK_VERIFY_UNCHECKABLE: return "unchecked";
  }
  return "?";
}

static const char *result_name(zck_verify_result r) {
  switch (r) {
  case ZCK_VERIFY_CLEAN: return "clean";
  case ZCK_VERIFY_DAMAGED: return "damaged";
  case ZCK_VERIFY_UNCHECKED: return "unchecked";
  }
  return "?";
}

static zck_status print_text(const zck_verify_report *r, FILE *out) {
  size_t counts[4] = {0, 0, 0, 0};
  fprintf(out, "%s: %s%s%s%s\n", r->path, r->kind, *r->detail ? " (" : "", r->detail, *r->detail ? ")" : "");
  if (r->manifest) fprintf(out, "manifest: %s\n", r->manifest);
  else fprintf(out, "manifest: none\n");
  fprintf(out, "checked: %llu files, %llu bytes read, %llu zip records, %llu tensors against the manifest\n",
          (unsigned long long)r->files, (unsigned long long)r->bytes, (unsigned long long)r->records,
          (unsigned long long)r->tensors);
  for (size_t i = 0; i < r->n_findings; i++) {
    const zck_verify_finding *f = &r->findings[i];
    counts[f->severity]++;
    fprintf(out, "%s: %s\n", severity_name(f->severity), f->message);
  }
  switch (r->result) {
  case ZCK_VERIFY_CLEAN: fprintf(out, "result: clean\n"); break;
  case ZCK_VERIFY_DAMAGED:
    fprintf(out, "result: DAMAGED (%zu problem%s)\n", counts[ZCK_VERIFY_DAMAGE], counts[ZCK_VERIFY_DAMAGE] == 1 ? "" : "s");
    break;
  case ZCK_VERIFY_UNCHECKED:
    fprintf(out, "result: could not check (%zu item%s); no damage found\n",
            counts[ZCK_VERIFY_UNCHECKABLE], counts[ZCK_VERIFY_UNCHECKABLE] == 1 ? "" : "s");
    break;
  }
  return ferror(out) ? zck__fail(ZCK_ERR_IO, "cannot write the report") : ZCK_OK;
}

static cJSON *num(double v) { return cJSON_CreateNumber(v); }

static zck_status print_json(const zck_verify_report *r, FILE *out) {
  cJSON *root = cJSON_CreateObject();
  cJSON *findings = cJSON_CreateArray();
  bool ok = root && findings;
  if (ok) {
    cJSON_AddStringToObject(root, "path", r->path);
    cJSON_AddStringToObject(root, "kind", r->kind);
    cJSON_AddStringToObject(root, "detail", r->detail);
    if (r->dir) cJSON_AddStringToObject(root, "dir", r->dir);
    else cJSON_AddNullToObject(root, "dir");
    if (r->manifest) cJSON_AddStringToObject(root, "manifest", r->manifest);
    else cJSON_AddNullToObject(root, "manifest");
    cJSON_AddStringToObject(root, "result", result_name(r->result));
    cJSON_AddItemToObject(root, "files", num((double)r->files));
    cJSON_AddItemToObject(root, "bytes", num((double)r->bytes));
    cJSON_AddItemToObject(root, "records", num((double)r->records));
    cJSON_AddItemToObject(root, "tensors", num((double)r->tensors));
    cJSON_AddItemToObject(root, "findings", findings);
    for (size_t i = 0; i < r->n_findings; i++) {
      const zck_verify_finding *f = &r->findings[i];
      cJSON *o = cJSON_CreateObject();
      if (!o) { ok = false; break; }
      cJSON_AddItemToArray(findings, o);
      cJSON_AddStringToObject(o, "severity", severity_name(f->severity));
      cJSON_AddStringToObject(o, "check", f->check);
      if (f->file) cJSON_AddStringToObject(o, "file", f->file);
      else cJSON_AddNullToObject(o, "file");
      if (f->tensor) cJSON_AddStringToObject(o, "tensor", f->tensor);
      else cJSON_AddNullToObject(o, "tensor");
      if (f->offset >= 0) cJSON_AddItemToObject(o, "offset", num((double)f->offset));
      else cJSON_AddNullToObject(o, "offset");
      if (f->length) cJSON_AddItemToObject(o, "length", num((double)f->length));
      else cJSON_AddNullToObject(o, "length");
      cJSON_AddStringToObject(o, "message", f->message);
    }
  } else {
    cJSON_Delete(findings);
  }
  char *text = ok ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  fprintf(out, "%s\n", text);
  cJSON_free(text);
  return ferror(out) ? zck__fail(ZCK_ERR_IO, "cannot write the report") : ZCK_OK;
}

zck_status zck_verify_report_print(const zck_verify_report *r, int json, void *out) {
  ZCK_ASSERT(r && out);
  return json ? print_json(r, out) : print_text(r, out);
}
