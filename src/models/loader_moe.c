/* Binding a sparse MoE block's tensors (the router, the experts per expert or fused, the shared
 * expert): the target's layers and the MTP head's (models/loader.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "models/loader.h"

/* Fused experts: views of expert e into gate_up_proj [E, 2*Ie, H] (gate rows first) and
 * down_proj [E, H, Ie], in place (mapped or placed) unless a tensor sits unaligned in the file. */
static int bind_fused_experts(const dfl_config *g, ld_ctx *c, dfl_layer_w *l, const char *pre) {
    const int E = g->n_experts, H = g->hidden, Ie = g->moe_intermediate;
    char n[1024];
    const st_tensor *t[2];
    const int64_t shapes[2][3] = {{E, 2 * (int64_t)Ie, H}, {E, H, Ie}};
    static const char *const names[2] = {"gate_up_proj", "down_proj"};
    for (int k = 0; k < 2; k++) {
        ld_why(c,
               k ? "num_experts %d, hidden_size %d, moe_intermediate_size %d"
                 : "num_experts %d, 2 x moe_intermediate_size %d (gate | up), hidden_size %d",
               E, k ? H : Ie, k ? Ie : H);
        snprintf(n, sizeof n, "%smlp.experts.%s", pre, names[k]);
        if (!(t[k] = ld_tensor(c, n, 3, shapes[k]))) return DFL_ERR;
        /* views carry no per-block scales: quantized fused experts would read as plain numbers */
        if (t[k]->dtype != ST_F32 && t[k]->dtype != ST_F16 && t[k]->dtype != ST_BF16)
            return dfl_seterr("%s: fused expert tensor '%s' has dtype %s; fused experts are read as F32, F16 or BF16 "
                              "(quantized experts: stored per expert)",
                              c->where, n, st_dtype_name(t[k]->dtype));
    }
    const unsigned char *base[2], *src[2];
    size_t off = 0;
    for (int k = 0; k < 2; k++) {
        if (!(src[k] = ld_data(c, t[k]))) return DFL_ERR;
        off += ((uintptr_t)src[k] % st_dtype_size(t[k]->dtype)) ? (t[k]->nbytes + 63) / 64 * 64 : 0;
    }
    if (off) {
        l->exp_owned = aligned_alloc(64, off);
        if (!l->exp_owned) return dfl_seterr("%s: out of memory copying the experts %smlp.experts.*", c->where, pre);
    }
    off = 0;
    for (int k = 0; k < 2; k++) {
        if ((uintptr_t)src[k] % st_dtype_size(t[k]->dtype)) {
            base[k] = (unsigned char *)l->exp_owned + off;
            memcpy((void *)base[k], src[k], t[k]->nbytes);
            off += (t[k]->nbytes + 63) / 64 * 64;
        } else {
            base[k] = src[k];
        }
    }
    const size_t es0 = st_dtype_size(t[0]->dtype), es1 = st_dtype_size(t[1]->dtype);
    for (int e = 0; e < E; e++) {
        const size_t mat = (size_t)Ie * H;
        l->exp_gate[e] =
            (dfl_mat){.dtype = t[0]->dtype, .data = base[0] + (2 * (size_t)e) * mat * es0, .rows = Ie, .cols = H};
        l->exp_up[e] =
            (dfl_mat){.dtype = t[0]->dtype, .data = base[0] + (2 * (size_t)e + 1) * mat * es0, .rows = Ie, .cols = H};
        l->exp_down[e] =
            (dfl_mat){.dtype = t[1]->dtype, .data = base[1] + (size_t)e * mat * es1, .rows = H, .cols = Ie};
    }
    l->exp_fused = 1;
    return DFL_OK;
}

/* A sparse MoE block under `pre`: router mlp.gate [E, H]; routed experts per expert
 * (mlp.experts.{e}.{gate,up,down}_proj.weight: what save_pretrained writes, and Qwen3-30B-A3B)
 * or fused (mlp.experts.gate_up_proj / down_proj: transformers' parameters, and the released
 * Qwen3.5 MoE checkpoints); the gated shared expert when the config has one. */
int ld_moe(ld_ctx *c, const dfl_config *g, dfl_layer_w *l, const char *pre) {
    const int E = g->n_experts, H = g->hidden, Ie = g->moe_intermediate;
    char n[1024];
    l->moe = 1;
    ld_why(c, "num_experts %d, hidden_size %d", E, H);
    if (ld_mat(c, (snprintf(n, sizeof n, "%smlp.gate.weight", pre), n), E, H, &l->router)) return DFL_ERR;
    l->exp_gate = calloc((size_t)E, sizeof(dfl_mat));
    l->exp_up = calloc((size_t)E, sizeof(dfl_mat));
    l->exp_down = calloc((size_t)E, sizeof(dfl_mat));
    if (!l->exp_gate || !l->exp_up || !l->exp_down) return dfl_seterr("%s: out of memory", c->where);
    snprintf(n, sizeof n, "%smlp.experts.gate_up_proj", pre);
    if (st_find(c->st, n)) {
        if (bind_fused_experts(g, c, l, pre)) return DFL_ERR;
    } else {
#define PER_EXPERT "experts stored per expert: no fused mlp.experts.gate_up_proj"
        for (int e = 0; e < E; e++) {
            char ep[768];
            snprintf(ep, sizeof ep, "%smlp.experts.%d.", pre, e);
            ld_why(c, "moe_intermediate_size %d, hidden_size %d (expert %d of num_experts %d; " PER_EXPERT ")", Ie, H,
                   e, E);
            if (ld_mat(c, (snprintf(n, sizeof n, "%sgate_proj.weight", ep), n), Ie, H, &l->exp_gate[e])) return DFL_ERR;
            ld_why(c, "moe_intermediate_size %d, hidden_size %d (expert %d of num_experts %d; " PER_EXPERT ")", Ie, H,
                   e, E);
            if (ld_mat(c, (snprintf(n, sizeof n, "%sup_proj.weight", ep), n), Ie, H, &l->exp_up[e])) return DFL_ERR;
            ld_why(c, "hidden_size %d, moe_intermediate_size %d (expert %d of num_experts %d; " PER_EXPERT ")", H, Ie,
                   e, E);
            if (ld_mat(c, (snprintf(n, sizeof n, "%sdown_proj.weight", ep), n), H, Ie, &l->exp_down[e])) return DFL_ERR;
        }
#undef PER_EXPERT
    }
    if (g->shared_intermediate > 0) {
        const int Is = g->shared_intermediate;
        char sp[768];
        snprintf(sp, sizeof sp, "%smlp.shared_expert.", pre);
        ld_why(c, "shared_expert_intermediate_size %d, hidden_size %d", Is, H);
        if (ld_mat(c, (snprintf(n, sizeof n, "%sgate_proj.weight", sp), n), Is, H, &l->sh_gate)) return DFL_ERR;
        ld_why(c, "shared_expert_intermediate_size %d, hidden_size %d", Is, H);
        if (ld_mat(c, (snprintf(n, sizeof n, "%sup_proj.weight", sp), n), Is, H, &l->sh_up)) return DFL_ERR;
        ld_why(c, "hidden_size %d, shared_expert_intermediate_size %d", H, Is);
        if (ld_mat(c, (snprintf(n, sizeof n, "%sdown_proj.weight", sp), n), H, Is, &l->sh_down)) return DFL_ERR;
        ld_why(c, "1, hidden_size %d", H);
        if (ld_mat(c, (snprintf(n, sizeof n, "%smlp.shared_expert_gate.weight", pre), n), 1, H, &l->sh_score))
            return DFL_ERR;
    }
    return DFL_OK;
}
