/* dcp_internal.h: what the DCP reader's files share: the metadata as parsed (dcp_meta.c),
 * then checked against the data files and described (dcp_open.c, dcp_view.c). */
#ifndef ZCK_DCP_INTERNAL_H
#define ZCK_DCP_INTERNAL_H

#include "dcp/dcp.h"
#include "exec.h"
#include "io.h"
#include "strmap.h"

/* A chunk of a tensor entry: a block of the global shape (offsets, sizes), stored
 * row-major. In the tensor's flat (row-major) array it is n_runs runs of run_len elements:
 * a chunk of whole rows (FSDP's) is one run; one that cuts an inner dimension (tensor
 * parallel's column shards, FSDP2 + TP's dp x tp blocks) is one run per index of the
 * dimensions before the innermost one it cuts (cut_dim), a run being as long as the
 * contiguous stretch allows, so a row-wise chunk never costs more than one. */
typedef struct zck__dcp_chunk {
  int64_t offsets[ZCK_MAX_DIMS], sizes[ZCK_MAX_DIMS];
  uint64_t flat_off, numel;        /* of its first element; its elements */
  uint64_t n_runs, run_len;        /* n_runs * run_len == numel; 0 runs when empty */
  int cut_dim;                     /* runs step over dimensions [0, cut_dim) */
  size_t item;                     /* its storage item; SIZE_MAX until matched */
} zck__dcp_chunk;

/* Walks a chunk's runs in its own (storage) order: run r is the chunk's elements
 * [r * run_len, (r + 1) * run_len), placed at flat offset zck__dcp_runs_next's value in
 * the tensor. An odometer over the cut dimensions: no division per run. */
typedef struct zck__dcp_runs {
  const zck__dcp_chunk *ch;
  uint64_t stride[ZCK_MAX_DIMS];   /* the tensor's row-major strides */
  int64_t idx[ZCK_MAX_DIMS];
  uint64_t flat, left;
} zck__dcp_runs;
void zck__dcp_runs_init(zck__dcp_runs *r, int ndim, const int64_t *shape, const zck__dcp_chunk *ch);
/* The flat offset of the next run; false after the last. */
bool zck__dcp_runs_next(zck__dcp_runs *r, uint64_t *flat);

/* A state_dict_metadata entry. */
typedef struct zck__dcp_entry {
  char *key;                       /* the flat key */
  char *fqn;                       /* MODEL, OPTIM_STATE: the param's FQN (own copy) */
  zck_dcp_key k;                   /* k.fqn points at fqn, k.setting into key or the path */
  char *setting;                   /* own copy of k.setting */
  bool is_bytes;
  zck_dtype dtype;
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;
  size_t first_chunk, n_chunks;    /* into chunks[] */
  size_t item;                     /* bytes entries: their storage item */
  uint32_t st_file;                /* safetensors storage: the <i> of its shards' names (0: they do not agree) */
} zck__dcp_entry;

/* A storage_data entry: one item of a data file. */
typedef struct zck__dcp_item {
  size_t entry;                    /* the entry it belongs to */
  size_t chunk;                    /* tensor items: the chunk; SIZE_MAX for bytes */
  size_t file;                     /* into files[] */
  uint64_t off, len;               /* inside the file */
  /* tensor items, once opened: the chunk's bytes in place */
  zck__source win;                 /* the item as a source of its own */
  uint64_t data_off;               /* of the tensor's first byte, inside win */
  zck_record_check rec;            /* the zip record holding it (offsets inside win) */
  char *what;                      /* rec.what */
} zck__dcp_item;

typedef struct zck__dcp_file {
  char *name;                      /* relative_path */
  char *path;                      /* dir/name */
  zck__source src;
  uint64_t item_bytes;             /* the items' bytes (== src.size once checked) */
  uint64_t data_start;             /* where its items begin: 0, or past a safetensors header */
} zck__dcp_file;

struct zck_dcp {
  zck_dcp_info info;
  bool safetensors;                /* safetensors storage (dcp_safetensors.c): no .metadata, no CRCs */
  uint32_t st_files;               /* safetensors storage: the <n> of the shards' names (0: they do not agree) */
  char *dir;
  char *optim_dir;                 /* Accelerate's optimizer_0 beside pytorch_model_fsdp_0, or NULL */
  char *version, *save_id;
  zck__dcp_entry *entries;
  size_t n_entries;
  zck__dcp_chunk *chunks;
  size_t n_chunks;
  zck__dcp_item *items;
  size_t n_items;
  zck__dcp_file *files;
  size_t n_files;
  zck__strmap file_index;          /* path -> file */
  size_t cap_entries, cap_chunks, cap_items, cap_files;
  /* described */
  zck_model *model;
  uint32_t *param_of_entry;        /* [n_entries]: the param of a MODEL / OPTIM_STATE entry, or UINT32_MAX */
  char *peft_adapter;              /* an adapter-only PEFT save: the adapter name its model keys drop (dcp_peft.c) */
  const char **module_name;        /* with it, [n_params]: the optimizer's name of each param (an entry's fqn) or NULL */
  zck_layout *layout[ZCK_STATE_KINDS];
  zck_store *stores[ZCK_STATE_KINDS];
  zck_ds_output *outs;
  size_t n_outs;
};

/* dcp_peft.c: the param an optimizer fqn names: the model key itself, or in an adapter-only
 * PEFT save that key without its adapter name (learned from the first such fqn, then held
 * to); -1 if none. Then, once every state entry is placed, each param's module name. */
int64_t zck__dcp_find_weight(zck_dcp *c, const char *fqn);
zck_status zck__dcp_note_module_names(zck_dcp *c);

/* dcp_meta.c: parses the metadata pickle of folder dir into c's entries, chunks, items and
 * files (names only; nothing opened), checking the chunk geometry. Called once per folder
 * (a model folder, then Accelerate's optimizer folder): entries and items add up. */
zck_status zck__dcp_parse_metadata(zck_dcp *c, const char *dir, const zck_dcp_open_opts *o);

/* Checks entry i's chunk geometry (each a block inside the shape, together covering it
 * exactly once) and sets their runs; messages name path. */
zck_status zck__dcp_check_chunks(zck_dcp *c, const char *path, size_t i);

/* dcp_safetensors.c: safetensors storage (HuggingFaceStorageWriter, save_distributed):
 * whether dir holds shard-*-model-*.safetensors files, and their chunks parsed into c's
 * entries, chunks, items and files as zck__dcp_parse_metadata makes them. */
bool zck__dcp_safetensors_dir(const char *dir);
zck_status zck__dcp_parse_safetensors(zck_dcp *c, const char *dir);

/* Opens item it as a torch.save file, making its window first. A small item is read whole
 * with one pread and parsed from memory (the zip reader's many small reads of a 2 KB item
 * cost more than its bytes); a large one is parsed in place through the window. Offsets
 * in *tf are inside the item either way. Close with zck__dcp_item_close. */
typedef struct zck__dcp_item_file {
  zck_torch_file *tf;
  zck__source mem;
  void *buf;
} zck__dcp_item_file;
zck_status zck__dcp_item_open(zck_dcp *c, zck__dcp_item *it, const zck_dcp_open_opts *o, zck__dcp_item_file *f);
void zck__dcp_item_close(zck__dcp_item_file *f);

/* dcp_view.c: the model, layouts, stores and outputs, from opened items. */
zck_status zck__dcp_describe(zck_dcp *c, const zck_dcp_open_opts *o);

#endif
