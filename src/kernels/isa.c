/* Instruction-set path selection: CPU feature detection, DFL_ISA, forced paths. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "kn_internal.h"

static const char *const isa_names[KN_ISA_COUNT] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

#if KN_X86 && defined(__linux__)
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_granted;

static void amx_init(void) {
    amx_granted = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") && kn_amx_request();
}
#endif
static kn_isa isa_default_v = KN_ISA_GENERIC, isa_active = KN_ISA_GENERIC;

int kn_isa_supported(kn_isa isa) {
    switch (isa) {
    case KN_ISA_GENERIC:
        return 1;
#if KN_X86
    case KN_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case KN_ISA_AVX512:
        return kn_isa_supported(KN_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    case KN_ISA_AVX512BF16:
        return kn_isa_supported(KN_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
#if defined(__linux__)
    case KN_ISA_AMX:
        if (!kn_isa_supported(KN_ISA_AVX512BF16)) return 0;
        pthread_once(&amx_once, amx_init);
        return amx_granted;
#endif
#endif
    default:
        return 0;
    }
}

const char *kn_isa_name(kn_isa isa) { return isa >= 0 && isa < KN_ISA_COUNT ? isa_names[isa] : "?"; }

int kn_isa_parse(const char *name, kn_isa *out) {
    for (int i = 0; i < KN_ISA_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            *out = (kn_isa)i;
            return DFL_OK;
        }
    return dfl_seterr("unknown instruction-set path '%s' (generic, avx2, avx512, avx512bf16, amx)", name);
}

/* The automatic choice is the first supported of AMX, AVX-512, AVX2, generic. AVX-512 BF16 is
 * never chosen by itself: with the activations split into three bf16 parts (float32 accuracy)
 * it issues three dot-product instructions per 32 weights, and on Sapphire Rapids VDPBF16PS
 * runs at half the FMA rate, so it is slower than the float32 FMA path there
 * (bench/README.md). It stays available through DFL_ISA. */
static void isa_init(void) {
    static const kn_isa order[] = {KN_ISA_AMX, KN_ISA_AVX512, KN_ISA_AVX2};
    kn_isa best = KN_ISA_GENERIC;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (kn_isa_supported(order[i])) {
            best = order[i];
            break;
        }
    const char *env = getenv("DFL_ISA");
    if (env && *env) {
        kn_isa want = best;
        if (kn_isa_parse(env, &want) != DFL_OK) {
            fprintf(stderr, "dfl: DFL_ISA: %s; using %s\n", dfl_errmsg(), isa_names[best]);
        } else if (!kn_isa_supported(want)) {
            fprintf(stderr, "dfl: DFL_ISA=%s: this CPU cannot run it; using %s\n", env, isa_names[best]);
        } else {
            best = want;
        }
    }
    isa_default_v = isa_active = best;
}

kn_isa kn_isa_default(void) {
    pthread_once(&isa_once, isa_init);
    return isa_default_v;
}

kn_isa kn_isa_get(void) {
    pthread_once(&isa_once, isa_init);
    return isa_active;
}

int kn_isa_set(kn_isa isa) {
    pthread_once(&isa_once, isa_init);
    if (isa < 0 || isa >= KN_ISA_COUNT || !kn_isa_supported(isa))
        return dfl_seterr("instruction-set path %s is not supported by this CPU", kn_isa_name(isa));
    isa_active = isa;
    return DFL_OK;
}
