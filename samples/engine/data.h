/* data.h: the synthetic corpus the engine trains on: lines of additions ("12+7=19\n"),
 * generated from the seed, split into a training text and an evaluation text. Tokens are
 * bytes (vocabulary 256). Training sample k of a run is a window of T+1 bytes at a position
 * that depends only on (seed, k), so the data seen does not depend on the rank count. */
#ifndef ZE_DATA_H
#define ZE_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ze_corpus {
  uint64_t seed;
  bool reversed_sums;           /* lines "a+b=c" write c's digits least-significant first */
  uint8_t *train;
  size_t n_train;
  uint8_t *eval;
  size_t n_eval;
} ze_corpus;

/* Generates about train_bytes + eval_bytes of text (each at least 2*(T+1)); with
 * reversed_sums each sum is written least-significant digit first ("12+9=12": 21), the order
 * in which a model that writes left to right can work out the carries. false on allocation
 * failure. */
bool ze_corpus_make(ze_corpus *c, uint64_t seed, size_t train_bytes, size_t eval_bytes, bool reversed_sums);
void ze_corpus_free(ze_corpus *c);

/* Training window of sample k: out[0..T] (inputs are out[0..T), targets out[1..T]). */
void ze_corpus_train_window(const ze_corpus *c, uint64_t k, int T, int *out);
/* Whether the training text holds a line that starts "a+b=" (the model has seen that sum). */
bool ze_corpus_has_sum(const ze_corpus *c, unsigned a, unsigned b);
/* The digits of sum as a corpus line writes them (reversed or not) into out; their count. */
int ze_sum_digits(unsigned sum, bool reversed, char *out, size_t cap);
/* For display: turns every digit run that follows an '=' around, in place (a text written
 * with reversed sums then reads in the usual order). */
void ze_sums_in_usual_order(char *text);
/* Evaluation window i of n (evenly spaced over the eval text). */
void ze_corpus_eval_window(const ze_corpus *c, int i, int n, int T, int *out);

#endif
