/* dfl bench: memory read bandwidth, decode, the verification cost curve, drafter blocks,
 * autoregressive vs speculative generation, prefill, and the rollback strategies, on a target
 * (default: the random-weight benchmark pair of tools/make_bench_model.py). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_products.h"
#include "cli/bench_profile.h"
#include "cli/cli.h"
#include "dfl/any_drafter.h"
#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/kernels.h"
#include "dfl/model.h"
#include "dfl/spec.h"

#define DEFAULT_TARGET "build/bench-model/target"
#define DEFAULT_DRAFTER "build/bench-model/drafter"
#define DEFAULT_BLOCK 16 /* without a drafter */
#define MAX_VERIFY 64

static const char *usage_text =
    "usage: dfl bench [--model DIR] [--drafter DIR|mtp|DIR:mtp|none] [--threads N] [--isa NAME]\n"
    "                 [--act f32|bf16] [--json] [--parts LIST] [--context N] [--decode N]\n"
    "                 [--verify-max N] [--prefill N]\n"
    "                 [--gen N] [--block B] [--block-attn MODE] [--reps N] [--probe-mb N] [--device cpu|cuda]\n"
    "                 [--weights auto|copy|map] [--draft-batch N]\n"
    "\n"
    "Measures, on one target (and drafter: DFlash, DFlash2 or an MTP head), with the weights where\n"
    "--weights puts them:\n"
    "  probe     memory read bandwidth: threaded SIMD sum over a buffer as large as the weights,\n"
    "            median of 7 passes (and the fastest); with decode, also one pass over up to 1 GiB\n"
    "            after each decoded token: the median of the per-token ratios (\"paired\") is\n"
    "            less sensitive to the bandwidth drifting between the two measurements\n"
    "  decode    single-token forwards after a context: tokens/s (median token time) and\n"
    "            effective GB/s (weight bytes read per token x tokens/s)\n"
    "  verify    one forward over n = 1..verify-max new tokens on top of the context, as greedy\n"
    "            decoding verifies (each row's argmax: with float32 activations on AVX-512 BF16 or\n"
    "            AMX the lm_head computes in full only the rows that may be largest); rolled back\n"
    "            after; time relative to n = 1; then verify(verify-max) with every row's logits\n"
    "  draft     the drafter's context update per token and one block of B (through the same\n"
    "            interface the speculative loop drives: with every row's logits, and where the\n"
    "            drafter has it the argmaxes alone, as a greedy chain drafts); a DFlash drafter\n"
    "            also drafts --draft-batch blocks in one forward (a replay's wave) and, with probe,\n"
    "            prints what a replay costs per output token against the target's decode\n"
    "            floor. With no part that runs the target (--parts probe,draft), the target is\n"
    "            opened for its embedding and lm_head alone and the context features are\n"
    "            synthetic: a target larger than this machine's memory can be measured so\n"
    "  e2e       autoregressive vs speculative generation (chain, block B, greedy), tokens/s\n"
    "  prefill   one forward over N prompt tokens (chunked Gated DeltaNet), tokens/s\n"
    "  rollback  per verification round of B tokens: replaying the recorded recurrence inputs\n"
    "            (dfl's strategy) vs per-position snapshots of every linear layer's state\n"
    "  peak      the multiply-add rate of the matmul tiles' core instruction (float32 FMA,\n"
    "            VDPBF16PS, or AMX's TDPBF16PS where the matmul uses tiles; with --act bf16 the\n"
    "            same with one part per activation), independent chains on every thread: with verify,\n"
    "            each verification's share of it and the compute floor of verify(n) / verify(1);\n"
    "            with tree, the floor of a 64-node tree. With AMX also the rate as the products of\n"
    "            many tokens run it (a weight tile and six B tiles loaded a step, the B tiles from\n"
    "            L2), and the floors at that rate (\"loaded\"). Where greedy verification estimates\n"
    "            the lm_head (float32 activations on AMX or AVX-512 BF16) also the estimate's rate\n"
    "            (one bf16 part an activation): the floors take the lm_head at that rate\n"
    "  tree      DDTree verification: one tree forward of budget N = 1..64 draft nodes (trees of\n"
    "            the N most probable prefixes of random block-1 distributions) next to a chain\n"
    "            verification of the same number of tokens (N + 1), both greedy as verify; then\n"
    "            the 64-node tree with every node's logits\n"
    "  profile   where a forward's time goes: the mean time per forward in each kind of kernel\n"
    "            call (matrix products, lm_head, attention, delta-rule recurrence, conv, norms\n"
    "            and elementwise, logits check; other: the forward outside them) for a decode\n"
    "            step, a verification of verify-max tokens, a tree of 64 draft nodes and the\n"
    "            drafter's block of B, and what the extra time over decode went to (CPU backend;\n"
    "            on a GPU: DFL_CUDA_PROFILE=1)\n"
    "  products  each weight shape's matrix product over n = 1, 6, 16, 17, 33, 65 tokens (decode;\n"
    "            6: two B tiles of float32 activations; a 16-token verification; trees of 16, 32,\n"
    "            64 nodes), every matrix of the forward in its order so that the weights come\n"
    "            from where a forward finds them (memory, for a model larger than the caches);\n"
    "            routed experts left out (CPU)\n"
    "Prints a table, or with --json one object (probe_gbps, decode_gbps, verify_cost, ...).\n"
    "Timings are the best of --reps runs. Nothing here is a test: results depend on the machine.\n"
    "\n"
    "  --model DIR       target checkpoint (default " DEFAULT_TARGET ")\n"
    "  --drafter DIR     DFlash or DFlash2 drafter (default " DEFAULT_DRAFTER " with the default\n"
    "                    model, else none); 'mtp' = the target's own MTP head, 'DIR:mtp' = the MTP\n"
    "                    head of checkpoint DIR; none skips draft and e2e's speculative run\n"
    "  --threads N       OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
    "  --isa NAME        generic | avx2 | avx512 | avx512bf16 | amx (default: DFL_ISA or the best)\n"
    "  --act MODE        activations of BF16 matrix products: f32 (exact, the default) or bf16\n"
    "                    (opt-in, needs AVX-512 BF16: each activation rounded to bf16 once; faster\n"
    "                    when compute-bound, less accurate; default: DFL_ACT or f32)\n"
    "  --parts LIST      comma-separated subset of probe,decode,verify,draft,e2e,prefill,rollback,tree,\n"
    "                    peak,profile,products (default: all but tree, profile and products)\n"
    "  --context N       context before decode / verify / draft / rollback (default 256)\n"
    "  --decode N        decoded tokens (default 16)\n"
    "  --verify-max N    largest verified batch (default 32, at most 64)\n"
    "  --prefill N       prompt tokens of the prefill (default 512)\n"
    "  --gen N           tokens generated by each e2e run (default 32; after a given prompt at\n"
    "                    most that many: generation stops at EOS, as in eval)\n"
    "  --block B         block size of draft, e2e, rollback and tree (default: the drafter's block_size,\n"
    "                    4 for an MTP head; 16 without a drafter)\n" CLI_BLOCK_ATTN_HELP
    "  --reps N          repetitions per timing (default 2)\n"
    "  --probe-mb N      probe buffer in MB (default: the weights read per token, at least 1024)\n"
    "  --draft-batch N   blocks of the draft part's batched forward (default 8, as eval's\n"
    "                    --replay-batch; 1: none)\n"
    "  --device D        cpu (default) | cuda: where the target runs. On cuda the probe reads GPU\n"
    "                    memory (a streaming read kernel, CUDA events), peak, rollback, profile and\n"
    "                    products (CPU parts) are left out, and the drafter runs on the CPU\n" CLI_WEIGHTS_HELP
    "e2e prompt (default: 64 random tokens; the tokenizer is the model's):\n" CLI_PROMPT_HELP;

enum {
    P_PROBE = 1,
    P_DECODE = 2,
    P_VERIFY = 4,
    P_DRAFT = 8,
    P_E2E = 16,
    P_PREFILL = 32,
    P_ROLLBACK = 64,
    P_TREE = 128,
    P_PEAK = 256,
    P_PROFILE = 512,
    P_PRODUCTS = 1024,
    P_TARGET = P_DECODE | P_VERIFY | P_E2E | P_PREFILL | P_ROLLBACK | P_TREE | P_PROFILE |
               P_PRODUCTS /* parts that read the target's layers */
};
static const char *const part_names[] = {"probe",    "decode", "verify", "draft",   "e2e",     "prefill",
                                         "rollback", "tree",   "peak",   "profile", "products"};
static const int tree_budgets[] = {1, 2, 4, 8, 16, 32, 64};
#define N_TREE ((int)(sizeof tree_budgets / sizeof tree_budgets[0]))

typedef struct bench_opts {
    const char *model, *drafter;
    const dfl_any_drafter *ad; /* the opened drafter (NULL: none) */
    const int32_t *prompt;     /* e2e prompt ids (NULL: 64 random tokens) */
    int n_prompt;
    int json, threads, context, decode, verify_max, prefill, gen, block, reps, probe_mb, draft_batch;
    int block_attn; /* DFL_BLOCK_ATTN_AUTO or the drafter_set_causal value */
    unsigned parts;
    dfl_device device;
} bench_opts;

typedef struct bench_res {
    uint64_t weight_bytes, token_bytes, probe_bytes;
    double probe_gbps, probe_best_gbps;              /* median and fastest pass */
    double decode_tps, decode_mean_tps, decode_gbps; /* tps: median token time; mean_tps: mean */
    double decode_paired; /* with the probe: median over tokens of the token's GB/s / the next probe pass's */
    int n_verify;
    double verify_ms[MAX_VERIFY];
    /* MoE targets: distinct experts the n-token verification touched, mean per sparse layer, and
     * the weight bytes it reads (the dense part once, each touched expert once) */
    double verify_experts[MAX_VERIFY];
    uint64_t verify_bytes[MAX_VERIFY];
    double draft_block_ms, draft_ctx_ms;
    double draft_ids_ms;   /* the block as a greedy chain drafts it (draft_ids: argmaxes alone); 0: no such path */
    double draft_batch_ms; /* --draft-batch blocks in one forward (0: not measured) */
    double ar_tps, spec_tps, spec_tau;
    int e2e_generated;
    int has_spec;
    double prefill_tps;
    /* rollback per round of B tokens: replay (record + rollback) vs snapshots */
    double replay_record_ms, replay_mean_ms, replay_max_ms, replay_mb;
    double snap_save_ms, snap_restore_ms, snap_mb;
    /* DDTree: tree forward of tree_budgets[i] nodes vs a chain of as many tokens */
    double tree_ms[N_TREE], tree_chain_ms[N_TREE];
    double verify_logits_ms, tree_logits_ms; /* verify-max and the largest tree with every row's logits */
    int tree_depth[N_TREE];
    double peak_macs;             /* multiply-adds per second, all threads (kn_peak_macs) */
    const char *peak_what;        /* its instruction */
    double peak_loaded_macs;      /* as the products of many tokens run it (kn_peak_macs_loaded); 0: not measured */
    const char *peak_loaded_what; /* how */
    double peak_est_macs;         /* the lm_head's estimate in greedy verification (kn_peak_macs_estimate); 0: none */
    const char *peak_est_what;
    uint64_t head_macs;   /* the lm_head's multiply-adds per token */
    int head_est;         /* 1: greedy verification estimates the lm_head (kn_argmax_estimates) */
    uint64_t token_macs;  /* weight multiply-adds of one token's forward (dense targets) */
    bench_prof prof;      /* --parts profile */
    bench_products prods; /* --parts products */
} bench_res;

static unsigned parse_parts(const char *s) {
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        unsigned bit = 0;
        for (int i = 0; i < (int)(sizeof part_names / sizeof part_names[0]); i++)
            if (strcmp(tok, part_names[i]) == 0) bit = 1u << i;
        if (!bit) return 0;
        mask |= bit;
    }
    return mask;
}

/* Deterministic pseudo-random token ids in [0, V). */
static void fill_tokens(int32_t *t, int n, int V, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((seed >> 33) % (uint64_t)V);
    }
}

static uint64_t mat_bytes(const dfl_mat *w) { return (uint64_t)w->rows * w->cols * st_dtype_size(w->dtype); }

/* Multiply-adds of one token through the layer matrices and the lm_head (dense targets: every
 * matrix once; attention over the context and the small vectors are not counted). */
static uint64_t token_macs(const dfl_model *m) {
    uint64_t n = (uint64_t)m->lm_head.rows * m->lm_head.cols;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const dfl_layer_w *l = &m->layers[i];
        const dfl_mat *ms[] = {&l->q_proj, &l->k_proj, &l->v_proj,   &l->o_proj, &l->in_qkv, &l->in_z,
                               &l->in_b,   &l->in_a,   &l->out_proj, &l->gate,   &l->up,     &l->down};
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++)
            if (ms[k]->data) n += (uint64_t)ms[k]->rows * ms[k]->cols;
    }
    return n;
}

/* Bytes of one routed expert (gate, up, down; the same shapes and dtype in every sparse layer). */
static uint64_t expert_bytes(const dfl_model *m) {
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const dfl_layer_w *l = &m->layers[i];
        if (l->moe) return mat_bytes(&l->exp_gate[0]) + mat_bytes(&l->exp_up[0]) + mat_bytes(&l->exp_down[0]);
    }
    return 0;
}

/* Weight bytes a forward reads when it touches `experts` routed experts over all sparse layers:
 * every layer matrix, router and shared expert, those experts, and the lm_head (the embedding
 * lookup reads one row; small vectors are not counted). */
static uint64_t forward_bytes(const dfl_model *m, long experts) {
    uint64_t b = mat_bytes(&m->lm_head) + (uint64_t)experts * expert_bytes(m);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const dfl_layer_w *l = &m->layers[i];
        const dfl_mat *ms[] = {&l->q_proj, &l->k_proj,  &l->v_proj,   &l->o_proj,  &l->in_qkv,  &l->in_z,
                               &l->in_b,   &l->in_a,    &l->out_proj, &l->gate,    &l->up,      &l->down,
                               &l->router, &l->sh_gate, &l->sh_up,    &l->sh_down, &l->sh_score};
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++)
            if (ms[k]->data) b += mat_bytes(ms[k]);
    }
    return b;
}

/* Weight bytes one decoded token reads (its k experts in every sparse layer). */
static uint64_t token_bytes(const dfl_model *m) {
    return forward_bytes(m, (long)m->cfg.n_experts_per_tok * config_n_moe_layers(&m->cfg));
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define PROBE_PASSES 7                         /* timed passes of the probe (after one warm-up) */
#define PAIRED_PROBE_BYTES ((uint64_t)1 << 30) /* the probe pass after each decoded token */

/* The probe's buffer of nbytes, first touched by the reading threads; NULL without memory. */
static float *probe_alloc(uint64_t nbytes) {
    const size_t n = (size_t)(nbytes / sizeof(float));
    float *buf = malloc(n * sizeof(float));
    if (!buf) return NULL;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7) * 0.125f;
    return buf;
}

static double probe_sink; /* keeps the sums observable */

/* One threaded read of the buffer: GB/s. */
static double probe_pass(const float *buf, uint64_t nbytes) {
    const size_t n = (size_t)(nbytes / sizeof(float)), blk = (size_t)1 << 18; /* 1 MiB per work item */
    double s = 0, t0 = dfl_now();
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (size_t b = 0; b < n; b += blk) s += kn_dot(buf + b, buf + b, (int)(n - b < blk ? n - b : blk));
    const double dt = dfl_now() - t0;
    probe_sink += s;
    return nbytes / dt / 1e9;
}

/* Read a buffer of nbytes PROBE_PASSES times after a warm-up: the median pass (the same
 * statistic as decode's median token) in *median, the fastest in *best, GB/s. DFL_ERR when the
 * buffer cannot be allocated. */
static int probe_bandwidth(uint64_t nbytes, double *median, double *best) {
    float *buf = probe_alloc(nbytes);
    if (!buf) return DFL_ERR;
    double gbps[PROBE_PASSES];
    probe_pass(buf, nbytes); /* warm-up */
    for (int r = 0; r < PROBE_PASSES; r++) gbps[r] = probe_pass(buf, nbytes);
    free(buf);
    qsort(gbps, PROBE_PASSES, sizeof(double), cmp_double);
    *median = gbps[PROBE_PASSES / 2], *best = gbps[PROBE_PASSES - 1];
    return DFL_OK;
}

/* The compute floor in ms of a greedy forward over n tokens at a rate of `peak` multiply-adds/s
 * (the peak or the loaded rate): the layers' multiply-adds at that rate, the lm_head's at the
 * estimate's where greedy verification estimates it (kn_matmul_argmax; the same ratio to the
 * peak), since it computes only a few rows in full. */
static double floor_ms(const bench_res *r, int n, double peak) {
    const double head = (double)r->head_macs * n, rest = ((double)r->token_macs - (double)r->head_macs) * n;
    const int est = r->head_est && r->peak_est_macs > 0 && n >= KN_ARGMAX_MIN_TOKENS;
    return 1e3 * (rest / peak + head / (est ? peak * r->peak_est_macs / r->peak_macs : peak));
}

/* fn (kn_peak_macs or kn_peak_macs_loaded) on every thread at once, summed; the median of 3 runs
 * of about 0.2 s; 0 where fn measures nothing. */
static double peak_macs(double (*fn)(long, const char **), const char **what) {
    long iters = 1 << 20;
    double rate[3];
    if (fn(1, what) <= 0) return 0;
    for (;;) { /* size the run: about 0.2 s */
        const double t0 = dfl_now();
        fn(iters, what);
        const double dt = dfl_now() - t0;
        if (dt > 0.05 || iters > (1L << 40)) {
            iters = (long)(iters * (0.2 / (dt > 1e-6 ? dt : 1e-6)));
            break;
        }
        iters *= 4;
    }
    for (int r = 0; r < 3; r++) {
        double sum = 0;
#pragma omp parallel reduction(+ : sum)
        sum += fn(iters, what);
        rate[r] = sum;
    }
    qsort(rate, 3, sizeof(double), cmp_double);
    return rate[1];
}

/* A verification forward (a tree's where parent is given) as greedy decoding runs it: each row's
 * argmax, the logits scratch (the lm_head may skip most rows: kn_matmul_argmax); with ids NULL,
 * every row's logits. */
static int verify_forward(dfl_target_state *s, const int32_t *toks, const int *parent, int n, float *logits,
                          int32_t *ids) {
    const dfl_fwd_out fo = {.logits = logits, .argmax = ids, .logits_scratch = ids != NULL};
    return model_forward_ex(s, toks, parent, n, &fo);
}

/* Best-of-reps time of one verification forward over n tokens at the current position (greedy,
 * or with ids NULL every row's logits), rolled back after. */
static double time_verify(dfl_target_state *s, const int32_t *toks, int n, float *logits, int32_t *ids, int reps) {
    const int base = s->n_past;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = dfl_now();
        if (verify_forward(s, toks, NULL, n, logits, ids) != DFL_OK) return -1;
        const double dt = dfl_now() - t0;
        if (target_state_rollback(s, base) != DFL_OK) return -1;
        if (dt < best) best = dt;
    }
    return best;
}

/* Rollback strategies over one verification round of B tokens after the context. */
/* Rollback by replay after a recorded forward of B tokens, to every accepted length; then what the
 * replay and the snapshot strategies copy per round (target_state_rollback_costs). */
static int bench_rollback(dfl_target_state *s, const int32_t *toks, int B, int reps, bench_res *r) {
    const int base = s->n_past;
    double sum = 0, worst = 0;
    int count = 0;
    for (int rep = 0; rep < reps; rep++) {
        if (model_forward(s, toks, B, NULL, 0, NULL) != DFL_OK) return DFL_ERR;
        for (int keep = base + B - 1; keep >= base + 1; keep--) { /* accepted drafts B-2 .. 0 */
            const double t0 = dfl_now();
            if (target_state_rollback(s, keep) != DFL_OK) return DFL_ERR;
            const double dt = dfl_now() - t0;
            sum += dt, count++;
            worst = dt > worst ? dt : worst;
        }
        if (target_state_rollback(s, base) != DFL_OK) return DFL_ERR;
    }
    r->replay_mean_ms = 1e3 * sum / count;
    r->replay_max_ms = 1e3 * worst;
    dfl_rollback_costs c;
    if (target_state_rollback_costs(s, B, reps, &c) != DFL_OK) return DFL_ERR;
    r->replay_mb = c.record_mb, r->replay_record_ms = c.record_ms;
    r->snap_save_ms = c.snap_save_ms, r->snap_restore_ms = c.snap_restore_ms, r->snap_mb = c.snap_mb;
    return DFL_OK;
}

/* A replay's drafting per output token and drafter, at most: one context row and one block of a
 * --draft-batch wave. */
static double replay_token_ms(const bench_opts *o, const bench_res *r) {
    return r->draft_ctx_ms + r->draft_batch_ms / o->draft_batch;
}

static void print_json(const bench_opts *o, const bench_res *r, const dfl_model *m) {
    printf("{\"model\": ");
    cli_json_string(stdout, o->model);
    printf(", \"isa\": \"%s\", \"act\": \"%s\", \"threads\": %d, \"weight_bytes\": %llu, \"token_bytes\": %llu",
           kn_isa_name(kn_isa_get()), kn_act_name(kn_act_get()), omp_get_max_threads(),
           (unsigned long long)r->weight_bytes, (unsigned long long)r->token_bytes);
    kn_team_stats t;
    kn_team_stats_get(&t);
    printf(", \"threads_adaptive\": %s, \"threads_mean\": %.3f, \"threads_lowest\": %d, \"threads_trials\": %ld, "
           "\"threads_kept_fewer\": %ld",
           t.adaptive ? "true" : "false", t.mean, t.lowest, t.trials, t.shrinks);
    printf(", \"device\": \"%s\", \"weights\": \"%s\", \"weights_placed_bytes\": %llu, \"weights_copy_s\": %.3f",
           m->be->name, m->st.placed_bytes ? "copy" : "map", (unsigned long long)m->st.placed_bytes, m->st.place_s);
    printf(", \"weights_why\": ");
    cli_json_string(stdout, m->st.place_why);
    if (m->be->describe) {
        char d[256];
        m->be->describe(d, sizeof d);
        printf(", \"device_name\": ");
        cli_json_string(stdout, d);
    }
    printf(", \"hidden\": %d, \"layers\": %d, \"vocab\": %d", m->cfg.hidden, m->cfg.n_layers, m->cfg.vocab);
    if (o->parts & P_PROBE)
        printf(", \"probe_bytes\": %llu, \"probe_gbps\": %.3f, \"probe_best_gbps\": %.3f",
               (unsigned long long)r->probe_bytes, r->probe_gbps, r->probe_best_gbps);
    if (o->parts & P_DECODE) {
        printf(", \"context\": %d, \"decode_tokens\": %d, \"decode_tokens_per_s\": %.4f, "
               "\"decode_mean_tokens_per_s\": %.4f, \"decode_gbps\": %.3f",
               o->context, o->decode, r->decode_tps, r->decode_mean_tps, r->decode_gbps);
        if (o->parts & P_PROBE)
            printf(", \"decode_vs_probe\": %.4f, \"decode_vs_probe_best\": %.4f, \"decode_vs_probe_paired\": %.4f",
                   r->decode_gbps / r->probe_gbps, r->decode_gbps / r->probe_best_gbps, r->decode_paired);
    }
    if (o->parts & P_PEAK) {
        printf(", \"peak_macs_per_s\": %.4g, \"peak_instruction\": \"%s\"", r->peak_macs, r->peak_what);
        if (r->peak_loaded_macs > 0)
            printf(", \"peak_loaded_macs_per_s\": %.4g, \"peak_loaded_instruction\": \"%s\"", r->peak_loaded_macs,
                   r->peak_loaded_what);
        if (r->peak_est_macs > 0)
            printf(", \"peak_estimate_macs_per_s\": %.4g, \"peak_estimate_instruction\": \"%s\"", r->peak_est_macs,
                   r->peak_est_what);
        printf(", \"lm_head_estimated\": %s", r->head_est ? "true" : "false");
        if (r->token_macs) printf(", \"token_macs\": %llu", (unsigned long long)r->token_macs);
    }
    if ((o->parts & P_PEAK) && (o->parts & P_VERIFY) && r->token_macs) {
        printf(", \"verify_peak_share\": [");
        for (int i = 0; i < r->n_verify; i++)
            printf("%s%.4f", i ? ", " : "", floor_ms(r, i + 1, r->peak_macs) / r->verify_ms[i]);
        printf("]");
    }
    if (o->parts & P_VERIFY) {
        printf(", \"verify_ms\": [");
        for (int i = 0; i < r->n_verify; i++) printf("%s%.3f", i ? ", " : "", r->verify_ms[i]);
        printf("], \"verify_cost\": [");
        for (int i = 0; i < r->n_verify; i++) printf("%s%.4f", i ? ", " : "", r->verify_ms[i] / r->verify_ms[0]);
        printf("], \"verify_logits_ms\": %.3f", r->verify_logits_ms);
        if (m->cfg.n_experts > 0) {
            printf(
                ", \"moe\": {\"experts\": %d, \"experts_per_tok\": %d, \"sparse_layers\": %d, \"expert_bytes\": %llu}",
                m->cfg.n_experts, m->cfg.n_experts_per_tok, config_n_moe_layers(&m->cfg),
                (unsigned long long)expert_bytes(m));
            printf(", \"verify_experts_per_layer\": [");
            for (int i = 0; i < r->n_verify; i++) printf("%s%.3f", i ? ", " : "", r->verify_experts[i]);
            printf("], \"verify_weight_bytes\": [");
            for (int i = 0; i < r->n_verify; i++)
                printf("%s%llu", i ? ", " : "", (unsigned long long)r->verify_bytes[i]);
            printf("]");
        }
    }
    if (o->ad) {
        printf(", \"drafter\": {\"kind\": \"%s\", \"path\": ", anydrafter_kind_name(o->ad->kind));
        cli_json_string(stdout, o->drafter);
        printf(", \"block\": %d, \"weight_bytes\": %llu", o->ad->block, (unsigned long long)o->ad->weight_bytes);
        anydrafter_attn_json(stdout, o->ad);
        printf("}");
    }
    if ((o->parts & P_DRAFT) && o->ad)
        printf(", \"block\": %d, \"draft_block_ms\": %.3f, \"draft_context_ms_per_token\": %.4f", o->block,
               r->draft_block_ms, r->draft_ctx_ms);
    if (r->draft_ids_ms > 0) printf(", \"draft_block_ids_ms\": %.3f", r->draft_ids_ms);
    if (r->draft_batch_ms > 0) {
        printf(", \"draft_batch\": %d, \"draft_batch_ms\": %.3f", o->draft_batch, r->draft_batch_ms);
        if (o->parts & P_PROBE)
            printf(", \"replay_ms_per_token_per_drafter\": %.3f, \"decode_floor_ms\": %.3f", replay_token_ms(o, r),
                   1e3 * r->token_bytes / (r->probe_gbps * 1e9));
    }
    if (o->parts & P_E2E) {
        printf(", \"e2e_gen\": %d, \"e2e_generated\": %d, \"e2e_prompt_tokens\": %d, \"e2e_prompt\": \"%s\", "
               "\"ar_tokens_per_s\": %.4f",
               o->gen, r->e2e_generated, o->prompt ? o->n_prompt : 64, o->prompt ? "given" : "random", r->ar_tps);
        if (r->has_spec) printf(", \"spec_tokens_per_s\": %.4f, \"spec_tau\": %.4f", r->spec_tps, r->spec_tau);
    }
    if (o->parts & P_PREFILL)
        printf(", \"prefill_tokens\": %d, \"prefill_tokens_per_s\": %.3f", o->prefill, r->prefill_tps);
    if (o->parts & P_ROLLBACK)
        printf(", \"rollback\": {\"block\": %d, \"replay_record_ms\": %.3f, \"replay_rollback_mean_ms\": %.3f, "
               "\"replay_rollback_max_ms\": %.3f, \"replay_mb\": %.2f, \"snapshot_save_ms\": %.3f, "
               "\"snapshot_restore_ms\": %.3f, \"snapshot_mb\": %.2f}",
               o->block, r->replay_record_ms, r->replay_mean_ms, r->replay_max_ms, r->replay_mb, r->snap_save_ms,
               r->snap_restore_ms, r->snap_mb);
    if (o->parts & P_TREE) {
        printf(", \"tree\": [");
        for (int i = 0; i < N_TREE; i++)
            printf("%s{\"budget\": %d, \"depth\": %d, \"tree_ms\": %.3f, \"chain_ms\": %.3f}", i ? ", " : "",
                   tree_budgets[i], r->tree_depth[i], r->tree_ms[i], r->tree_chain_ms[i]);
        printf("], \"tree_logits_ms\": %.3f", r->tree_logits_ms);
    }
    if (o->parts & P_PROFILE) bench_profile_json(&r->prof);
    if (o->parts & P_PRODUCTS) bench_products_json(&r->prods);
    printf("}\n");
}

static void print_table(const bench_opts *o, const bench_res *r, const dfl_model *m) {
    printf("model      %s (hidden %d, %d layers, vocab %d)\n", o->model, m->cfg.hidden, m->cfg.n_layers, m->cfg.vocab);
    if (m->be->describe) {
        char d[256];
        m->be->describe(d, sizeof d);
        printf("device     %s: %s (drafter and host work: %s, %d threads)\n", m->be->name, d, kn_isa_name(kn_isa_get()),
               omp_get_max_threads());
    } else {
        printf("isa        %s, %s activations, %d threads\n", kn_isa_name(kn_isa_get()), kn_act_name(kn_act_get()),
               omp_get_max_threads());
    }
    kn_team_stats t; /* docs/threads.md */
    kn_team_stats_get(&t);
    if (t.adaptive)
        printf("threads    adaptive, up to %d: %.2f on average, the fewest %d; %ld trials of another count, %ld kept "
               "fewer%s\n",
               t.max, t.mean, t.lowest, t.trials, t.shrinks,
               t.trials ? " (other processes took cores: these times are a shared machine's)" : "");
    else printf("threads    %d, fixed (--threads or OMP_NUM_THREADS)\n", t.now);
    printf("weights    %.1f MB; read per decoded token %.1f MB; %s", r->weight_bytes / 1e6, r->token_bytes / 1e6,
           m->st.place_why);
    if (m->st.placed_bytes) printf(": %.2f GB copied in %.2f s", m->st.placed_bytes / 1e9, m->st.place_s);
    printf("\n");
    if (o->parts & P_PROBE)
        printf("probe      %.2f GB/s read (median of %d passes over %.0f MB; fastest %.2f)\n", r->probe_gbps,
               PROBE_PASSES, r->probe_bytes / 1e6, r->probe_best_gbps);
    if (o->parts & P_DECODE) {
        printf("decode     %.3f tokens/s = %.2f GB/s effective (median token; mean %.3f tokens/s; context %d)",
               r->decode_tps, r->decode_gbps, r->decode_mean_tps, o->context);
        if ((o->parts & P_PROBE) && !m->be->probe)
            printf(", %.0f%% of the probe (%.0f%% of its fastest pass; paired with a probe pass after each "
                   "token: %.0f%%)",
                   100 * r->decode_gbps / r->probe_gbps, 100 * r->decode_gbps / r->probe_best_gbps,
                   100 * r->decode_paired);
        else if (o->parts & P_PROBE)
            printf(", %.0f%% of the probe (%.0f%% of its fastest pass); the weights at the probe's rate: %.2f ms",
                   100 * r->decode_gbps / r->probe_gbps, 100 * r->decode_gbps / r->probe_best_gbps,
                   1e3 * r->token_bytes / 1e9 / r->probe_gbps);
        printf("\n");
    }
    if (o->parts & P_PEAK) {
        printf("peak       %.1f G multiply-adds/s (%s, independent chains, %d threads)\n", r->peak_macs / 1e9,
               r->peak_what, omp_get_max_threads());
        if (r->peak_loaded_macs > 0) /* what products of many tokens can reach: their tiles come from the caches */
            printf("           %.1f G as the products of many tokens run it (%s): %.0f%% of the peak\n",
                   r->peak_loaded_macs / 1e9, r->peak_loaded_what, 100 * r->peak_loaded_macs / r->peak_macs);
        if (r->peak_est_macs > 0)
            printf("           %.1f G as greedy verification estimates the lm_head (%s)%s\n", r->peak_est_macs / 1e9,
                   r->peak_est_what, r->head_est ? "" : "; this lm_head is not estimated (not BF16 or too small)");
    }
    if (o->parts & P_VERIFY && m->cfg.n_experts > 0) {
        /* the numbers behind MoE speedups: n tokens touch up to n*k experts per layer, and a
         * verification reads each touched expert once */
        printf("verify     n   ms      x n=1   experts/layer (of %d, k %d)  weights MB  x n=1\n", m->cfg.n_experts,
               m->cfg.n_experts_per_tok);
        for (int i = 0; i < r->n_verify; i++)
            printf("           %-3d %-7.1f %-7.3f %-28.2f %-11.1f %.3f\n", i + 1, r->verify_ms[i],
                   r->verify_ms[i] / r->verify_ms[0], r->verify_experts[i], r->verify_bytes[i] / 1e6,
                   (double)r->verify_bytes[i] / (double)r->verify_bytes[0]);
    } else if (o->parts & P_VERIFY) {
        const int peak = (o->parts & P_PEAK) && r->token_macs;
        printf("verify     n   ms      x n=1%s\n", peak ? "   share of the peak" : "");
        for (int i = 0; i < r->n_verify; i++) {
            printf("           %-3d %-7.1f %-7.3f", i + 1, r->verify_ms[i], r->verify_ms[i] / r->verify_ms[0]);
            if (peak) printf(" %.0f%%", 100.0 * floor_ms(r, i + 1, r->peak_macs) / r->verify_ms[i]);
            printf("\n");
        }
        printf("           verify(%d) with every row's logits (not only each row's argmax): %.1f ms\n", r->n_verify,
               r->verify_logits_ms);
        if (peak) { /* the floor of verify(n) / verify(1): n tokens' multiply-adds at the peak over one token */
            const int n = r->n_verify;
            const double fl = floor_ms(r, n, r->peak_macs);
            printf("roofline   verify(%d): %.2f G multiply-adds%s = %.1f ms at the peak", n, n * r->token_macs / 1e9,
                   r->head_est && n >= KN_ARGMAX_MIN_TOKENS ? " (the lm_head's at the estimate's rate)" : "", fl);
            if (r->peak_loaded_macs > 0) printf(", %.1f ms loaded", floor_ms(r, n, r->peak_loaded_macs));
            if (o->parts & P_PROBE)
                printf("; reading the weights at the probe's rate: %.1f ms",
                       1e3 * r->token_bytes / 1e9 / r->probe_gbps);
            printf("; so verify(%d) / verify(1) >= %.2f with verify(1) as measured\n", n, fl / r->verify_ms[0]);
        }
    }
    if (o->ad) {
        const char *attn = anydrafter_attn_semantics(o->ad);
        printf("drafter    %s: %s (block %d, %.1f MB%s%s)\n", anydrafter_kind_name(o->ad->kind), o->drafter,
               o->ad->block, o->ad->weight_bytes / 1e6, attn ? "; block attention: " : "", attn ? attn : "");
    }
    if ((o->parts & P_DRAFT) && o->ad) {
        printf("draft      block of %d: %.1f ms", o->block, r->draft_block_ms);
        if (r->draft_ids_ms > 0) printf(" (%.1f ms for its argmaxes alone, as a greedy chain drafts)", r->draft_ids_ms);
        printf("; context update %.2f ms/token", r->draft_ctx_ms);
        if (r->draft_batch_ms > 0)
            printf("; %d blocks in one forward: %.1f ms (%.1f ms a block)", o->draft_batch, r->draft_batch_ms,
                   r->draft_batch_ms / o->draft_batch);
        printf("%s\n", o->parts & P_TARGET ? "" : " (synthetic context features: no part runs the target)");
    }
    if (r->draft_batch_ms > 0 && (o->parts & P_PROBE)) {
        const double floor_ms = 1e3 * r->token_bytes / (r->probe_gbps * 1e9), rt = replay_token_ms(o, r);
        printf("replay     per output token and drafter, at most: a context row + a block of a %d-block wave = "
               "%.2f ms = %.3fx the target's decode floor (%.0f MB at the probe's %.2f GB/s = %.1f ms; a drafter x "
               "mode replays each position once at most: modes share blocks, and tau > 1 drafts fewer; the "
               "summaries of the logits are not counted: bench/replay-cost measures a whole replay)\n",
               o->draft_batch, rt, rt / floor_ms, r->token_bytes / 1e6, r->probe_gbps, floor_ms);
    }
    if (o->parts & P_E2E) {
        printf("e2e        %d tokens after a %d-token %s prompt: autoregressive %.3f tokens/s", r->e2e_generated,
               o->prompt ? o->n_prompt : 64, o->prompt ? "given" : "random", r->ar_tps);
        if (r->has_spec) printf("; speculative (block %d) %.3f tokens/s, tau %.2f", o->block, r->spec_tps, r->spec_tau);
        printf("\n");
    }
    if (o->parts & P_PREFILL)
        printf("prefill    %.2f tokens/s (%d tokens in one forward)\n", r->prefill_tps, o->prefill);
    if (o->parts & P_ROLLBACK) {
        printf("rollback   per round of %d: replay  record %.2f ms, rollback %.2f ms mean / %.2f max, %.1f MB\n",
               o->block, r->replay_record_ms, r->replay_mean_ms, r->replay_max_ms, r->replay_mb);
        printf("                          snapshots save %.2f ms, restore %.2f ms, %.1f MB\n", r->snap_save_ms,
               r->snap_restore_ms, r->snap_mb);
    }
    if (o->parts & P_PROFILE) bench_profile_print(&r->prof);
    if (o->parts & P_PRODUCTS) bench_products_print(&r->prods);
    if (o->parts & P_TREE) {
        printf("tree       budget depth  tree ms  chain ms (same tokens)  tree/chain\n");
        for (int i = 0; i < N_TREE; i++)
            printf("           %-6d %-6d %-8.1f %-22.1f %.3f\n", tree_budgets[i], r->tree_depth[i], r->tree_ms[i],
                   r->tree_chain_ms[i], r->tree_ms[i] / r->tree_chain_ms[i]);
        printf("           budget %d with every node's logits (not only each node's argmax): %.1f ms\n",
               tree_budgets[N_TREE - 1], r->tree_logits_ms);
        if ((o->parts & P_PEAK) && r->token_macs) { /* its nodes' multiply-adds: a floor for the products alone */
            const int nodes = tree_budgets[N_TREE - 1] + 1;
            printf("roofline   tree-%d (%d nodes): %.2f G multiply-adds%s = %.1f ms at the peak", nodes - 1, nodes,
                   nodes * r->token_macs / 1e9, r->head_est ? " (the lm_head's at the estimate's rate)" : "",
                   floor_ms(r, nodes, r->peak_macs));
            if (r->peak_loaded_macs > 0) printf(", %.1f ms loaded", floor_ms(r, nodes, r->peak_loaded_macs));
            printf("\n");
        }
    }
}

/* DDTree verification cost: for each budget, a tree of the most probable prefixes of random
 * distributions over B-1 depths with one likely token each (trees both deep and branching), verified in one forward; then only its root is
 * committed (one position more per measurement), and a chain of as many tokens is timed with
 * record + rollback. */
static int bench_tree(dfl_target_state *s, int32_t *toks, int B, int reps, bench_res *r) {
    const int V = s->m->cfg.vocab, D = B - 1;
    float *probs = bench_tree_probs(D, V);
    float *logits = dfl_alloc((size_t)(tree_budgets[N_TREE - 1] + 1) * V * sizeof(float));
    int32_t ids[65];
    dfl_tree t = {0};
    int rc = DFL_ERR;
    if (!probs || !logits || ddtree_alloc(&t, tree_budgets[N_TREE - 1]) != DFL_OK) goto done;
    for (int i = 0; i < N_TREE; i++) {
        if (ddtree_build(&t, toks[0], probs, D, V, tree_budgets[i]) != DFL_OK) goto done;
        r->tree_depth[i] = t.max_depth;
        double best = 1e30;
        const int root[1] = {0};
        const int last = i == N_TREE - 1; /* the largest tree also with every node's logits */
        double best_logits = 1e30;
        for (int k = 0; k < reps * (last ? 2 : 1); k++) {
            const int greedy = k < reps;
            const double t0 = dfl_now();
            if (verify_forward(s, t.token, t.parent, t.n, logits, greedy ? ids : NULL) != DFL_OK) goto done;
            const double dt = dfl_now() - t0;
            if (target_state_tree_commit(s, root, 1) != DFL_OK) goto done;
            if (greedy) best = dt < best ? dt : best;
            else best_logits = dt < best_logits ? dt : best_logits;
        }
        r->tree_ms[i] = 1e3 * best;
        if (last) r->tree_logits_ms = 1e3 * best_logits;
        const double c = time_verify(s, toks, t.n, logits, ids, reps);
        if (c < 0) goto done;
        r->tree_chain_ms[i] = 1e3 * c;
    }
    rc = DFL_OK;
done:
    ddtree_free(&t);
    free(probs), free(logits);
    return rc;
}

/* Everything after loading: the parts in order, on one run state. */
/* --draft-batch blocks on one context in one forward (each block at its own start, as a replay's
 * wave drafts the rounds of as many prompts): the best of reps. */
static int bench_draft_batch(const bench_opts *o, const dfl_draft_if *dif, int32_t anchor, int ctx, int V,
                             bench_res *r) {
    const int nb = o->draft_batch, B = o->block;
    float *lg = dfl_alloc((size_t)nb * (B - 1) * V * sizeof(float));
    void **ctxs = malloc((size_t)nb * sizeof *ctxs);
    int32_t *anchors = malloc((size_t)nb * sizeof *anchors);
    int *starts = malloc((size_t)nb * sizeof *starts), rc = DFL_OK;
    if (!lg || !ctxs || !anchors || !starts) rc = dfl_seterr("out of memory for %d draft blocks", nb);
    for (int b = 0; rc == DFL_OK && b < nb; b++) ctxs[b] = dif->ctx, anchors[b] = anchor, starts[b] = ctx - b % ctx;
    r->draft_batch_ms = 1e30;
    for (int i = 0; rc == DFL_OK && i < o->reps + 1; i++) { /* the first run warms up */
        const double t0 = dfl_now();
        rc = dif->draft_across(ctxs, anchors, starts, nb, B, lg);
        const double dt = 1e3 * (dfl_now() - t0);
        if (i > 0 && dt < r->draft_batch_ms) r->draft_batch_ms = dt;
    }
    free(lg), free(ctxs), free(anchors), free(starts);
    return rc;
}

static int run_bench(const bench_opts *o, const dfl_model *m, dfl_any_drafter *ad, bench_res *r) {
    const dfl_config *g = &m->cfg;
    const int V = g->vocab, H = g->hidden;
    const int ctx = o->context, nv = o->verify_max, B = o->block;
    int max_batch = ctx;
    const int e2e_prompt = o->prompt ? o->n_prompt : 64;
    const int trees = (o->parts & (P_TREE | P_PROFILE)) != 0;
    const int sizes[] = {o->prefill, nv, B, o->gen + e2e_prompt, trees ? BP_TREE_BUDGET + 1 : 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) max_batch = sizes[i] > max_batch ? sizes[i] : max_batch;
    int max_ctx = ctx + o->decode + nv + B + 8;
    max_ctx = max_ctx > o->prefill ? max_ctx : o->prefill;
    max_ctx = max_ctx > e2e_prompt + o->gen + B ? max_ctx : e2e_prompt + o->gen + B;
    if (o->parts & P_TREE) max_ctx += 65 + N_TREE * (o->reps + 1);               /* tree slots, committed roots */
    if (o->parts & P_PROFILE) max_ctx += BP_TREE_BUDGET + 1 + 2 * (o->reps + 1); /* and decoded tokens */
    r->weight_bytes = m->weight_bytes;
    r->token_bytes = token_bytes(m);
    if (o->parts & P_PROBE) {
        r->probe_bytes =
            o->probe_mb ? (uint64_t)o->probe_mb << 20 : (r->token_bytes > (1ull << 30) ? r->token_bytes : 1ull << 30);
        if (m->be->probe) { /* the device's own memory */
            if (m->be->probe(r->probe_bytes, &r->probe_gbps, &r->probe_best_gbps) != DFL_OK) return DFL_ERR;
        } else if (probe_bandwidth(r->probe_bytes, &r->probe_gbps, &r->probe_best_gbps) != DFL_OK) {
            return dfl_seterr("out of memory for the %.0f MB probe buffer", r->probe_bytes / 1e6);
        }
    }
    if (o->parts & P_PEAK) {
        r->peak_macs = peak_macs(kn_peak_macs, &r->peak_what);
        r->peak_loaded_macs = peak_macs(kn_peak_macs_loaded, &r->peak_loaded_what);
        r->peak_est_macs = peak_macs(kn_peak_macs_estimate, &r->peak_est_what);
        r->head_macs = (uint64_t)m->lm_head.rows * m->lm_head.cols;
        r->head_est = kn_argmax_estimates(&m->lm_head, KN_ARGMAX_MIN_TOKENS);
        r->token_macs = m->cfg.n_experts > 0 ? 0 : token_macs(m);
    }
    if ((o->parts & P_PRODUCTS) && bench_products_run(m, o->reps, &r->prods) != DFL_OK) return DFL_ERR;
    dfl_target_state s;
    if (target_state_init(&s, m, max_ctx, max_batch, 1) != DFL_OK) return DFL_ERR;
    if (trees && target_state_enable_tree(&s, BP_TREE_BUDGET + 1) != DFL_OK) {
        target_state_free(&s);
        return DFL_ERR;
    }
    /* the drafter, whatever its kind, through the interface the speculative loop drives */
    dfl_draft_if dif = {0};
    if (ad && anydrafter_state_init(ad, m, max_ctx, &dif) != DFL_OK) {
        target_state_free(&s);
        return DFL_ERR;
    }
    int rc = DFL_ERR;
    const int nf = dif.n_feature_layers;
    int32_t *toks = malloc((size_t)max_batch * sizeof(int32_t));
    int32_t *ctx_toks = malloc((size_t)ctx * sizeof(int32_t)); /* the context's tokens (the MTP head reads them) */
    float *logits = dfl_alloc((size_t)(nv > B ? nv : B) * V * sizeof(float));
    float *feat = ad ? malloc((size_t)ctx * nf * H * sizeof(float)) : NULL;
    int32_t *out = malloc((size_t)o->gen * sizeof(int32_t));
    const dfl_capture cap = {.n_layers = nf, .layers = dif.feature_layers, .out = feat};
    if (!toks || !ctx_toks || !logits || !out || (ad && !feat)) {
        dfl_seterr("out of memory for benchmark buffers");
        goto done;
    }
    /* the context (capturing the drafter's features); without a part that runs the target, the
     * features are synthetic (what the drafter costs does not depend on them) */
    fill_tokens(ctx_toks, ctx, V, 1);
    memcpy(toks, ctx_toks, (size_t)ctx * sizeof(int32_t));
    if (!(o->parts & P_TARGET)) {
        for (size_t i = 0; feat && i < (size_t)ctx * nf * H; i++)
            feat[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1;
    } else if (model_forward(&s, toks, ctx, logits, 1, ad ? &cap : NULL) != DFL_OK) {
        goto done;
    }
    if (o->parts & P_DECODE) {
        /* tokens/s from the median token time: a token slowed by another process on a shared
         * machine does not move it; the mean is reported too */
        int32_t tok = kn_argmax(logits, V);
        s.no_record = 1; /* plain decoding is never rolled back (dfl generate keeps no record) */
        double *dt = malloc((size_t)o->decode * sizeof(double)), total = 0;
        double *share = malloc((size_t)o->decode * sizeof(double));
        /* with the probe: one probe pass after each token over a buffer of at most PAIRED_PROBE_BYTES
         * (far past the caches, small beside a large model's pages), so that each token's bandwidth is
         * set against the machine's at that moment (it moves within seconds on shared machines) */
        const uint64_t pb = r->probe_bytes < PAIRED_PROBE_BYTES ? r->probe_bytes : PAIRED_PROBE_BYTES;
        const int paired = (o->parts & P_PROBE) && !m->be->probe; /* host memory only */
        float *pbuf = paired ? probe_alloc(pb) : NULL;
        if (!dt || !share || (paired && !pbuf)) {
            free(dt), free(share), free(pbuf);
            dfl_seterr("out of memory for benchmark buffers");
            goto done;
        }
        if (pbuf) probe_pass(pbuf, pb); /* warm-up */
        for (int i = 0; i < o->decode; i++) {
            const double t0 = dfl_now();
            if (model_forward(&s, &tok, 1, logits, 1, NULL) != DFL_OK) {
                free(dt), free(share), free(pbuf);
                goto done;
            }
            tok = kn_argmax(logits, V);
            dt[i] = dfl_now() - t0;
            total += dt[i];
            if (pbuf) share[i] = (r->token_bytes / dt[i] / 1e9) / probe_pass(pbuf, pb);
        }
        qsort(dt, (size_t)o->decode, sizeof(double), cmp_double);
        const double med = o->decode % 2 ? dt[o->decode / 2] : 0.5 * (dt[o->decode / 2 - 1] + dt[o->decode / 2]);
        if (pbuf) {
            qsort(share, (size_t)o->decode, sizeof(double), cmp_double);
            r->decode_paired =
                o->decode % 2 ? share[o->decode / 2] : 0.5 * (share[o->decode / 2 - 1] + share[o->decode / 2]);
        }
        free(dt), free(share), free(pbuf);
        s.no_record = 0;
        r->decode_tps = 1.0 / med;
        r->decode_mean_tps = o->decode / total;
        r->decode_gbps = r->decode_tps * r->token_bytes / 1e9;
    }
    /* verify and rollback run on top of the context and the decoded tokens */
    if (o->parts & P_VERIFY) {
        fill_tokens(toks, nv, V, 2);
        r->n_verify = nv;
        int32_t ids[MAX_VERIFY];
        for (int n = 1; n <= nv; n++) {
            const double t = time_verify(&s, toks, n, logits, ids, o->reps);
            if (t < 0) goto done;
            r->verify_ms[n - 1] = 1e3 * t;
            const int n_sparse = config_n_moe_layers(g);
            r->verify_experts[n - 1] = n_sparse ? (double)s.moe_touched / n_sparse : 0;
            r->verify_bytes[n - 1] = forward_bytes(m, s.moe_touched);
        }
        r->verify_logits_ms = 1e3 * time_verify(&s, toks, nv, logits, NULL, o->reps); /* every row's logits */
        if (r->verify_logits_ms < 0) goto done;
    }
    if ((o->parts & P_DRAFT) && ad) {
        double t0 = dfl_now();
        const dfl_feat fv = dfl_feat_view(feat, ctx, nf * H);
        if (dif.add_context(dif.ctx, &fv, ctx_toks, ctx) != DFL_OK) goto done;
        r->draft_ctx_ms = 1e3 * (dfl_now() - t0) / ctx;
        r->draft_block_ms = 1e30;
        for (int i = 0; i < o->reps + 1; i++) { /* the first run warms up */
            t0 = dfl_now();
            if (dif.draft(dif.ctx, toks[0], B, logits) != DFL_OK) goto done;
            const double dt = 1e3 * (dfl_now() - t0);
            if (i > 0 && dt < r->draft_block_ms) r->draft_block_ms = dt;
        }
        r->draft_ids_ms = dif.draft_ids ? 1e30 : 0;
        for (int i = 0; dif.draft_ids && i < o->reps + 1; i++) {
            int32_t ids[DFL_MAX_BLOCK];
            t0 = dfl_now();
            if (dif.draft_ids(dif.ctx, toks[0], B, ids, logits) != DFL_OK) goto done;
            const double dt = 1e3 * (dfl_now() - t0);
            if (i > 0 && dt < r->draft_ids_ms) r->draft_ids_ms = dt;
        }
        if (o->draft_batch > 1 && dif.draft_across && bench_draft_batch(o, &dif, toks[0], ctx, V, r) != DFL_OK)
            goto done;
    }
    if (o->parts & P_ROLLBACK) {
        fill_tokens(toks, B, V, 3);
        if (bench_rollback(&s, toks, B, o->reps, r) != DFL_OK) goto done;
    }
    if (o->parts & P_TREE) {
        fill_tokens(toks, 65, V, 6);
        if (bench_tree(&s, toks, B, o->reps, r) != DFL_OK) goto done;
    }
    if (o->parts & P_PROFILE) {
        /* a drafter's block too, on the context (the draft part added it already) */
        const dfl_feat fv = dfl_feat_view(feat, ctx, nf * H);
        if (ad && !(o->parts & P_DRAFT) && dif.add_context(dif.ctx, &fv, ctx_toks, ctx) != DFL_OK) goto done;
        fill_tokens(toks, nv, V, 7);
        if (bench_profile_run(&s, ad ? &dif : NULL, toks, nv, B, o->reps, &r->prof) != DFL_OK) goto done;
    }
    if (o->parts & P_PREFILL) {
        fill_tokens(toks, o->prefill, V, 4);
        double best = 1e30;
        for (int i = 0; i < o->reps; i++) {
            target_state_reset(&s);
            const double t0 = dfl_now();
            if (model_forward(&s, toks, o->prefill, logits, 1, NULL) != DFL_OK) goto done;
            const double dt = dfl_now() - t0;
            best = dt < best ? dt : best;
        }
        r->prefill_tps = o->prefill / best;
    }
    if (o->parts & P_E2E) {
        const int n_prompt = o->prompt ? o->n_prompt : 64;
        if (o->prompt) memcpy(toks, o->prompt, (size_t)n_prompt * sizeof(int32_t));
        else fill_tokens(toks, n_prompt, V, 5);
        /* random prompts generate all o->gen tokens; a given prompt stops at EOS, as eval does */
        dfl_gen_opts go = {.max_new = o->gen, .block = B, .ignore_eos = !o->prompt};
        dfl_gen_stats st;
        target_state_reset(&s);
        if (spec_generate(&s, NULL, toks, n_prompt, &go, out, &st, NULL, NULL) != DFL_OK) goto done;
        r->ar_tps = (st.generated - 1) / st.t_decode;
        r->e2e_generated = st.generated;
        if (ad) {
            target_state_reset(&s);
            dif.reset(dif.ctx);
            if (spec_generate(&s, &dif, toks, n_prompt, &go, out, &st, NULL, NULL) != DFL_OK) goto done;
            r->spec_tps = (st.generated - 1) / st.t_decode;
            r->spec_tau = spec_tau(&st);
            r->has_spec = 1;
        }
    }
    rc = DFL_OK;
done:
    target_state_free(&s);
    free(toks), free(ctx_toks), free(logits), free(feat), free(out);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    bench_opts o = {.model = DEFAULT_TARGET,
                    .context = 256,
                    .decode = 16,
                    .verify_max = 32,
                    .prefill = 512,
                    .gen = 32,
                    .reps = 2,
                    .draft_batch = 8,
                    .parts = 0x7f | P_PEAK,
                    .block_attn = DFL_BLOCK_ATTN_AUTO};
    const char *drafter = NULL;
    int model_given = 0;
    cli_prompt pr = {0};
    for (int i = 1; i < argc; i++) {
        long v;
        const int pr_rc = cli_prompt_option("bench", &pr, argc, argv, &i);
        if (pr_rc < 0) return 2;
        if (pr_rc > 0) continue;
        const int dev_rc = cli_device_option("bench", argc, argv, &i, &o.device);
        if (dev_rc < 0) return 2;
        if (dev_rc > 0) continue;
        const int attn_rc = cli_block_attn_option("bench", argc, argv, &i, &o.block_attn);
        if (attn_rc < 0) return 2;
        if (attn_rc > 0) continue;
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--model") == 0) {
            o.model = cli_value(argc, argv, &i);
            model_given = 1;
        } else if (strcmp(argv[i], "--drafter") == 0) {
            drafter = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--json") == 0) {
            o.json = 1;
        } else if (strcmp(argv[i], "--isa") == 0) {
            kn_isa isa;
            if (kn_isa_parse(cli_value(argc, argv, &i), &isa) != DFL_OK)
                return cli_usage_error("bench", "--isa: %s", dfl_errmsg());
            if (kn_isa_set(isa) != DFL_OK) return cli_fail("bench", "--isa: %s", dfl_errmsg());
        } else if (strcmp(argv[i], "--act") == 0) {
            kn_act act;
            if (kn_act_parse(cli_value(argc, argv, &i), &act) != DFL_OK)
                return cli_usage_error("bench", "--act: %s", dfl_errmsg());
            if (kn_act_set(act) != DFL_OK) return cli_fail("bench", "--act: %s", dfl_errmsg());
        } else if (strcmp(argv[i], "--parts") == 0) {
            const char *p = cli_value(argc, argv, &i);
            if (!(o.parts = parse_parts(p))) {
                char names[160] = ""; /* the parts, from the table that parses them */
                for (size_t k = 0; k < sizeof part_names / sizeof part_names[0]; k++)
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", part_names[k]);
                return cli_usage_error("bench", "--parts '%s': a comma-separated subset of %s", p, names);
            }
        } else {
            static const struct {
                const char *name;
                long lo, hi;
                size_t off;
            } nums[] = {
                {"--threads", 1, 1024, offsetof(bench_opts, threads)},
                {"--context", 1, 1 << 20, offsetof(bench_opts, context)},
                {"--decode", 1, 1 << 20, offsetof(bench_opts, decode)},
                {"--verify-max", 1, MAX_VERIFY, offsetof(bench_opts, verify_max)},
                {"--prefill", 1, 1 << 20, offsetof(bench_opts, prefill)},
                {"--gen", 2, 1 << 20, offsetof(bench_opts, gen)},
                {"--block", 2, DFL_MAX_BLOCK, offsetof(bench_opts, block)},
                {"--reps", 1, 1000, offsetof(bench_opts, reps)},
                {"--probe-mb", 1, 1 << 20, offsetof(bench_opts, probe_mb)},
                {"--draft-batch", 1, 64, offsetof(bench_opts, draft_batch)},
            };
            size_t k = 0;
            while (k < sizeof nums / sizeof nums[0] && strcmp(argv[i], nums[k].name) != 0) k++;
            if (k == sizeof nums / sizeof nums[0])
                return cli_usage_error("bench", "unknown argument '%s' (see dfl bench --help)", argv[i]);
            if (cli_parse_long("bench", nums[k].name, cli_value(argc, argv, &i), nums[k].lo, nums[k].hi, &v)) return 2;
            *(int *)((char *)&o + nums[k].off) = (int)v;
        }
    }
    o.drafter = drafter ? (strcmp(drafter, "none") == 0 ? NULL : drafter) : (model_given ? NULL : DEFAULT_DRAFTER);
    if (o.threads) omp_set_num_threads(o.threads), kn_team_fix(o.threads); /* a fixed team: no adapting */
    dfl_model m;
    /* no part runs the target: only its embedding and lm_head (the drafter's) are read */
    if (model_open(&m, o.model, (o.parts & P_TARGET) ? CLI_OPEN_FLAGS(o.device) : DFL_OPEN_HEAD_ONLY) != DFL_OK)
        return cli_fail("bench", "%s%s", dfl_errmsg(),
                        model_given ? "" : " (write the benchmark model: .venv/bin/python tools/make_bench_model.py)");
    if (cli_use_device("bench", &m, o.device)) {
        model_close(&m);
        return 1;
    }
    if (o.device != DFL_DEVICE_CPU && (o.parts & (P_PEAK | P_ROLLBACK | P_PROFILE | P_PRODUCTS))) {
        fprintf(stderr, "dfl bench: peak, rollback, profile and products measure the CPU backend: left out on %s%s\n",
                dfl_device_name(o.device), o.parts & P_PROFILE ? " (DFL_CUDA_PROFILE=1 profiles the GPU's ops)" : "");
        o.parts &= ~(unsigned)(P_PEAK | P_ROLLBACK | P_PROFILE | P_PRODUCTS);
    }
    dfl_any_drafter ad;
    int rc = 0;
    if (o.drafter && (o.parts & (P_DRAFT | P_E2E | P_PROFILE))) {
        char warning[1024];
        if (anydrafter_open(&ad, o.drafter, &m, o.model, o.block, 0, warning, sizeof warning) != DFL_OK) {
            model_close(&m);
            return cli_fail("bench", "%s", dfl_errmsg());
        }
        if (warning[0]) fprintf(stderr, "dfl: warning: %s\n", warning);
        if (anydrafter_set_causal(&ad, o.block_attn) != DFL_OK) {
            rc = cli_fail("bench", "%s", dfl_errmsg());
            anydrafter_close(&ad);
            model_close(&m);
            return rc;
        }
        o.ad = &ad;
        o.block = ad.block;
    } else {
        if (o.block_attn != DFL_BLOCK_ATTN_AUTO) {
            model_close(&m);
            return cli_usage_error("bench", "--block-attn needs a drafter and the draft or e2e part");
        }
        o.drafter = NULL;
        if (!o.block) o.block = DEFAULT_BLOCK;
    }
    int32_t *prompt = NULL;
    if (pr.text || pr.file || pr.ids) { /* the e2e prompt */
        dfl_tokenizer *tok = NULL;
        size_t n_prompt = 0;
        rc = cli_prompt_tokens("bench", &pr, o.model, 0, &tok, &prompt, &n_prompt);
        if (tok) tok_close(tok);
        if (rc == 0 && n_prompt == 0) rc = cli_usage_error("bench", "the e2e prompt has no tokens");
        if (rc == 0 && (n_prompt > (size_t)m.cfg.max_position || !(o.parts & P_E2E)))
            rc = cli_usage_error("bench", !(o.parts & P_E2E) ? "a prompt is for the e2e part, which --parts leaves out"
                                                             : "the e2e prompt is longer than the model's context");
        if (rc) {
            free(prompt);
            if (o.ad) anydrafter_close(&ad);
            model_close(&m);
            return rc;
        }
        o.prompt = prompt, o.n_prompt = (int)n_prompt;
    }
    bench_res r = {0};
    if (run_bench(&o, &m, o.ad ? &ad : NULL, &r) != DFL_OK) rc = cli_fail("bench", "%s", dfl_errmsg());
    else if (o.json) print_json(&o, &r, &m);
    else print_table(&o, &r, &m);
    free(prompt);
    if (o.ad) anydrafter_close(&ad);
    model_close(&m);
    return rc;
}
