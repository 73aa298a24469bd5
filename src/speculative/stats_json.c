/* dfl generate --json's statistics (spec_stats_json, include/dfl/spec.h), shared by the CLI and
 * the C API's dfl_api_generate so both report the same members. */
#include <stdio.h>

#include "dfl/kernels.h"
#include "dfl/spec.h"

void spec_stats_json(FILE *f, const dfl_gen_stats *st, int drafting, int tree_budget, const int *committed,
                     int n_rounds, double t_load, uint64_t weight_bytes, uint64_t state_bytes, long max_ctx) {
    const int gen = st->generated;
    fprintf(f,
            "\"mode\": \"%s\", \"prompt_tokens\": %d, \"generated_tokens\": %d, \"stop\": \"%s\", "
            "\"load_s\": %.6f, \"prefill_s\": %.6f, \"decode_s\": %.6f, \"prefill_tokens_per_s\": %.3f, "
            "\"decode_tokens_per_s\": %.3f, \"weight_bytes\": %llu, \"state_bytes\": %llu, \"max_context\": %ld",
            drafting ? "speculative" : "autoregressive", st->prompt_tokens, gen, st->stop, t_load, st->t_prefill,
            st->t_decode, st->prompt_tokens / (st->t_prefill > 0 ? st->t_prefill : 1e-9),
            (gen - 1) / (st->t_decode > 0 ? st->t_decode : 1e-9), (unsigned long long)weight_bytes,
            (unsigned long long)state_bytes, max_ctx);
    fprintf(f, ", \"isa\": \"%s\", \"activations\": \"%s\"", kn_isa_name(kn_isa_get()), kn_act_name(kn_act_get()));
    if (drafting) {
        fprintf(f, ", \"accept_rule\": \"%s\"", st->accept_rule);
        fprintf(f,
                ", \"block_size\": %d, \"rounds\": %d, \"drafted\": %ld, \"accepted\": %ld, \"tau\": %.6f, "
                "\"tau_accept\": %.6f, \"draft_s\": %.6f, \"verify_s\": %.6f, \"rollback_s\": %.6f, "
                "\"per_position\": [",
                st->max_block, st->rounds, st->drafted, st->accepted, spec_tau(st), spec_tau_accept(st), st->t_draft,
                st->t_verify, st->t_rollback);
        for (int k = 1; k < st->max_block; k++) { /* null: never proposed (a tree shallower than the block) */
            if (st->pos_drafted[k])
                fprintf(f, "%s%.6f", k > 1 ? ", " : "", (double)st->pos_accepted[k] / st->pos_drafted[k]);
            else fprintf(f, "%snull", k > 1 ? ", " : "");
        }
        fprintf(f, "], \"accept_hist\": [");
        for (int a = 0; a < st->max_block; a++) fprintf(f, "%s%ld", a ? ", " : "", st->accept_hist[a]);
        fprintf(f, "], \"tree_budget\": %d, \"mean_tree_depth\": %.4f, \"acceptance_lengths\": [", tree_budget,
                st->rounds ? (double)st->tree_depth_sum / st->rounds : 0.0);
        for (int r = 0; r < n_rounds; r++) fprintf(f, "%s%d", r ? ", " : "", committed[r]);
        fprintf(f, "]");
    }
}
