/* Instruction-set path selection: CPU feature detection, DFL_ISA, forced paths; the activation
 * mode of BF16 matrix products (DFL_ACT). */
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
static const char *const act_names[KN_ACT_COUNT] = {"f32", "bf16"};
static kn_act act_active = KN_ACT_F32;

int kn_isa_supported(kn_isa isa) {
    switch (isa) {
    case KN_ISA_GENERIC: return 1;
#if KN_X86
    case KN_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case KN_ISA_AVX512:
        return kn_isa_supported(KN_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    case KN_ISA_AVX512BF16: return kn_isa_supported(KN_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
#if defined(__linux__)
    case KN_ISA_AMX:
        if (!kn_isa_supported(KN_ISA_AVX512BF16)) return 0;
        pthread_once(&amx_once, amx_init);
        return amx_granted;
#endif
#endif
    default: return 0;
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
    const char *act = getenv("DFL_ACT");
    kn_act want = KN_ACT_F32;
    if (act && *act) {
        if (kn_act_parse(act, &want) != DFL_OK) fprintf(stderr, "dfl: DFL_ACT: %s; using f32\n", dfl_errmsg());
        else if (want == KN_ACT_BF16 && !kn_isa_supported(KN_ISA_AVX512BF16))
            fprintf(stderr, "dfl: DFL_ACT=bf16: this CPU has no AVX-512 BF16; using f32\n");
        else act_active = want;
    }
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

const char *kn_act_name(kn_act act) { return act >= 0 && act < KN_ACT_COUNT ? act_names[act] : "?"; }

int kn_act_parse(const char *name, kn_act *out) {
    for (int i = 0; i < KN_ACT_COUNT; i++)
        if (strcmp(name, act_names[i]) == 0) {
            *out = (kn_act)i;
            return DFL_OK;
        }
    return dfl_seterr("unknown activation mode '%s' (f32, bf16)", name);
}

kn_act kn_act_get(void) {
    pthread_once(&isa_once, isa_init);
    return act_active;
}

int kn_act_set(kn_act act) {
    pthread_once(&isa_once, isa_init);
    if (act < 0 || act >= KN_ACT_COUNT) return dfl_seterr("activation mode %d out of range", (int)act);
    if (act == KN_ACT_BF16 && !kn_isa_supported(KN_ISA_AVX512BF16))
        return dfl_seterr("bf16 activations need AVX-512 BF16, which this CPU lacks");
    act_active = act;
    return DFL_OK;
}
