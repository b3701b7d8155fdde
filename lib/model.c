/* model.c: the model manifest builder (params, buffers, param groups) and its name index. */
#include "model.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- name index: open addressing over indices into the owner's array

typedef struct zck__name_index {
  uint32_t *slots;   /* index + 1; 0 = empty */
  size_t cap;        /* power of two */
  size_t count;
} zck__name_index;

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* names(i) gives the name of entry i of the owner. */
typedef const char *(*name_at_fn)(const zck_model *m, uint32_t i);
static const char *param_name_at(const zck_model *m, uint32_t i) { return m->params[i].name; }
static const char *buffer_name_at(const zck_model *m, uint32_t i) { return m->buffers[i].name; }

static int64_t index_find(const zck__name_index *ix, const zck_model *m, name_at_fn at, const char *name) {
  if (!ix || !ix->cap) return -1;
  size_t mask = ix->cap - 1;
  for (size_t i = (size_t)name_hash(name) & mask;; i = (i + 1) & mask) {
    uint32_t v = ix->slots[i];
    if (!v) return -1;
    if (!strcmp(at(m, v - 1), name)) return v - 1;
  }
}

static void index_put_slot(zck__name_index *ix, const char *name, uint32_t v) {
  size_t mask = ix->cap - 1;
  size_t i = (size_t)name_hash(name) & mask;
  while (ix->slots[i]) i = (i + 1) & mask;
  ix->slots[i] = v;
}

/* Inserts entry idx (its name already stored in the owner). Grows at 50% load. */
static zck_status index_insert(zck__name_index **pix, const zck_model *m, name_at_fn at, uint32_t idx) {
  zck__name_index *ix = *pix;
  if (!ix) {
    ix = zck__calloc(1, sizeof *ix);
    if (!ix) return ZCK_ERR_NO_MEMORY;
    *pix = ix;
  }
  if ((ix->count + 1) * 2 > ix->cap) {
    size_t ncap = ix->cap ? ix->cap * 2 : 64;
    uint32_t *ns = zck__calloc(ncap, sizeof *ns);
    if (!ns) return ZCK_ERR_NO_MEMORY;
    uint32_t *old = ix->slots;
    size_t ocap = ix->cap;
    ix->slots = ns;
    ix->cap = ncap;
    for (size_t i = 0; i < ocap; i++)
      if (old[i]) index_put_slot(ix, at(m, old[i] - 1), old[i]);
    free(old);
  }
  index_put_slot(ix, at(m, idx), idx + 1);
  ix->count++;
  return ZCK_OK;
}

static void index_free(zck__name_index *ix) {
  if (ix) free(ix->slots);
  free(ix);
}

// ---- growth helper

// ---- model

zck_model *zck_model_new(void) { return zck__calloc(1, sizeof(zck_model)); }

static void hparam_clear(zck_hparam *h) {
  free(h->key);
  free(h->s);
}

void zck_model_free(zck_model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_params; i++) free(m->params[i].name);
  for (size_t i = 0; i < m->n_buffers; i++) free(m->buffers[i].name);
  for (size_t g = 0; g < m->n_groups; g++) {
    for (size_t k = 0; k < m->groups[g].n_hparams; k++) hparam_clear(&m->groups[g].hparams[k]);
    free(m->groups[g].hparams);
    free(m->groups[g].params);
  }
  free(m->params);
  free(m->buffers);
  free(m->groups);
  index_free(m->param_index);
  index_free(m->buffer_index);
  free(m);
}

const char *zck_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
  size_t n = 0;
  if (!cap) return buf;
  buf[0] = 0;
  n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "[");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

/* Validates a shape and computes its element count. */
static zck_status shape_numel(const char *what, const char *name, int ndim, const int64_t *shape, uint64_t *numel) {
  ZCK_FAIL_IF(ndim < 0 || ndim > ZCK_MAX_DIMS, ZCK_ERR_FORMAT, "%s %s: %d dimensions (at most %d supported)", what,
              name, ndim, ZCK_MAX_DIMS);
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    char buf[128];
    ZCK_FAIL_IF(shape[i] < 0, ZCK_ERR_FORMAT, "%s %s: negative dimension in shape %s", what, name,
                zck_shape_str(ndim, shape, buf, sizeof buf));
    ZCK_FAIL_IF(!zck__mul_u64(n, (uint64_t)shape[i], &n) || n > ((uint64_t)1 << 62), ZCK_ERR_FORMAT,
                "%s %s: shape %s has too many elements", what, name, zck_shape_str(ndim, shape, buf, sizeof buf));
  }
  *numel = n;
  return ZCK_OK;
}

zck_status zck_model_add_param(zck_model *m, const char *name, int ndim, const int64_t *shape, zck_dtype dtype,
                               uint32_t *out_index) {
  ZCK_ASSERT(m && name && (ndim == 0 || shape));
  uint64_t numel;
  ZCK_TRY(shape_numel("parameter", name, ndim, shape, &numel));
  ZCK_FAIL_IF(zck_model_find_param(m, name) >= 0, ZCK_ERR_FORMAT, "parameter %s: listed twice", name);
  ZCK_FAIL_IF(m->n_params >= UINT32_MAX - 1, ZCK_ERR_LIMIT, "parameter %s: too many parameters", name);
  if (!ZCK__GROW(m->params, m->cap_params, m->n_params + 1)) return ZCK_ERR_NO_MEMORY;
  zck_param *p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  p->name = zck__strdup(name);
  if (!p->name) return ZCK_ERR_NO_MEMORY;
  p->ndim = ndim;
  for (int i = 0; i < ndim; i++) p->shape[i] = shape[i];
  p->numel = numel;
  p->dtype = dtype;
  p->group = -1;
  p->tied_to = -1;
  zck_status s = index_insert(&m->param_index, m, param_name_at, (uint32_t)m->n_params);
  if (s != ZCK_OK) {
    free(p->name);
    return s;
  }
  if (out_index) *out_index = (uint32_t)m->n_params;
  m->n_params++;
  return ZCK_OK;
}

zck_status zck_model_add_buffer(zck_model *m, const char *name, int ndim, const int64_t *shape, zck_dtype dtype,
                                uint32_t *out_index) {
  ZCK_ASSERT(m && name && (ndim == 0 || shape));
  uint64_t numel;
  ZCK_TRY(shape_numel("buffer", name, ndim, shape, &numel));
  ZCK_FAIL_IF(zck_model_find_buffer(m, name) >= 0, ZCK_ERR_FORMAT, "buffer %s: listed twice", name);
  ZCK_FAIL_IF(m->n_buffers >= UINT32_MAX - 1, ZCK_ERR_LIMIT, "buffer %s: too many buffers", name);
  if (!ZCK__GROW(m->buffers, m->cap_buffers, m->n_buffers + 1)) return ZCK_ERR_NO_MEMORY;
  zck_buffer *b = &m->buffers[m->n_buffers];
  memset(b, 0, sizeof *b);
  b->name = zck__strdup(name);
  if (!b->name) return ZCK_ERR_NO_MEMORY;
  b->ndim = ndim;
  for (int i = 0; i < ndim; i++) b->shape[i] = shape[i];
  b->numel = numel;
  b->dtype = dtype;
  zck_status s = index_insert(&m->buffer_index, m, buffer_name_at, (uint32_t)m->n_buffers);
  if (s != ZCK_OK) {
    free(b->name);
    return s;
  }
  if (out_index) *out_index = (uint32_t)m->n_buffers;
  m->n_buffers++;
  return ZCK_OK;
}

void zck_model_set_frozen(zck_model *m, uint32_t param, bool frozen) {
  ZCK_ASSERT(m && param < m->n_params);
  m->params[param].frozen = frozen;
}

zck_status zck_model_set_shape(zck_model *m, uint32_t param, int ndim, const int64_t *shape) {
  ZCK_ASSERT(m && param < m->n_params && ndim >= 0 && ndim <= ZCK_MAX_DIMS && (ndim == 0 || shape));
  zck_param *p = &m->params[param];
  uint64_t numel;
  ZCK_TRY(shape_numel("parameter", p->name, ndim, shape, &numel));
  p->ndim = ndim;
  for (int d = 0; d < ndim; d++) p->shape[d] = shape[d];
  p->numel = numel;
  return ZCK_OK;
}

zck_status zck_model_set_tied(zck_model *m, uint32_t alias, uint32_t source) {
  ZCK_ASSERT(m && alias < m->n_params);
  const char *an = m->params[alias].name;
  ZCK_FAIL_IF(source >= m->n_params, ZCK_ERR_FORMAT, "parameter %s: tied to a parameter that does not exist", an);
  ZCK_FAIL_IF(source == alias, ZCK_ERR_FORMAT, "parameter %s: tied to itself", an);
  ZCK_FAIL_IF(m->params[source].tied_to >= 0, ZCK_ERR_FORMAT, "parameter %s: tied to %s, which is itself an alias",
              an, m->params[source].name);
  for (size_t i = 0; i < m->n_params; i++)
    ZCK_FAIL_IF(m->params[i].tied_to == (int32_t)alias, ZCK_ERR_FORMAT,
                "parameter %s: is the source of alias %s, so it cannot be an alias", an, m->params[i].name);
  char sa[128], sb[128];
  ZCK_FAIL_IF(m->params[source].numel != m->params[alias].numel, ZCK_ERR_FORMAT,
              "parameter %s: tied to %s but its shape %s differs from %s", an, m->params[source].name,
              zck_shape_str(m->params[alias].ndim, m->params[alias].shape, sa, sizeof sa),
              zck_shape_str(m->params[source].ndim, m->params[source].shape, sb, sizeof sb));
  m->params[alias].tied_to = (int32_t)source;
  return ZCK_OK;
}

zck_status zck_model_add_group(zck_model *m, uint32_t *out_group) {
  ZCK_ASSERT(m);
  if (out_group) *out_group = UINT32_MAX; /* no group, on failure */
  ZCK_FAIL_IF(m->n_groups >= INT32_MAX, ZCK_ERR_LIMIT, "too many parameter groups");
  if (!ZCK__GROW(m->groups, m->cap_groups, m->n_groups + 1)) return ZCK_ERR_NO_MEMORY;
  memset(&m->groups[m->n_groups], 0, sizeof m->groups[0]);
  if (out_group) *out_group = (uint32_t)m->n_groups;
  m->n_groups++;
  return ZCK_OK;
}

zck_status zck_model_group_add_param(zck_model *m, uint32_t g, uint32_t param) {
  ZCK_ASSERT(m);
  ZCK_FAIL_IF(g >= m->n_groups, ZCK_ERR_FORMAT, "parameter group %u does not exist", g);
  ZCK_FAIL_IF(param >= m->n_params, ZCK_ERR_FORMAT, "parameter group %u: parameter index %u out of range", g, param);
  zck_param *p = &m->params[param];
  ZCK_FAIL_IF(p->group >= 0, ZCK_ERR_FORMAT, "parameter %s: in parameter groups %d and %u", p->name, p->group, g);
  zck_param_group *gr = &m->groups[g];
  if (!ZCK__GROW(gr->params, gr->cap_params, gr->n_params + 1)) return ZCK_ERR_NO_MEMORY;
  gr->params[gr->n_params++] = param;
  p->group = (int32_t)g;
  return ZCK_OK;
}

/* The slot for key in group g: the existing one (cleared) or a new one at the end. */
static zck_status hparam_slot(zck_model *m, uint32_t g, const char *key, zck_hparam **out) {
  ZCK_ASSERT(m && key);
  ZCK_FAIL_IF(g >= m->n_groups, ZCK_ERR_FORMAT, "parameter group %u does not exist", g);
  zck_param_group *gr = &m->groups[g];
  for (size_t i = 0; i < gr->n_hparams; i++)
    if (!strcmp(gr->hparams[i].key, key)) {
      zck_hparam *h = &gr->hparams[i];
      free(h->s);
      char *k = h->key;
      memset(h, 0, sizeof *h);
      h->key = k;
      *out = h;
      return ZCK_OK;
    }
  if (!ZCK__GROW(gr->hparams, gr->cap_hparams, gr->n_hparams + 1)) return ZCK_ERR_NO_MEMORY;
  zck_hparam *h = &gr->hparams[gr->n_hparams];
  memset(h, 0, sizeof *h);
  h->key = zck__strdup(key);
  if (!h->key) return ZCK_ERR_NO_MEMORY;
  gr->n_hparams++;
  *out = h;
  return ZCK_OK;
}

zck_status zck_model_group_set_none(zck_model *m, uint32_t g, const char *key) {
  zck_hparam *h;
  ZCK_TRY(hparam_slot(m, g, key, &h));
  h->kind = ZCK_HP_NONE;
  return ZCK_OK;
}

zck_status zck_model_group_set_bool(zck_model *m, uint32_t g, const char *key, bool v) {
  zck_hparam *h;
  ZCK_TRY(hparam_slot(m, g, key, &h));
  h->kind = ZCK_HP_BOOL;
  h->i = v;
  return ZCK_OK;
}

zck_status zck_model_group_set_int(zck_model *m, uint32_t g, const char *key, int64_t v) {
  zck_hparam *h;
  ZCK_TRY(hparam_slot(m, g, key, &h));
  h->kind = ZCK_HP_INT;
  h->i = v;
  return ZCK_OK;
}

zck_status zck_model_group_set_float(zck_model *m, uint32_t g, const char *key, double v) {
  zck_hparam *h;
  ZCK_TRY(hparam_slot(m, g, key, &h));
  h->kind = ZCK_HP_FLOAT;
  h->f[0] = v;
  h->n_floats = 1;
  return ZCK_OK;
}

zck_status zck_model_group_set_floats(zck_model *m, uint32_t g, const char *key, const double *v, int n) {
  ZCK_FAIL_IF(n < 0 || n > ZCK_HP_MAX_FLOATS, ZCK_ERR_UNSUPPORTED,
              "parameter group %u: hyper-parameter %s is a tuple of %d values (at most %d supported)", g, key, n,
              ZCK_HP_MAX_FLOATS);
  zck_hparam *h;
  ZCK_TRY(hparam_slot(m, g, key, &h));
  h->kind = ZCK_HP_FLOATS;
  for (int i = 0; i < n; i++) h->f[i] = v[i];
  h->n_floats = n;
  return ZCK_OK;
}

zck_status zck_model_group_set_string(zck_model *m, uint32_t g, const char *key, const char *v) {
  char *copy = zck__strdup(v);
  if (!copy) return ZCK_ERR_NO_MEMORY;
  zck_hparam *h;
  zck_status s = hparam_slot(m, g, key, &h);
  if (s != ZCK_OK) {
    free(copy);
    return s;
  }
  h->kind = ZCK_HP_STRING;
  h->s = copy;
  return ZCK_OK;
}

// ---- queries

int64_t zck_model_find_param(const zck_model *m, const char *name) {
  return index_find(m->param_index, m, param_name_at, name);
}

int64_t zck_model_find_buffer(const zck_model *m, const char *name) {
  return index_find(m->buffer_index, m, buffer_name_at, name);
}

const zck_hparam *zck_model_group_get(const zck_model *m, uint32_t g, const char *key) {
  if (g >= m->n_groups) return NULL;
  const zck_param_group *gr = &m->groups[g];
  for (size_t i = 0; i < gr->n_hparams; i++)
    if (!strcmp(gr->hparams[i].key, key)) return &gr->hparams[i];
  return NULL;
}

size_t zck_model_group_trainable(const zck_model *m, uint32_t g, uint32_t *out, size_t cap) {
  if (g >= m->n_groups) return 0;
  size_t n = 0;
  const zck_param_group *gr = &m->groups[g];
  for (size_t i = 0; i < gr->n_params; i++) {
    const zck_param *p = &m->params[gr->params[i]];
    if (p->frozen || p->tied_to >= 0) continue;
    if (n < cap) out[n] = gr->params[i];
    n++;
  }
  return n;
}

void zck_model_numels(const zck_model *m, uint64_t *out) {
  for (size_t i = 0; i < m->n_params; i++) out[i] = m->params[i].numel;
}

zck_status zck_model_group_copy_settings(zck_model *m, uint32_t g, const zck_param_group *src) {
  for (size_t k = 0; k < src->n_hparams; k++) {
    zck_hparam *h;
    ZCK_TRY(hparam_slot(m, g, src->hparams[k].key, &h));
    char *key = h->key;
    *h = src->hparams[k];
    h->key = key;
    h->s = NULL;
    if (src->hparams[k].s && !(h->s = zck__strdup(src->hparams[k].s))) return ZCK_ERR_NO_MEMORY;
  }
  return ZCK_OK;
}

zck_model *zck_model_clone(const zck_model *src) {
  zck_model *m = zck_model_new();
  zck_status s = m ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; s == ZCK_OK && p < src->n_params; p++) {
    const zck_param *a = &src->params[p];
    s = zck_model_add_param(m, a->name, a->ndim, a->shape, a->dtype, NULL);
    if (s == ZCK_OK) zck_model_set_frozen(m, (uint32_t)p, a->frozen);
  }
  for (size_t p = 0; s == ZCK_OK && p < src->n_params; p++)
    if (src->params[p].tied_to >= 0) s = zck_model_set_tied(m, (uint32_t)p, (uint32_t)src->params[p].tied_to);
  for (size_t b = 0; s == ZCK_OK && b < src->n_buffers; b++) {
    const zck_buffer *a = &src->buffers[b];
    s = zck_model_add_buffer(m, a->name, a->ndim, a->shape, a->dtype, NULL);
  }
  for (size_t g = 0; s == ZCK_OK && g < src->n_groups; g++) {
    const zck_param_group *a = &src->groups[g];
    uint32_t ng;
    s = zck_model_add_group(m, &ng);
    for (size_t i = 0; s == ZCK_OK && i < a->n_params; i++) s = zck_model_group_add_param(m, ng, a->params[i]);
    if (s == ZCK_OK) s = zck_model_group_copy_settings(m, ng, a);
  }
  if (s != ZCK_OK) {
    zck_model_free(m);
    return NULL;
  }
  return m;
}
