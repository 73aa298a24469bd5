/* CPython's random module, the parts z-lab's benchmark uses to select prompts: Mersenne Twister
 * seeded as random.Random(int) seeds it (init_by_array over the seed's 32-bit words), getrandbits,
 * _randbelow (rejection sampling over n.bit_length() bits) and shuffle. Bit-exact with CPython 3.x
 * (tests/unit/test_pyrandom.c holds numbers Python produced). */
#ifndef DFL_PYRANDOM_H
#define DFL_PYRANDOM_H

#include <stdint.h>

typedef struct dfl_pyrandom {
    uint32_t mt[624];
    int mti;
} dfl_pyrandom;

/* random.Random(seed) for a non-negative int seed (random.seed(abs(seed)) for a negative one). */
void pyrandom_seed(dfl_pyrandom *r, int64_t seed);
/* random.getrandbits(k), 0 <= k <= 32. */
uint32_t pyrandom_getrandbits(dfl_pyrandom *r, int k);
/* random._randbelow(n), 1 <= n <= 2^32 - 1. */
uint32_t pyrandom_randbelow(dfl_pyrandom *r, uint32_t n);
/* random.random(): a double in [0, 1) from 53 bits. */
double pyrandom_random(dfl_pyrandom *r);
/* random.shuffle(x) of n ints in place. */
void pyrandom_shuffle(dfl_pyrandom *r, int *x, int n);

#endif
