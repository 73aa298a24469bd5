/* dfl: command-line entry point; dispatches to the subcommands in cmd_*.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/kernels.h"

#ifndef DFL_VERSION
#define DFL_VERSION "unknown"
#endif
#ifndef DFL_GIT_COMMIT
#define DFL_GIT_COMMIT "unknown"
#endif
#ifndef DFL_BUILD_TYPE
#define DFL_BUILD_TYPE "unknown"
#endif

/* dfl --version / dfl version: what was built, and the kernel path this CPU gets now. */
static int version(void) {
    const kn_isa isa = kn_isa_get();
    printf("dfl %s\ncommit %s\nbuild %s\nisa %s (chosen at run time; DFL_ISA overrides)\n", DFL_VERSION, DFL_GIT_COMMIT,
           DFL_BUILD_TYPE, kn_isa_name(isa));
    printf("act %s (activations of BF16 matrix products; DFL_ACT=bf16 opts into bf16)\n", kn_act_name(kn_act_get()));
    /* the OpenMP settings the kernels run under (docs/threads.md) */
    const char *wait = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    kn_team_stats t;
    kn_team_stats_get(&t);
    printf("threads %d (%s), idle threads: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s\n", omp_get_max_threads(),
           t.adaptive ? "adaptive: fewer while other processes hold cores; OMP_NUM_THREADS fixes it" : "fixed",
           wait ? wait : "(unset)", spin ? spin : "(unset)");
    /* "mpi no": built without MPI (mpirun -n N dfl eval refuses to run) */
    printf("mpi %s\n", eval_mpi_library());
    /* the backends built in (--device); a built one that cannot run here says why */
    printf("devices %s", dfl_devices_built());
    for (int d = 1; d < DFL_DEVICE_COUNT; d++)
        if (dfl_device_built((dfl_device)d)) {
            if (dfl_device_check((dfl_device)d) == DFL_OK) {
                char buf[256];
                dfl_backend_of((dfl_device)d)->describe(buf, sizeof buf);
                printf(" (%s: %s)", dfl_device_name((dfl_device)d), buf);
            } else {
                printf(" (%s: %s)", dfl_device_name((dfl_device)d), dfl_errmsg());
            }
        }
    printf("\n");
    return 0;
}

struct subcommand {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
};

static const struct subcommand subcommands[] = {
    {"inspect", cmd_inspect, "identify a checkpoint's layout, tensors and config (or drafter/target fit)"},
    {"tokenize", cmd_tokenize, "encode text to token ids, or decode ids (--decode)"},
    {"generate", cmd_generate, "generate with a target, autoregressive or speculative (--drafter)"},
    {"hidden", cmd_hidden, "dump hidden states of chosen decoder layers to safetensors"},
    {"hidden-diff", cmd_hidden_diff, "compare two hidden-state dumps layer by layer"},
    {"eval", cmd_eval, "evaluate drafters: tau on chain and DDTree over a prompt set, with reports"},
    {"eval-merge", cmd_eval_merge, "merge the results of sharded eval runs into one summary"},
    {"eval-compare", cmd_eval_compare, "tau of the same drafters in several eval runs (targets) side by side"},
    {"bench", cmd_bench, "performance: bandwidth, decode, verification cost, prefill, rollback"},
    {"serve", cmd_serve, "HTTP server with speculative decoding (OpenAI, SGLang /generate, /metrics)"},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: dfl <command> [options]   (dfl help <command>, or dfl <command> --help, for each)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-12s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(f, "  %-12s %s\n", "version", "version, git commit, build type, kernel ISA, MPI (also dfl --version)");
    fprintf(f, "  %-12s %s\n", "help", "this list; dfl help <command>: that command's options");
}

/* dfl help [CMD]: the command list, or CMD's own --help. */
static int help(int argc, char **argv) {
    if (argc < 3) return usage(stdout), 0;
    if (strcmp(argv[2], "version") == 0 || strcmp(argv[2], "help") == 0) return usage(stdout), 0;
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(argv[2], subcommands[i].name) == 0) {
            char *args[] = {argv[2], "--help", NULL};
            return subcommands[i].fn(2, args);
        }
    fprintf(stderr, "dfl help: unknown command '%s'\n", argv[2]);
    usage(stderr);
    return 2;
}

/* OpenMP's idle threads spin GOMP_SPINCOUNT times (libgomp's default: 300,000) at each barrier
 * before they sleep. On a machine where another process keeps a core busy, a thread that finished
 * its share spins on a core the preempted one needs: on 2 cores with one busy, 2 threads ran a
 * decode step 2.4-3x slower than 1. A few thousand spins cost an idle machine 1-4% (most regions
 * start within them) and let a loaded one's threads yield (docs/threads.md). libgomp reads
 * the variable when it loads, before main: so dfl sets it and runs itself again, once, unless the
 * user chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT). */
static void omp_spin_default(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("GOMP_SPINCOUNT", DFL_GOMP_SPINCOUNT, 1) != 0) return;
    execv("/proc/self/exe", argv); /* returns only on failure: run on with libgomp's default */
}

int main(int argc, char **argv) {
    omp_spin_default(argv);
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) return version();
    if (strcmp(argv[1], "help") == 0) return help(argc, argv);
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(argv[1], subcommands[i].name) == 0) {
            static const char *const computes[] = {"generate", "hidden", "eval", "serve"};
            for (size_t k = 0; k < sizeof computes / sizeof computes[0]; k++)
                if (strcmp(argv[1], computes[k]) == 0 && kn_act_get() == KN_ACT_BF16 &&
                    !(argc > 2 && cli_is_help(argv[2])))
                    fprintf(stderr,
                            "dfl %s: bf16 activations (DFL_ACT=bf16): BF16 matrix products round their inputs "
                            "to bf16, so results differ from the float32 computation\n",
                            argv[1]);
            return subcommands[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "dfl: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
