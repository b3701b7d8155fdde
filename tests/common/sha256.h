/* sha256.h: SHA-256 for the tests (hex digest). */
#ifndef ZT_SHA256_H
#define ZT_SHA256_H
#include <stddef.h>
#include <stdint.h>
void zt_sha256_hex(const void *data, size_t n, char out[65]);
#endif
