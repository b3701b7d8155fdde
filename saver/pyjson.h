/* pyjson.h: values printed byte for byte as Python prints them, for the files a Python
 * trainer writes (trainer_state.json: json.dumps(indent=2, sort_keys=True)) and the
 * messages that quote its config. */
#ifndef ZCK_PYJSON_H
#define ZCK_PYJSON_H

#include "util.h"

#include <stddef.h>

typedef struct cJSON cJSON;

/* Python's repr() of a float ("5e-05", "0.001", "1.0", "1e+16", "nan"). */
void zck_py_float_repr(double v, char *buf, size_t cap);
/* cJSON number flag (a private type bit): print as a Python float even when integral. */
#define ZCK_PY_FLOAT 0x1000
/* A number flagged ZCK_PY_FLOAT (NULL: out of memory). */
cJSON *zck_py_float(double v);
/* j as json.dumps(j, indent=2, sort_keys=True) prints it at nesting depth `depth`: ints
 * stay ints, other numbers (and flagged ones) are float reprs, NaN as NaN. */
void zck_py_json(zck__buf *b, const cJSON *j, int depth);

#endif
