/* CPython's Mersenne Twister (Modules/_randommodule.c) and the Lib/random.py methods built on it. */
#include "eval/pyrandom.h"

#define MT_N 624
#define MT_M 397

static void init_genrand(dfl_pyrandom *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < MT_N; i++) r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->mti = MT_N;
}

static void init_by_array(dfl_pyrandom *r, const uint32_t *key, int len) {
    init_genrand(r, 19650218u);
    uint32_t *mt = r->mt;
    int i = 1, j = 0;
    for (int k = MT_N > len ? MT_N : len; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
        i++, j++;
        if (i >= MT_N) mt[0] = mt[MT_N - 1], i = 1;
        if (j >= len) j = 0;
    }
    for (int k = MT_N - 1; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        i++;
        if (i >= MT_N) mt[0] = mt[MT_N - 1], i = 1;
    }
    mt[0] = 0x80000000u;
}

static uint32_t genrand_uint32(dfl_pyrandom *r) {
    static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
    uint32_t *mt = r->mt, y;
    if (r->mti >= MT_N) {
        int kk;
        for (kk = 0; kk < MT_N - MT_M; kk++) {
            y = (mt[kk] & 0x80000000u) | (mt[kk + 1] & 0x7fffffffu);
            mt[kk] = mt[kk + MT_M] ^ (y >> 1) ^ mag01[y & 1u];
        }
        for (; kk < MT_N - 1; kk++) {
            y = (mt[kk] & 0x80000000u) | (mt[kk + 1] & 0x7fffffffu);
            mt[kk] = mt[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 1u];
        }
        y = (mt[MT_N - 1] & 0x80000000u) | (mt[0] & 0x7fffffffu);
        mt[MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 1u];
        r->mti = 0;
    }
    y = mt[r->mti++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

void pyrandom_seed(dfl_pyrandom *r, int64_t seed) {
    /* random_seed(): the absolute value's 32-bit words, least significant first; 0 -> one word */
    uint64_t a = seed < 0 ? (uint64_t)0 - (uint64_t)seed : (uint64_t)seed;
    uint32_t key[2] = {(uint32_t)a, (uint32_t)(a >> 32)};
    init_by_array(r, key, key[1] ? 2 : 1);
}

uint32_t pyrandom_getrandbits(dfl_pyrandom *r, int k) {
    if (k <= 0) return 0;
    return genrand_uint32(r) >> (32 - k);
}

uint32_t pyrandom_randbelow(dfl_pyrandom *r, uint32_t n) {
    int k = 0; /* n.bit_length() */
    for (uint32_t v = n; v; v >>= 1) k++;
    uint32_t x = pyrandom_getrandbits(r, k);
    while (x >= n) x = pyrandom_getrandbits(r, k);
    return x;
}

double pyrandom_random(dfl_pyrandom *r) {
    uint32_t a = genrand_uint32(r) >> 5, b = genrand_uint32(r) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

void pyrandom_shuffle(dfl_pyrandom *r, int *x, int n) {
    for (int i = n - 1; i >= 1; i--) {
        int j = (int)pyrandom_randbelow(r, (uint32_t)i + 1u);
        int t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}
