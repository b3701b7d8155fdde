/* hash_xxh3.h: the one way zckpt includes xxHash, so every XXH3 it computes runs the
 * fastest code the CPU has.
 *
 * A distribution's libxxhash is built for the baseline CPU (SSE2 on x86-64: about 2.4 GB/s
 * a core for XXH3-64 where AVX2 gives ~15 GB/s). Built with its x86 dispatcher, the same
 * library also exports XXH3_64bits_dispatch and friends, which pick AVX512, AVX2 or SSE2 at
 * run time; xxh_x86dispatch.h redirects XXH3_64bits and XXH3_64bits_update to them. The
 * digests are the same bytes whichever code computes them (XXH3 is defined on the input,
 * not the instruction set), so manifests do not change. CMake defines
 * ZCK_HAVE_XXH_DISPATCH when the header and its symbols are there (cmake/FindXXHash.cmake);
 * without it the plain functions are used. */
#ifndef ZCK_HASH_XXH3_H
#define ZCK_HASH_XXH3_H

#include <xxhash.h>
#if defined(ZCK_HAVE_XXH_DISPATCH)
#include <xxh_x86dispatch.h>
#endif

#endif
