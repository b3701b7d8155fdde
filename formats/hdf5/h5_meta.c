/* h5_meta.c: an HDF5 file's metadata as the forked child read it (h5_probe.c).
 *
 * The reader answers its questions about groups, links and attributes from here, never from
 * libhdf5 (a corrupt attribute message can crash the library in one process and not in
 * another: only a child may decode it). The child's records, one after another:
 *   'T' addr:u64                       an object a lazy walk did not open (its type unknown)
 *   'O' addr:u64 type+1:u32           an object (type -1: it could not be opened; then
 *   'o' err                            says why); the records up to the next 'O' are its:
 *   'A' name flags:u8 class:u32 npoints:u64 i64:u64 u64:u64 f64:u64 text err   an attribute
 *   'a' err                            its attributes could not all be read
 *   'L' name hard:u8 addr:u64          a link of a group
 *   'l' err                            its links could not all be read
 *   'S' 1 dtype:u32 class:u32 size:u64 space_class:u32 ndims:u32 dims:u64[ndims] layout:u32
 *       chunk_nd:u32 chunk:u64[chunk_nd] chunk_err external:u32 nfilters:u32
 *       (id:u32 flags:u32 level:u32 name)[min(nfilters, 16)] fill_len:u8 fill[fill_len]
 *     | 0 err                          a dataset's header (zck__h5_mdset); -1 as u32 where
 *                                      HDF5 answered -1
 *   'D' 1 digest:u64 | 0 err           the root's attribute digest
 *   'F'                                the file could not be opened
 *   'X'                                the records grew past twice the file's size
 *   'E'                                the end
 * Texts are a u32 length, the bytes and a NUL. The first object is the root. */
#include "h5_internal.h"

#include <stdlib.h>
#include <string.h>

struct zck__h5_meta {
  zck__buf raw;                 /* the records: every name and text points into them */
  zck__h5_mobj *objs;           /* in the child's visiting order; objs[0] is the root */
  size_t nobjs;
  zck__h5_mobj **by_addr;       /* sorted by address */
  zck__h5_mattr *attrs;
  zck__h5_mlink *links;
  zck__h5_mdset *dsets;
  zck__h5_mfilter *filters;     /* every dataset's, one after another */
  bool opened, over, digest_ok;
  bool lazy;                    /* some objects are 'T' records (unread) */
  uint64_t digest;
  const char *digest_err;
};

typedef struct {
  uint8_t *p, *end;
  bool bad;
} zck__h5m_cur;

static uint8_t zck__h5m_u8(zck__h5m_cur *c) {
  if (c->bad || c->p >= c->end) return c->bad = true, 0;
  return *c->p++;
}

static uint64_t zck__h5m_u64(zck__h5m_cur *c, int bytes) {
  if (c->bad || c->end - c->p < bytes) return c->bad = true, 0;
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)c->p[i] << (8 * i);
  c->p += bytes;
  return v;
}

static const char *zck__h5m_str(zck__h5m_cur *c, size_t *len) {
  size_t n = (size_t)zck__h5m_u64(c, 4);
  if (c->bad || (size_t)(c->end - c->p) <= n || c->p[n] != 0) return c->bad = true, "";
  const char *s = (const char *)c->p;
  c->p += n + 1;
  if (len) *len = n;
  return s;
}

/* One pass over the records: counts them (fill false), or fills the arrays sized by the
 * counting pass. */
/* A dataset's header; its filters into f (room for ZCK__H5M_MAX_FILTERS), *nf of them. */
static bool zck__h5m_dset(zck__h5m_cur *c, zck__h5_mdset *s, zck__h5_mfilter *f, size_t *nf) {
  memset(s, 0, sizeof *s);
  *nf = 0;
  if (!zck__h5m_u8(c)) {
    s->err = zck__h5m_str(c, NULL);
    return !c->bad;
  }
  s->dtype = (int)zck__h5m_u64(c, 4);
  s->cls = (int)(int32_t)zck__h5m_u64(c, 4);
  s->size = zck__h5m_u64(c, 8);
  s->space_cls = (int)(int32_t)zck__h5m_u64(c, 4);
  s->ndims = (int)(int32_t)zck__h5m_u64(c, 4);
  if (s->ndims > 32) return false;
  for (int i = 0; i < s->ndims; i++) {
    uint64_t v = zck__h5m_u64(c, 8);
    if (i < ZCK_H5_MAX_DIMS) s->dims[i] = v;
  }
  s->layout = (int)(int32_t)zck__h5m_u64(c, 4);
  s->chunk_nd = (int)(int32_t)zck__h5m_u64(c, 4);
  for (int i = 0; i < s->chunk_nd && i < 32; i++) {
    uint64_t v = zck__h5m_u64(c, 8);
    if (i < ZCK_H5_MAX_DIMS) s->chunk[i] = v;
  }
  s->chunk_err = zck__h5m_str(c, NULL);
  s->external = (int)(int32_t)zck__h5m_u64(c, 4);
  s->nfilters = (int)(int32_t)zck__h5m_u64(c, 4);
  for (int i = 0; i < s->nfilters && i < ZCK__H5M_MAX_FILTERS; i++) {
    f[i].id = (unsigned)zck__h5m_u64(c, 4);
    f[i].flags = (unsigned)zck__h5m_u64(c, 4);
    f[i].level = (int)(int32_t)zck__h5m_u64(c, 4);
    f[i].name = zck__h5m_str(c, NULL);
    *nf = (size_t)i + 1;
  }
  s->filters = f;
  s->fill_len = zck__h5m_u8(c);
  if (s->fill_len > sizeof s->fill) return false;
  for (size_t i = 0; i < s->fill_len; i++) s->fill[i] = zck__h5m_u8(c);
  return !c->bad;
}

static bool zck__h5m_parse(zck__h5_meta *m, bool fill, size_t *nobj, size_t *nattr, size_t *nlink, size_t *ndset,
                           size_t *nfilt) {
  zck__h5m_cur c = {m->raw.data, m->raw.data + m->raw.len, false};
  size_t no = 0, na = 0, nl = 0, nd = 0, nf = 0;
  zck__h5_mobj *cur = NULL;
  for (;;) {
    uint8_t tag = zck__h5m_u8(&c);
    if (c.bad) return false;
    if (tag == 'E') break;
    switch (tag) {
    case 'O': {
      uint64_t addr = zck__h5m_u64(&c, 8);
      int type = (int)(uint32_t)zck__h5m_u64(&c, 4) - 1;
      if (fill) {
        cur = &m->objs[no];
        memset(cur, 0, sizeof *cur);
        cur->addr = addr;
        cur->type = type;
        cur->attrs = m->attrs + na;
        cur->links = m->links + nl;
      }
      no++;
      break;
    }
    case 'T': {
      uint64_t addr = zck__h5m_u64(&c, 8);
      if (fill) {
        cur = &m->objs[no];
        memset(cur, 0, sizeof *cur);
        cur->addr = addr;
        cur->type = H5O_TYPE_UNKNOWN;
        cur->unread = true;
        cur->attrs = m->attrs + na;
        cur->links = m->links + nl;
        m->lazy = true;
      }
      no++;
      break;
    }
    case 'o': case 'a': case 'l': {
      const char *e = zck__h5m_str(&c, NULL);
      if (!no) return false;
      if (fill) *(tag == 'o' ? &cur->err : tag == 'a' ? &cur->attrs_err : &cur->links_err) = e;
      break;
    }
    case 'A': {
      zck__h5_mattr a;
      a.name = zck__h5m_str(&c, NULL);
      a.flags = zck__h5m_u8(&c);
      a.cls = (int)(uint32_t)zck__h5m_u64(&c, 4);
      a.npoints = (int64_t)zck__h5m_u64(&c, 8);
      a.i64 = (int64_t)zck__h5m_u64(&c, 8);
      a.u64 = zck__h5m_u64(&c, 8);
      uint64_t fb = zck__h5m_u64(&c, 8);
      memcpy(&a.f64, &fb, sizeof fb);
      a.text = zck__h5m_str(&c, &a.text_len);
      a.err = zck__h5m_str(&c, NULL);
      if (!no) return false;
      if (fill) m->attrs[na] = a, cur->nattrs++;
      na++;
      break;
    }
    case 'L': {
      zck__h5_mlink l;
      l.name = zck__h5m_str(&c, NULL);
      l.hard = zck__h5m_u8(&c) != 0;
      l.addr = zck__h5m_u64(&c, 8);
      if (!no) return false;
      if (fill) m->links[nl] = l, cur->nlinks++;
      nl++;
      break;
    }
    case 'S': {
      zck__h5_mdset s;
      zck__h5_mfilter counted[ZCK__H5M_MAX_FILTERS];
      size_t k = 0;
      if (!zck__h5m_dset(&c, &s, fill ? m->filters + nf : counted, &k) || !no) return false;
      if (!fill || !k) s.filters = NULL;
      if (fill) m->dsets[nd] = s, cur->ds = &m->dsets[nd];
      nd++;
      nf += k;
      break;
    }
    case 'D':
      if (zck__h5m_u8(&c)) {
        uint64_t d = zck__h5m_u64(&c, 8);
        if (fill) m->digest_ok = true, m->digest = d;
      } else {
        const char *e = zck__h5m_str(&c, NULL);
        if (fill) m->digest_err = e;
      }
      break;
    case 'F': m->opened = false; break;
    case 'X': m->over = true; break;
    default: return false;
    }
    if (c.bad) return false;
  }
  *nobj = no;
  *nattr = na;
  *nlink = nl;
  *ndset = nd;
  *nfilt = nf;
  return c.p == c.end;
}

static int zck__h5m_attr_cmp(const void *a, const void *b) {
  return strcmp(((const zck__h5_mattr *)a)->name, ((const zck__h5_mattr *)b)->name);
}

static int zck__h5m_link_cmp(const void *a, const void *b) {
  return strcmp(((const zck__h5_mlink *)a)->name, ((const zck__h5_mlink *)b)->name);
}

static int zck__h5m_addr_cmp(const void *a, const void *b) {
  uint64_t x = (*(zck__h5_mobj *const *)a)->addr, y = (*(zck__h5_mobj *const *)b)->addr;
  return x < y ? -1 : x > y;
}

zck_status zck__h5_meta_load(const char *path, const char *lazy, zck__h5_meta **out) {
  *out = NULL;
  zck__h5_meta *m = zck__calloc(1, sizeof *m);
  if (!m) return ZCK_ERR_NO_MEMORY;
  zck_status st = zck__h5_probe(path, lazy, &m->raw);
  if (st != ZCK_OK) {
    free(m);
    return st;
  }
  m->opened = true;
  size_t no = 0, na = 0, nl = 0, nd = 0, nf = 0;
  if (!zck__h5m_parse(m, false, &no, &na, &nl, &nd, &nf)) {
    zck__h5_meta_free(m);
    /* the child exited cleanly, so it wrote every record: this is ours */
    return zck__fail(ZCK_ERR_FORMAT, "%s: the HDF5 metadata check returned malformed records", path);
  }
  if (m->over) {
    zck__h5_meta_free(m);
    return zck__fail(ZCK_ERR_FORMAT, "%s: corrupt HDF5 metadata: its attributes and links take more than twice the file's size", path);
  }
  m->objs = zck__calloc(no + 1, sizeof *m->objs);
  m->by_addr = zck__calloc(no + 1, sizeof *m->by_addr);
  m->attrs = zck__calloc(na + 1, sizeof *m->attrs);
  m->links = zck__calloc(nl + 1, sizeof *m->links);
  m->dsets = zck__calloc(nd + 1, sizeof *m->dsets);
  m->filters = zck__calloc(nf + 1, sizeof *m->filters);
  if (!m->objs || !m->by_addr || !m->attrs || !m->links || !m->dsets || !m->filters) {
    zck__h5_meta_free(m);
    return ZCK_ERR_NO_MEMORY;
  }
  zck__h5m_parse(m, true, &no, &na, &nl, &nd, &nf);
  m->nobjs = no;
  for (size_t i = 0; i < no; i++) {
    zck__h5_mobj *o = &m->objs[i];
    qsort(o->attrs, o->nattrs, sizeof *o->attrs, zck__h5m_attr_cmp);
    qsort(o->links, o->nlinks, sizeof *o->links, zck__h5m_link_cmp);
    m->by_addr[i] = o;
  }
  qsort(m->by_addr, no, sizeof *m->by_addr, zck__h5m_addr_cmp);
  *out = m;
  return ZCK_OK;
}

void zck__h5_meta_free(zck__h5_meta *m) {
  if (!m) return;
  zck__buf_free(&m->raw);
  free(m->objs);
  free(m->by_addr);
  free(m->attrs);
  free(m->links);
  free(m->dsets);
  free(m->filters);
  free(m);
}

bool zck__h5_meta_opened(const zck__h5_meta *m) { return m->opened && m->nobjs > 0; }
bool zck__h5_meta_lazy(const zck__h5_meta *m) { return m->lazy; }

bool zck__h5_meta_datasets(const zck__h5_meta *m, size_t *n) {
  *n = 0;
  if (m->lazy || m->over) return false;
  for (size_t i = 0; i < m->nobjs; i++) {
    if (m->objs[i].type < 0 || m->objs[i].links_err) return false; /* not all of it seen */
    *n += m->objs[i].type == H5O_TYPE_DATASET;
  }
  return true;
}

static const zck__h5_mobj *zck__h5m_at(const zck__h5_meta *m, uint64_t addr) {
  size_t lo = 0, hi = m->nobjs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (m->by_addr[mid]->addr < addr) lo = mid + 1;
    else hi = mid;
  }
  return lo < m->nobjs && m->by_addr[lo]->addr == addr ? m->by_addr[lo] : NULL;
}

zck_status zck__h5_meta_find(const zck__h5_meta *m, const char *path, const zck__h5_mobj **out, const char **why) {
  *out = NULL;
  *why = NULL;
  if (!m->nobjs) return ZCK_ERR_NOT_FOUND;
  const zck__h5_mobj *o = &m->objs[0];
  const char *p = path;
  char name[4096];
  while (*p) {
    while (*p == '/') p++;
    size_t n = strcspn(p, "/");
    if (!n) break;
    if (n >= sizeof name) return ZCK_ERR_NOT_FOUND;
    memcpy(name, p, n);
    name[n] = 0;
    p += n;
    if (!strcmp(name, ".")) continue;   /* as HDF5 reads a path */
    if (o->unread) break;               /* the caller walks again in full */
    if (o->type != H5O_TYPE_GROUP) return ZCK_ERR_NOT_FOUND;
    if (o->links_err) {
      *why = o->links_err;
      return ZCK_ERR_FORMAT;
    }
    zck__h5_mlink key = {name, false, 0};
    const zck__h5_mlink *l = bsearch(&key, o->links, o->nlinks, sizeof *o->links, zck__h5m_link_cmp);
    if (!l) return ZCK_ERR_NOT_FOUND;
    if (!l->hard) {
      *why = "a soft or external link (not followed)";
      return ZCK_ERR_UNSUPPORTED;
    }
    o = zck__h5m_at(m, l->addr);
    if (!o) {
      *why = "a link to an object that was not read";
      return ZCK_ERR_FORMAT;
    }
  }
  if (o->unread) {
    *out = o;
    return ZCK_OK;
  }
  if (o->type < 0) {
    *why = o->err ? o->err : "cannot open the object";
    return ZCK_ERR_FORMAT;
  }
  *out = o;
  return ZCK_OK;
}

const zck__h5_mattr *zck__h5_meta_attr(const zck__h5_mobj *o, const char *name) {
  zck__h5_mattr key;
  key.name = name;
  return bsearch(&key, o->attrs, o->nattrs, sizeof *o->attrs, zck__h5m_attr_cmp);
}

bool zck__h5_meta_digest(const zck__h5_meta *m, uint64_t *out, const char **why) {
  *out = m->digest;
  *why = m->digest_ok ? NULL : m->digest_err ? m->digest_err : "no digest";
  return m->digest_ok;
}
