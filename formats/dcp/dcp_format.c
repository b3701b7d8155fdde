/* dcp_format.c: DCP's file names, metadata classes and state-dict key rules (dcp_format.h),
 * the one home of each for the reader and the writer. */
#include "dcp/dcp_format.h"

#include "torch/torch_internal.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DCP_MOD_METADATA "torch.distributed.checkpoint.metadata"
#define DCP_MOD_FILESYSTEM "torch.distributed.checkpoint.filesystem"

static const struct { const char *module, *name; } dcp_classes[ZCK_DCP_CLS_COUNT] = {
  [ZCK_DCP_CLS_METADATA] = {DCP_MOD_METADATA, "Metadata"},
  [ZCK_DCP_CLS_TENSOR_STORAGE] = {DCP_MOD_METADATA, "TensorStorageMetadata"},
  [ZCK_DCP_CLS_BYTES_STORAGE] = {DCP_MOD_METADATA, "BytesStorageMetadata"},
  [ZCK_DCP_CLS_CHUNK] = {DCP_MOD_METADATA, "ChunkStorageMetadata"},
  [ZCK_DCP_CLS_TENSOR_PROPERTIES] = {DCP_MOD_METADATA, "TensorProperties"},
  [ZCK_DCP_CLS_MEM_FORMAT] = {DCP_MOD_METADATA, "_MEM_FORMAT_ENCODING"},
  [ZCK_DCP_CLS_METADATA_INDEX] = {DCP_MOD_METADATA, "MetadataIndex"},
  [ZCK_DCP_CLS_STORAGE_META] = {DCP_MOD_METADATA, "StorageMeta"},
  [ZCK_DCP_CLS_STORAGE_INFO] = {DCP_MOD_FILESYSTEM, "_StorageInfo"},
};

const char *zck_dcp_class_module(zck_dcp_class c) { return dcp_classes[c].module; }
const char *zck_dcp_class_name(zck_dcp_class c) { return dcp_classes[c].name; }

int zck_dcp_class_of(const char *module, const char *name) {
  for (int i = 0; i < ZCK_DCP_CLS_COUNT; i++)
    if (!strcmp(module, dcp_classes[i].module) && !strcmp(name, dcp_classes[i].name)) return i;
  return -1;
}

zck_dtype zck_dcp_dtype_of(const char *name) {
  bool known;
  return zck__torch_dtype_global(name, &known);
}

const char *zck_dcp_dtype_name(zck_dtype t) {
  switch (t) {
  case ZCK_F64: return "float64";
  case ZCK_F32: return "float32";
  case ZCK_F16: return "float16";
  case ZCK_BF16: return "bfloat16";
  case ZCK_I64: return "int64";
  case ZCK_I32: return "int32";
  case ZCK_I16: return "int16";
  case ZCK_I8: return "int8";
  case ZCK_U8: return "uint8";
  case ZCK_BOOL: return "bool";
  default: return NULL;
  }
}

bool zck_dcp_global_allowed(const char *module, const char *name) {
  if (zck_dcp_class_of(module, name) >= 0) return true;
  if (!strcmp(module, "torch")) {
    bool known;
    return !strcmp(name, "Size") || zck__torch_dtype_global(name, &known) != ZCK_DTYPE_INVALID;
  }
  if (!strcmp(module, "pathlib")) return zck_dcp_is_path_class(module, name);
  return !strcmp(module, ZCK_DCP_LAYOUT_MODULE) && !strcmp(name, ZCK_DCP_LAYOUT_NAME);
}

bool zck_dcp_is_path_class(const char *module, const char *name) {
  return !strcmp(module, "pathlib") && (!strcmp(name, "PosixPath") || !strcmp(name, "PurePosixPath") ||
                                        !strcmp(name, "WindowsPath") || !strcmp(name, "PureWindowsPath"));
}

// ---- file names

void zck_dcp_data_file_name(uint32_t rank, uint32_t n, char *buf, size_t cap) {
  snprintf(buf, cap, "__%u_%u" ZCK_DCP_DATA_SUFFIX, rank, n);
}

static bool parse_u32(const char **p, uint32_t *out) {
  const char *s = *p;
  uint64_t v = 0;
  if (*s < '0' || *s > '9') return false;
  while (*s >= '0' && *s <= '9') {
    v = v * 10 + (uint64_t)(*s++ - '0');
    if (v > UINT32_MAX) return false;
  }
  *p = s;
  if (out) *out = (uint32_t)v;
  return true;
}

bool zck_dcp_parse_data_file_name(const char *name, uint32_t *rank, uint32_t *n) {
  const char *p = name;
  if (strncmp(p, "__", 2)) return false;
  p += 2;
  if (!parse_u32(&p, rank) || *p++ != '_' || !parse_u32(&p, n)) return false;
  return !strcmp(p, ZCK_DCP_DATA_SUFFIX);
}

// ---- keys

/* get_state_dict saved as {"optim": osd}; Accelerate saves {"optimizer": osd} */
static bool optim_root(const char *s) { return !strcmp(s, "optim") || !strcmp(s, "optimizer"); }

zck_dcp_key zck_dcp_key_from_path(const char *const *path, size_t n) {
  zck_dcp_key k = {ZCK_DCP_KEY_OTHER, NULL, 0, NULL, 0};
  if (n == 1) {   /* torchtitan: the model's keys flattened to the top level */
    k.kind = ZCK_DCP_KEY_MODEL;
    k.fqn = path[0];
    k.fqn_len = strlen(path[0]);
  } else if (n == 2 && optim_root(path[0]) && !strncmp(path[1], "state.", 6)) {
    /* flatten_optimizer_state_dict: "state.<fqn>.<k>" is one leaf */
    const char *fqn = path[1] + 6, *dot = strrchr(fqn, '.');
    if (dot && dot > fqn && dot[1]) {
      k.kind = ZCK_DCP_KEY_OPTIM_STATE;
      k.fqn = fqn;
      k.fqn_len = (size_t)(dot - fqn);
      k.setting = dot + 1;
    }
  } else if (n == 2 && optim_root(path[0]) && !strncmp(path[1], "param_groups.", 13)) {
    /* and "param_groups.<fqn>.<k>": the settings of the param's group, per param */
    const char *fqn = path[1] + 13, *dot = strrchr(fqn, '.');
    if (dot && dot > fqn && dot[1]) {
      k.kind = ZCK_DCP_KEY_PARAM_SETTING;
      k.fqn = fqn;
      k.fqn_len = (size_t)(dot - fqn);
      k.setting = dot + 1;
    }
  } else if (n == 2 && !strcmp(path[0], "model")) {
    k.kind = ZCK_DCP_KEY_MODEL;
    k.fqn = path[1];
    k.fqn_len = strlen(path[1]);
  } else if (n == 4 && optim_root(path[0]) && !strcmp(path[1], "state")) {
    k.kind = ZCK_DCP_KEY_OPTIM_STATE;
    k.fqn = path[2];
    k.fqn_len = strlen(path[2]);
    k.setting = path[3];
  } else if (n == 4 && optim_root(path[0]) && !strcmp(path[1], "param_groups")) {
    const char *p = path[2];
    uint32_t g;
    if (parse_u32(&p, &g) && !*p && (path[2][0] != '0' || !path[2][1])) {
      k.kind = ZCK_DCP_KEY_PARAM_GROUP;
      k.group = g;
      k.setting = path[3];
    }
  }
  return k;
}

zck_dcp_key zck_dcp_key_parse(const char *key) {
  zck_dcp_key k = {ZCK_DCP_KEY_OTHER, NULL, 0, NULL, 0};
  static const char model[] = "model.", state[] = "state.", groups[] = "param_groups.";
  if (!strncmp(key, model, sizeof model - 1) && key[sizeof model - 1]) {
    k.kind = ZCK_DCP_KEY_MODEL;
    k.fqn = key + sizeof model - 1;
    k.fqn_len = strlen(k.fqn);
    return k;
  }
  const char *rest = !strncmp(key, "optim.", 6) ? key + 6 : !strncmp(key, "optimizer.", 10) ? key + 10 : NULL;
  if (!rest) return k;
  if (!strncmp(rest, state, sizeof state - 1)) {
    const char *fqn = rest + sizeof state - 1, *dot = strrchr(fqn, '.');
    if (dot && dot > fqn && dot[1]) {
      k.kind = ZCK_DCP_KEY_OPTIM_STATE;
      k.fqn = fqn;
      k.fqn_len = (size_t)(dot - fqn);
      k.setting = dot + 1;
    }
  } else if (!strncmp(rest, groups, sizeof groups - 1)) {
    const char *p = rest + sizeof groups - 1, *start = p;
    uint32_t g;
    if (parse_u32(&p, &g) && *p == '.' && p[1] && (*start != '0' || p == start + 1)) {
      k.kind = ZCK_DCP_KEY_PARAM_GROUP;
      k.group = g;
      k.setting = p + 1;
    }
  }
  return k;
}

char *zck_dcp_key_model(const char *fqn) { return zck__concat("model.", fqn, (const char *)NULL); }
char *zck_dcp_key_state(const char *fqn, const char *setting) {
  return zck__concat("optim.state.", fqn, ".", setting, (const char *)NULL);
}
char *zck_dcp_key_group(uint32_t group, const char *setting) {
  return zck__sprintf("optim.param_groups.%u.%s", group, setting);
}
