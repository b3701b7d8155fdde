/* st_test_util.h: helpers for the safetensors tests: SHA-256 (the fixtures' hash
 * convention), crafting files from a header string, and small file utilities. */
#ifndef ZCK_ST_TEST_UTIL_H
#define ZCK_ST_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Lowercase hex SHA-256 of data into out[65]. */
void st_sha256_hex(const void *data, size_t n, char out[65]);
/* A safetensors image: 8-byte N = strlen(json) + pad, the JSON, `pad` spaces, then
 * data_len bytes of a pattern. Caller frees; *len receives the size. */
uint8_t *st_craft(const char *json, size_t pad, uint64_t data_len, size_t *len);
/* Same with an explicit N field (may lie). */
uint8_t *st_craft_n(uint64_t n_field, const char *json, size_t pad, uint64_t data_len, size_t *len);
/* Writes a file under dir; returns the malloc'd path. */
char *st_write_tmp(const char *dir, const char *name, const void *data, size_t n);
/* Reads a whole file (NUL-terminated); NULL if absent. */
char *st_slurp(const char *path, size_t *n);

#endif
