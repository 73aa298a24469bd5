/* dfl generate: greedy generation with a target model, streaming text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dfl/any_drafter.h"
#include "dfl/common.h"
#include "dfl/model.h"
#include "dfl/ddtree.h"
#include "dfl/prompt.h"
#include "dfl/safetensors.h"
#include "dfl/spec.h"

static const char *usage_text =
    "usage: dfl generate --target DIR (--prompt STR | --prompt-file F | --prompt-ids IDS)\n"
    "                    [--drafter DIR|mtp|DIR:mtp [--block-size B] [--tree-budget N] [--block-attn MODE]]\n"
    "                    [--temperature X --seed S [--top-p P] [--top-k K] [--accept-rule pq|match]]\n"
    "                    [--max-new N] [--chat MODE] [--tokenizer PATH] [--max-context N] [--ignore-eos]\n"
    "                    [--json] [--dump-drafts F] [--check-weights] [--device cpu|cuda]\n"
    "                    [--weights auto|copy|map]\n"
    "\n"
    "Generate with the target, autoregressively or — with --drafter — by DFlash speculative\n"
    "decoding with chain verification (lossless: the same tokens as without the drafter at\n"
    "temperature 0, the same distribution when sampling). Streams the text to stdout and stops at\n"
    "the model's eos ids (config.json, generation_config.json, tokenizer_config.json) or after\n"
    "--max-new tokens. With --prompt-ids and no tokenizer (no tokenizer.json in the target\n"
    "directory, no --tokenizer) the output is the generated ids instead of text (--json: \"text\": null).\n"
    "\n"
    "  --target DIR        target checkpoint (qwen3, qwen3_5 or qwen3_5_text)\n" CLI_PROMPT_HELP CLI_DEVICE_HELP
    "  --drafter DIR       DFlash drafter checkpoint (z-lab format); 'mtp' = the target's own MTP head\n"
    "                      (its mtp.* tensors), 'DIR:mtp' = the MTP head of checkpoint DIR\n"
    "  --block-size B      verification block (default: the drafter's block_size; 2..block_size);\n"
    "                      with the MTP head B-1 autoregressive steps (default 4, 2..256)\n"
    "  --tree-budget N     0 = chain verification (default); N > 0 = DDTree: verify the N most probable\n"
    "                      draft prefixes as a tree in one forward (greedy only; N <= 256)\n" CLI_BLOCK_ATTN_HELP
    "  --temperature X     0 = greedy (default); > 0 samples (speculative sampling with a drafter)\n"
    "  --seed S            sampling seed (default 0)\n"
    "  --top-p P           with --temperature: sample from the smallest set of most probable tokens\n"
    "                      whose probability reaches P, renormalised; P in (0, 1], 1 = off (default)\n"
    "  --top-k K           with --temperature: sample from the K most probable tokens, renormalised;\n"
    "                      0 = off (default). Both: top-k first, then top-p over what it keeps (as\n"
    "                      vLLM and transformers; Qwen3 recommends T 0.6, top-p 0.95, top-k 20 with\n"
    "                      thinking)\n"
    "  --accept-rule R     temperature > 0 with a drafter: pq = speculative sampling (drafts sampled\n"
    "                      from the drafter, accepted with min(1, p/q); default), match = the\n"
    "                      original DFlash loop (greedy drafts kept while they equal the target's\n"
    "                      sample); both lossless: the output is distributed as sampling the target\n"
    "                      after temperature, top-k and top-p\n"
    "  --max-new N         tokens to generate at most (default 128)\n"
    "  --max-context N     positions to allocate caches for (default prompt + max-new)\n"
    "  --ignore-eos        do not stop at eos ids\n"
    "  --json              print {\"tokens\": [...], \"text\": \"...\", \"stats\": {...}} at the end instead of\n"
    "                      streaming; tokens are the generated ids only. stats: prefill/decode times and\n"
    "                      tokens/s; with a drafter also rounds, drafted, accepted, tau (tokens after the\n"
    "                      first / rounds, as eval's and serve's), tau_accept (1 + accepted / rounds),\n"
    "                      per_position\n"
    "                      (acceptance rate of draft k; null where never proposed), accept_hist,\n"
    "                      acceptance_lengths (a+1 per round), draft_s, verify_s, rollback_s; with a\n"
    "                      DFlash drafter block_attention {mode, effective, source, config,\n"
    "                      sliding_layers, sliding_window, semantics}\n"
    "  --dump-drafts F     write each drafted round r to F (safetensors): draft_logits.{r} F32 [bs-1, V]\n"
    "                      (probabilities when sampling), block_ids.{r} I64 [bs] = the verified block,\n"
    "                      start.{r} = the anchor's position\n"
    "  --check-weights     scan the target's (and drafter's) weights for NaN/Inf at load; without\n"
    "                      it, the first non-finite logits stop the run with an error\n";

/* Per-round record: acceptance lengths for --json, drafts for --dump-drafts. */
typedef struct rounds_log {
    int n, cap, keep_drafts, V, tree_budget;
    int *committed; /* a + 1 per round */
    float **drafts; /* [bs-1, V] per drafted round */
    int64_t **ids;  /* [bs] verified block */
    int64_t *start;
    int *bs;
} rounds_log;

static void on_round(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted) {
    rounds_log *d = ud;
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->committed = realloc(d->committed, (size_t)d->cap * sizeof *d->committed);
        d->drafts = realloc(d->drafts, (size_t)d->cap * sizeof *d->drafts);
        d->ids = realloc(d->ids, (size_t)d->cap * sizeof *d->ids);
        d->start = realloc(d->start, (size_t)d->cap * sizeof *d->start);
        d->bs = realloc(d->bs, (size_t)d->cap * sizeof *d->bs);
    }
    d->committed[d->n] = accepted + 1;
    d->drafts[d->n] = NULL;
    d->ids[d->n] = NULL;
    if (d->keep_drafts && draft) {
        d->V = V;
        d->drafts[d->n] = malloc((size_t)(bs - 1) * V * sizeof(float));
        memcpy(d->drafts[d->n], draft, (size_t)(bs - 1) * V * sizeof(float));
        d->ids[d->n] = malloc((size_t)bs * sizeof(int64_t));
        for (int k = 0; k < bs; k++) d->ids[d->n][k] = block[k];
    }
    d->start[d->n] = start;
    d->bs[d->n] = bs;
    d->n++;
}

static int dump_write(const rounds_log *d, const char *path) {
    st_write_entry *e = calloc((size_t)d->n * 3 + 1, sizeof *e);
    char(*names)[48] = calloc((size_t)d->n * 3 + 1, sizeof *names);
    int ne = 0, r = 0;
    for (int i = 0; i < d->n; i++) {
        if (!d->drafts[i]) continue; /* plain decode steps have no draft */
        snprintf(names[ne], sizeof names[ne], "draft_logits.%d", r);
        e[ne] = (st_write_entry){
            .name = names[ne], .dtype = ST_F32, .ndim = 2, .shape = {d->bs[i] - 1, d->V}, .data = d->drafts[i]};
        ne++;
        snprintf(names[ne], sizeof names[ne], "block_ids.%d", r);
        e[ne] = (st_write_entry){.name = names[ne], .dtype = ST_I64, .ndim = 1, .shape = {d->bs[i]}, .data = d->ids[i]};
        ne++;
        snprintf(names[ne], sizeof names[ne], "start.%d", r);
        e[ne] = (st_write_entry){.name = names[ne], .dtype = ST_I64, .ndim = 1, .shape = {1}, .data = &d->start[i]};
        ne++;
        r++;
    }
    int rc = st_write(path, e, ne);
    free(e);
    free(names);
    return rc;
}

static void rounds_free(rounds_log *d) {
    for (int r = 0; r < d->n; r++) free(d->drafts[r]), free(d->ids[r]);
    free(d->committed), free(d->drafts), free(d->ids), free(d->start), free(d->bs);
}

typedef struct stream {
    const dfl_tokenizer *tok;
    int32_t *ids;
    size_t n, printed;
} stream;

/* Print the not yet printed part of the decoded text, holding back a trailing replacement
 * character that may be an incomplete UTF-8 sequence. Without a tokenizer: the ids, and
 * `printed` counts ids. */
static void stream_flush(stream *st, int final) {
    if (!st->tok) {
        for (; st->printed < st->n; st->printed++) printf("%s%d", st->printed ? " " : "", st->ids[st->printed]);
        fflush(stdout);
        return;
    }
    char *s = prompt_decode(st->tok, st->ids, st->n, NULL);
    if (!s) return;
    size_t len = strlen(s);
    if (!final && len >= 3 && memcmp(s + len - 3, "\xef\xbf\xbd", 3) == 0) len -= 3;
    if (len > st->printed) {
        fwrite(s + st->printed, 1, len - st->printed, stdout);
        fflush(stdout);
        st->printed = len;
    }
    free(s);
}

static int on_tokens(void *ud, const int32_t *toks, int n) {
    stream *st = ud;
    memcpy(st->ids + st->n, toks, (size_t)n * sizeof *toks);
    st->n += (size_t)n;
    stream_flush(st, 0);
    return 0;
}

/* The options of one run, as parsed (block: the drafter's, once one is open). */
typedef struct gen_args {
    const char *target, *dump_path;
    long max_new, max_ctx, block, seed, budget, top_k;
    double temperature, top_p;
    int accept_rule, json, ignore_eos;
} gen_args;

/* Generate from the tokenized prompt with state s (and the drafter's run state dif, when ad is
 * open), print the result, write --dump-drafts. Returns the exit code. */
static int generate_decode(dfl_model *m, dfl_any_drafter *ad, dfl_draft_if *dif, dfl_target_state *s, double t_load,
                           long max_ctx, const gen_args *a, dfl_tokenizer *tok, const int32_t *prompt,
                           size_t n_prompt) {
    const int have_ds = dif != NULL;
    int rc = 0;
    dfl_gen_opts o = {.max_new = (int)a->max_new,
                      .block = (int)a->block,
                      .temperature = (float)a->temperature,
                      .seed = (uint64_t)a->seed,
                      .ignore_eos = a->ignore_eos,
                      .tree_budget = (int)a->budget,
                      .accept_rule = (dfl_accept_rule)a->accept_rule,
                      .top_p = (float)a->top_p,
                      .top_k = (int)a->top_k};
    rounds_log rl = {.keep_drafts = a->dump_path != NULL, .tree_budget = (int)a->budget};
    if (have_ds) o.on_round = on_round, o.on_round_ud = &rl, o.on_round_no_draft = !rl.keep_drafts;
    int32_t *out = malloc((size_t)a->max_new * sizeof(int32_t));
    stream sm = {.tok = tok, .ids = malloc((size_t)a->max_new * sizeof(int32_t))};
    dfl_gen_stats st;
    if (spec_generate(s, dif, prompt, (int)n_prompt, &o, out, &st, a->json ? NULL : on_tokens, &sm) != DFL_OK) {
        rc = cli_fail("generate", "%s", dfl_errmsg());
    } else if (a->json) {
        int unknown = 0;
        char *text = tok ? prompt_decode(tok, out, (size_t)st.generated, &unknown) : NULL;
        printf("{\"tokens\": [");
        for (int i = 0; i < st.generated; i++) printf("%s%d", i ? ", " : "", out[i]);
        printf("], \"text\": ");
        if (tok) cli_json_string(stdout, text ? text : "");
        else printf("null");
        printf(", \"unknown_ids\": %d, ", unknown);
        printf("\"stats\": {");
        spec_stats_json(stdout, &st, have_ds, (int)a->budget, rl.committed, rl.n, t_load, m->weight_bytes,
                        s->bytes + (ad ? anydrafter_state_bytes(ad) : 0), max_ctx);
        if (ad) anydrafter_attn_json(stdout, ad);
        printf("}");
        printf("}\n");
        free(text);
    } else {
        stream_flush(&sm, 1);
        printf("\n");
        fprintf(stderr, "[dfl] %d prompt tokens, %d generated (stop: %s); prefill %.1f tok/s, decode %.1f tok/s",
                st.prompt_tokens, st.generated, st.stop, st.prompt_tokens / (st.t_prefill > 0 ? st.t_prefill : 1e-9),
                (st.generated - 1) / (st.t_decode > 0 ? st.t_decode : 1e-9));
        if (have_ds) {
            fprintf(stderr, "; %d rounds, tau %.2f (block %ld", st.rounds, spec_tau(&st), a->block);
            if (a->budget) fprintf(stderr, ", DDTree budget %ld", a->budget);
            const char *attn = anydrafter_attn_semantics(ad);
            if (attn) fprintf(stderr, "; block attention: %s", attn);
            fprintf(stderr, ")");
        }
        fprintf(stderr, "; weights %.1f MB mmapped, state %.1f MB\n", m->weight_bytes / 1e6, s->bytes / 1e6);
    }
    if (a->dump_path && rc == 0 && dump_write(&rl, a->dump_path) != DFL_OK)
        rc = cli_fail("generate", "%s", dfl_errmsg());
    rounds_free(&rl);
    free(out);
    free(sm.ids);
    return rc;
}

/* Check the context, allocate the target's (and the drafter's) run state and generate.
 * Returns the exit code. */
static int generate_tokens(dfl_model *m, dfl_any_drafter *ad, double t_load, const gen_args *a, dfl_tokenizer *tok,
                           const int32_t *prompt, size_t n_prompt) {
    long max_ctx = a->max_ctx;
    const long max_new = a->max_new, budget = a->budget;
    /* a DDTree round holds its budget of nodes in cache slots past the committed positions */
    if (!max_ctx) max_ctx = (long)n_prompt + max_new + budget;
    if ((long)n_prompt + max_new + budget > max_ctx)
        return cli_fail("generate", "prompt (%zu tokens) + --max-new %ld%s exceeds --max-context %ld", n_prompt,
                        max_new, budget ? " + --tree-budget" : "", max_ctx);
    if (m->cfg.max_position && (long)n_prompt + max_new > m->cfg.max_position)
        return cli_fail("generate", "%ld positions exceed the model's max_position_embeddings %d",
                        (long)n_prompt + max_new, m->cfg.max_position);
    const int chunk = n_prompt < 512 ? (int)n_prompt : 512;
    int max_batch = chunk > a->block ? chunk : (int)a->block;
    if (budget + 1 > max_batch) max_batch = (int)budget + 1;
    /* no forward is longer than the context: a round verifies at most the tokens max_new leaves */
    if (max_batch > max_ctx) max_batch = (int)max_ctx;
    dfl_target_state s;
    if (target_state_init(&s, m, (int)max_ctx, max_batch, ad != NULL) != DFL_OK)
        return cli_fail("generate", "%s", dfl_errmsg());
    int rc;
    dfl_draft_if dif;
    if (budget && target_state_enable_tree(&s, (int)budget + 1) != DFL_OK)
        rc = cli_fail("generate", "%s", dfl_errmsg());
    else if (ad && anydrafter_state_init(ad, m, (int)max_ctx, &dif) != DFL_OK)
        rc = cli_fail("generate", "%s", dfl_errmsg());
    else rc = generate_decode(m, ad, ad ? &dif : NULL, &s, t_load, max_ctx, a, tok, prompt, n_prompt);
    target_state_free(&s);
    return rc;
}

/* Tokenize the prompt (a tokenizer when there is one) and generate. Returns the exit code. */
static int generate_prompt(dfl_model *m, dfl_any_drafter *ad, double t_load, const gen_args *a, cli_prompt *pr) {
    /* ids need no tokenizer; one is opened when there is one, for the text of the output */
    char *tok_file = dfl_path_join(a->target, "tokenizer.json");
    const int have_tok = pr->tokenizer || dfl_is_file(tok_file);
    free(tok_file);
    if (!have_tok && !pr->ids && (pr->text || pr->file))
        return cli_fail("generate",
                        "a text prompt needs a tokenizer: no tokenizer.json in %s (give --tokenizer PATH, "
                        "or the prompt as --prompt-ids)",
                        a->target);
    dfl_tokenizer *tok = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    const int want_tok = !pr->ids || have_tok;
    int rc = cli_prompt_tokens("generate", pr, a->target, want_tok, &tok, &prompt, &n_prompt);
    if (rc == 0) {
        if (!tok && !a->json)
            fprintf(stderr, "[dfl] no tokenizer.json in %s: printing token ids (--tokenizer PATH gives text)\n",
                    a->target);
        rc = generate_tokens(m, ad, t_load, a, tok, prompt, n_prompt);
    }
    free(prompt);
    if (tok) tok_close(tok);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    const char *target = NULL, *drafter_dir = NULL, *dump_path = NULL;
    cli_prompt pr = {0};
    long max_new = 128, max_ctx = 0, block = 0, seed = 0, budget = 0;
    double temperature = 0, top_p = 1;
    long top_k = 0;
    int accept_rule = DFL_ACCEPT_PQ, block_attn = DFL_BLOCK_ATTN_AUTO, filter_given = 0;
    int json = 0, check = 0, ignore_eos = 0;
    dfl_device device = DFL_DEVICE_CPU;
    for (int i = 1; i < argc; i++) {
        int r = cli_prompt_option("generate", &pr, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if ((r = cli_device_option("generate", argc, argv, &i, &device)) != 0 ||
            (r = cli_block_attn_option("generate", argc, argv, &i, &block_attn)) != 0) {
            if (r < 0) return 2;
            continue;
        }
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--target") == 0) {
            target = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--drafter") == 0) {
            drafter_dir = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--block-size") == 0) {
            if (cli_parse_long("generate", "--block-size", cli_value(argc, argv, &i), 1, DFL_MAX_BLOCK, &block))
                return 2;
        } else if (strcmp(argv[i], "--tree-budget") == 0) {
            if (cli_parse_long("generate", "--tree-budget", cli_value(argc, argv, &i), 0, DDTREE_MAX_BUDGET, &budget))
                return 2;
        } else if (strcmp(argv[i], "--temperature") == 0) {
            if (cli_parse_double("generate", "--temperature", cli_value(argc, argv, &i), &temperature)) return 2;
            if (temperature < 0) return cli_usage_error("generate", "--temperature must be >= 0");
        } else if (strcmp(argv[i], "--top-p") == 0) {
            if (cli_parse_double("generate", "--top-p", cli_value(argc, argv, &i), &top_p)) return 2;
            if (!(top_p > 0 && top_p <= 1))
                return cli_usage_error("generate", "--top-p must be in (0, 1], found %g", top_p);
            filter_given = 1;
        } else if (strcmp(argv[i], "--top-k") == 0) {
            if (cli_parse_long("generate", "--top-k", cli_value(argc, argv, &i), 0, 0x7fffffffL, &top_k)) return 2;
            filter_given = 1;
        } else if (strcmp(argv[i], "--accept-rule") == 0) {
            const char *v = cli_value(argc, argv, &i);
            if ((accept_rule = spec_accept_rule_parse(v)) < 0)
                return cli_usage_error("generate", "--accept-rule: expected pq or match, found '%s'", v);
        } else if (strcmp(argv[i], "--seed") == 0) {
            if (cli_parse_long("generate", "--seed", cli_value(argc, argv, &i), 0, 0x7fffffffffffffffL, &seed))
                return 2;
        } else if (strcmp(argv[i], "--max-new") == 0) {
            if (cli_parse_long("generate", "--max-new", cli_value(argc, argv, &i), 1, 1 << 24, &max_new)) return 2;
        } else if (strcmp(argv[i], "--max-context") == 0) {
            if (cli_parse_long("generate", "--max-context", cli_value(argc, argv, &i), 1, 1 << 24, &max_ctx)) return 2;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--dump-drafts") == 0) {
            dump_path = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--check-weights") == 0) {
            check = 1;
        } else if (strcmp(argv[i], "--ignore-eos") == 0) {
            ignore_eos = 1;
        } else {
            return cli_usage_error("generate", "unknown argument '%s' (see dfl generate --help)", argv[i]);
        }
    }
    if (!target) return cli_usage_error("generate", "missing --target DIR");
    if (block && !drafter_dir) return cli_usage_error("generate", "--block-size needs --drafter");
    if (dump_path && !drafter_dir) return cli_usage_error("generate", "--dump-drafts needs --drafter");
    if (budget && !drafter_dir) return cli_usage_error("generate", "--tree-budget needs --drafter");
    if (block_attn != DFL_BLOCK_ATTN_AUTO && !drafter_dir)
        return cli_usage_error("generate", "--block-attn needs --drafter");
    if (budget && temperature > 0)
        return cli_usage_error("generate",
                               "--tree-budget (DDTree) is greedy: it cannot be combined with --temperature");
    /* greedy decoding keeps the argmax, which both filters keep: asked for without sampling, they
     * would change nothing, which is not what the command line says */
    if (filter_given && temperature <= 0)
        return cli_usage_error("generate", "--top-p and --top-k filter sampling: they need --temperature > 0");
    dfl_model m;
    double t0 = dfl_now();
    if (model_open(&m, target, check | CLI_OPEN_FLAGS(device)) != DFL_OK)
        return cli_fail("generate", "%s", dfl_errmsg());
    if (cli_use_device("generate", &m, device)) {
        model_close(&m);
        return 1;
    }
    dfl_any_drafter ad;
    int rc = 0;
    if (drafter_dir) {
        char warning[1024];
        if (anydrafter_open(&ad, drafter_dir, &m, target, (int)block, check, warning, sizeof warning) != DFL_OK) {
            model_close(&m);
            return cli_fail("generate", "%s", dfl_errmsg());
        }
        if (anydrafter_set_causal(&ad, block_attn) != DFL_OK) {
            rc = cli_fail("generate", "%s", dfl_errmsg());
        } else {
            if (warning[0]) fprintf(stderr, "dfl: warning: %s\n", warning);
            block = ad.block;
        }
    }
    if (rc == 0) {
        const double t_load = dfl_now() - t0;
        const gen_args a = {.target = target,
                            .dump_path = dump_path,
                            .max_new = max_new,
                            .max_ctx = max_ctx,
                            .block = block,
                            .seed = seed,
                            .budget = budget,
                            .top_k = top_k,
                            .temperature = temperature,
                            .top_p = top_p,
                            .accept_rule = accept_rule,
                            .json = json,
                            .ignore_eos = ignore_eos};
        rc = generate_prompt(&m, drafter_dir ? &ad : NULL, t_load, &a, &pr);
    }
    if (drafter_dir) anydrafter_close(&ad);
    model_close(&m);
    return rc;
}
