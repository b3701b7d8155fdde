/* generate.h: greedy sampling after training, with ZeRO-3 parameters gathered all at once
 * or module by module (TRL's ds3_gather_for_generation on / off, deepspeed-checkpoint.md §6.3).
 *
 * on:  every parameter is all-gathered into one model-sized buffer, then generation runs
 *      without communication (fast, peak memory = the whole model);
 * off: each module's parameters are all-gathered from the shards just before it runs and
 *      freed after (a collective per module per token; peak memory = the largest module).
 * Both compute the same arithmetic on the same values, so the texts are identical. Stage 1/2
 * hold the whole 16-bit model on every rank: both modes convert from it without collectives.
 */
#ifndef ZE_GENERATE_H
#define ZE_GENERATE_H

#include "data.h"
#include "gpt2.h"
#include "zero.h"

/* Collective: every rank calls it with the same arguments. text_out (malloc'd) gets the
 * n_tokens bytes generated after the prompt; peak_bytes the largest amount of gathered
 * parameter memory held at once. */
zck_status ze_generate(const ze_gpt2_config *c, ze_zero_rank *zr, bool gather_all, const char *prompt, int n_tokens,
                       char **text_out, double *seconds, size_t *peak_bytes);

/* Collective: greedily completes n prompts "\na+b=" (a, b in [0, 100), drawn from seed, each
 * pair once) whose line is not in the training text, and counts the completions that are
 * the right sum. examples (cap bytes) gets the first few "a+b=answer" separated by spaces. */
zck_status ze_eval_sums(const ze_gpt2_config *c, ze_zero_rank *zr, const ze_corpus *corpus, int n, uint64_t seed,
                        int *right, char *examples, size_t cap);

#endif
