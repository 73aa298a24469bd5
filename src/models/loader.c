/* Checkpoint loading shared by targets and drafters: tensor lookup with dtype and shape
 * checks, alignment-safe views, small vectors converted to float32, the optional NaN/Inf scan. */
#include "models/loader.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"

static const char *file_of(const ld_ctx *c, const st_tensor *t) { return c->st->files[t->file_index].path; }

static int check_dtype(const ld_ctx *c, const st_tensor *t) {
    if (t->dtype == ST_F8_E4M3 && !(c->quant && c->quant->present))
        return dfl_seterr("%s: tensor '%s' has dtype F8_E4M3 but %s; supported without one: F32, F16, BF16",
                          file_of(c, t), t->name,
                          c->quant ? "config.json has no quantization_config (FP8 weights need quant_method \"fp8\" "
                                     "with a weight_block_size, and a weight_scale_inv beside each weight)"
                                   : "dfl reads FP8 weights in target models only");
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16 && t->dtype != ST_F8_E4M3)
        return dfl_seterr("%s: tensor '%s' has dtype %s; supported: F32, F16, BF16%s", file_of(c, t), t->name,
                          st_dtype_name(t->dtype),
                          t->dtype == ST_F8_E5M2 || t->dtype == ST_I8 || t->dtype == ST_U8
                              ? " (a quantized checkpoint? dfl loads unquantized weights and fine-grained FP8 "
                                "(F8_E4M3): use the BF16 or FP8 release)"
                              : "");
    return DFL_OK;
}

static void shape_str(const int64_t *shape, int nd, char *buf, size_t len) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (int i = 0; i < nd && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

void ld_why(ld_ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
}

/* " (DIR/config.json: num_hidden_layers 4, layer 3; hidden_size 64)" or "" */
static const char *provenance(const ld_ctx *c, int missing, char *buf, size_t len) {
    char layer[96] = "";
    if (missing && c->layer >= 0)
        snprintf(layer, sizeof layer, "num_hidden_layers %d, layer %d%s", c->n_layers, c->layer, c->why[0] ? "; " : "");
    if (!layer[0] && !c->why[0]) return "";
    snprintf(buf, len, " (%s/config.json: %s%s)", c->where, layer, c->why);
    return buf;
}

/* Count the NaN and Inf values of t; record the tensor in c->bad when there are any. */
static int scan_tensor(ld_ctx *c, const st_tensor *t) {
    enum { CHUNK = 16384 };
    float *buf = malloc(CHUNK * sizeof(float));
    if (!buf) return dfl_seterr("%s: out of memory checking '%s'", c->where, t->name);
    int64_t nan = 0, inf = 0, first = -1;
    for (int64_t i0 = 0; i0 < t->numel; i0 += CHUNK) {
        const int64_t n = t->numel - i0 < CHUNK ? t->numel - i0 : CHUNK;
        st_read_f32(t, i0, n, buf);
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(buf[i])) {
                if (first < 0) first = i0 + i;
                if (isnan(buf[i])) nan++;
                else inf++;
            }
    }
    free(buf);
    if (first < 0) return DFL_OK;
    char pos[96] = "";
    if (t->ndim == 2)
        snprintf(pos, sizeof pos, " (row %lld, column %lld)", (long long)(first / t->shape[1]),
                 (long long)(first % t->shape[1]));
    char one[768];
    snprintf(one, sizeof one,
             "%s'%s': %lld non-finite value%s (%lld NaN, %lld Inf) of %lld, first at element %lld%s, in %s",
             c->n_bad ? "; " : "", t->name, (long long)(nan + inf), nan + inf == 1 ? "" : "s", (long long)nan,
             (long long)inf, (long long)t->numel, (long long)first, pos, file_of(c, t));
    c->n_bad++;
    const size_t len = strlen(one), room = sizeof c->bad - c->bad_len;
    if (len < room - 32) {
        memcpy(c->bad + c->bad_len, one, len + 1);
        c->bad_len += len;
    } else if (room > 8 && !strstr(c->bad, "; ...")) {
        memcpy(c->bad + c->bad_len, "; ...", 6);
        c->bad_len += 5;
    }
    return DFL_OK;
}

const st_tensor *ld_tensor(ld_ctx *c, const char *name, int nd, const int64_t *shape) {
    char want[128], prov[512];
    shape_str(shape, nd, want, sizeof want);
    const st_tensor *t = st_find(c->st, name);
    if (!t) {
        dfl_seterr("%s: missing tensor '%s' (expected shape %s)%s", c->where, name, want,
                   provenance(c, 1, prov, sizeof prov));
        return NULL;
    }
    int ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[128];
        shape_str(t->shape, t->ndim, got, sizeof got);
        dfl_seterr("%s: tensor '%s' has shape %s, expected %s%s", file_of(c, t), name, got, want,
                   provenance(c, 0, prov, sizeof prov));
        return NULL;
    }
    c->why[0] = 0;
    if (check_dtype(c, t) != DFL_OK) return NULL;
    if (c->used) c->used[t - c->st->tensors] = 1;
    if (c->check_weights && scan_tensor(c, t) != DFL_OK) return NULL;
    return t;
}

int ld_finish(ld_ctx *c) {
    if (!c->n_bad) return DFL_OK;
    return dfl_seterr("%s: --check-weights: %d tensor%s hold%s non-finite values: %s", c->where, c->n_bad,
                      c->n_bad == 1 ? "" : "s", c->n_bad == 1 ? "s" : "", c->bad);
}

/* The block scales of F8_E4M3 weight t (named `<module>.weight`) into out->scale. */
static int bind_scales(ld_ctx *c, const st_tensor *t, dfl_mat *out) {
    const dfl_quant *q = c->quant;
    const size_t len = strlen(t->name);
    if (len < 7 || strcmp(t->name + len - 7, ".weight") != 0)
        return dfl_seterr("%s: F8_E4M3 tensor '%s' is not named <module>.weight, so it has no weight_scale_inv",
                          file_of(c, t), t->name);
    char module[512], sname[540];
    snprintf(module, sizeof module, "%.*s", (int)(len - 7), t->name);
    if (quant_module_excluded(q, module))
        return dfl_seterr("%s: tensor '%s' has dtype F8_E4M3 but %s/config.json lists module '%s' in "
                          "quantization_config.modules_to_not_convert",
                          file_of(c, t), t->name, c->where, module);
    snprintf(sname, sizeof sname, "%s_scale_inv", t->name);
    const int64_t srows = ((int64_t)out->rows + q->block_rows - 1) / q->block_rows;
    const int64_t scols = ((int64_t)out->cols + q->block_cols - 1) / q->block_cols;
    char why[256];
    snprintf(why, sizeof why,
             "the block scales of F8_E4M3 '%s' [%d, %d]: ceil(%d / %d), ceil(%d / %d) with %s/config.json "
             "quantization_config.weight_block_size [%d, %d]",
             t->name, out->rows, out->cols, out->rows, q->block_rows, out->cols, q->block_cols, c->where, q->block_rows,
             q->block_cols);
    const st_tensor *s = st_find(c->st, sname);
    if (!s)
        return dfl_seterr("%s: missing tensor '%s' (expected shape [%lld, %lld], F32 or BF16: %s)", c->where, sname,
                          (long long)srows, (long long)scols, why);
    if (s->ndim != 2 || s->shape[0] != srows || s->shape[1] != scols) {
        char got[128];
        shape_str(s->shape, s->ndim, got, sizeof got);
        return dfl_seterr("%s: tensor '%s' has shape %s, expected [%lld, %lld] (%s)", file_of(c, s), sname, got,
                          (long long)srows, (long long)scols, why);
    }
    if (s->dtype != ST_F32 && s->dtype != ST_BF16 && s->dtype != ST_F16)
        return dfl_seterr("%s: tensor '%s' has dtype %s; expected F32, BF16 or F16 (%s)", file_of(c, s), sname,
                          st_dtype_name(s->dtype), why);
    if (c->used) c->used[s - c->st->tensors] = 1;
    if (c->check_weights && scan_tensor(c, s) != DFL_OK) return DFL_ERR;
    float *scale = malloc((size_t)s->numel * sizeof(float));
    if (!scale) return dfl_seterr("%s: out of memory reading '%s'", c->where, sname);
    st_read_f32(s, 0, s->numel, scale);
    /* a multiplier is finite and not negative (a block of zeros may have 0): a sign-flipped or
     * infinite one turns every weight of its block into garbage that no NaN scan sees */
    for (int64_t i = 0; i < s->numel; i++)
        if (!(scale[i] >= 0.0f && scale[i] <= 3.4028235e38f)) {
            const float v = scale[i];
            free(scale);
            return dfl_seterr("%s: tensor '%s' block [%lld, %lld] holds %g; expected a finite multiplier >= 0 (%s)",
                              file_of(c, s), sname, (long long)(i / scols), (long long)(i % scols), (double)v, why);
        }
    out->owned = scale;
    out->scale = scale;
    out->brow = q->block_rows;
    out->bcol = q->block_cols;
    return DFL_OK;
}

const uint8_t *ld_data(ld_ctx *c, const st_tensor *t) { return c->place ? st_place_tensor(c->st, t) : t->data; }

int ld_mat(ld_ctx *c, const char *name, int rows, int cols, dfl_mat *out) {
    const int64_t shape[2] = {rows, cols};
    const st_tensor *t = ld_tensor(c, name, 2, shape);
    if (!t) return DFL_ERR;
    *out = (dfl_mat){.dtype = t->dtype, .rows = rows, .cols = cols};
    if (!(out->data = ld_data(c, t))) return DFL_ERR;
    if (t->dtype == ST_F8_E4M3) return bind_scales(c, t, out); /* one byte per element: always aligned */
    size_t es = st_dtype_size(t->dtype);
    if (((uintptr_t)out->data % es) != 0) { /* unaligned in the file: private aligned copy */
        out->owned = aligned_alloc(64, (t->nbytes + 63) / 64 * 64);
        if (!out->owned) return dfl_seterr("%s: out of memory copying '%s'", c->where, name);
        memcpy(out->owned, t->data, t->nbytes);
        out->data = out->owned;
    }
    return DFL_OK;
}

float *ld_vec(ld_ctx *c, const char *name, int nd, const int64_t *shape, float add) {
    const st_tensor *t = ld_tensor(c, name, nd, shape);
    if (!t) return NULL;
    if (t->dtype == ST_F8_E4M3) {
        dfl_seterr("%s: tensor '%s' has dtype F8_E4M3; FP8 checkpoints quantize linear weights only (norms, "
                   "conv1d, A_log, dt_bias stay F32, F16 or BF16)",
                   file_of(c, t), name);
        return NULL;
    }
    float *v = malloc((size_t)t->numel * sizeof(float) + 1);
    if (!v) {
        dfl_seterr("%s: out of memory reading '%s'", c->where, name);
        return NULL;
    }
    st_read_f32(t, 0, t->numel, v);
    for (int64_t i = 0; i < t->numel; i++) v[i] += add;
    return v;
}

float *ld_vec1(ld_ctx *c, const char *name, int n, float add) {
    const int64_t shape[1] = {n};
    return ld_vec(c, name, 1, shape, add);
}

void ld_mat_free(dfl_mat *m) {
    free(m->owned);
    m->owned = NULL;
    m->scale = NULL;
}

int ld_attention(ld_ctx *c, const char *pre, int H, int n_heads, int n_kv, int hd, int gated, float norm_add,
                 ld_attn out) {
    char n[512];
#define ANAME(s) (snprintf(n, sizeof n, "%sself_attn." s ".weight", pre), n)
    ld_why(c, "%snum_attention_heads %d x head_dim %d%s, hidden_size %d", gated ? "2 x " : "", n_heads, hd,
           gated ? " (query and output gate)" : "", H);
    if (ld_mat(c, ANAME("q_proj"), n_heads * hd * (gated ? 2 : 1), H, out.q)) return DFL_ERR;
    ld_why(c, "num_key_value_heads %d x head_dim %d, hidden_size %d", n_kv, hd, H);
    if (ld_mat(c, ANAME("k_proj"), n_kv * hd, H, out.k)) return DFL_ERR;
    ld_why(c, "num_key_value_heads %d x head_dim %d, hidden_size %d", n_kv, hd, H);
    if (ld_mat(c, ANAME("v_proj"), n_kv * hd, H, out.v)) return DFL_ERR;
    ld_why(c, "hidden_size %d, num_attention_heads %d x head_dim %d", H, n_heads, hd);
    if (ld_mat(c, ANAME("o_proj"), H, n_heads * hd, out.o)) return DFL_ERR;
    ld_why(c, "head_dim %d", hd);
    if (!(*out.q_norm = ld_vec1(c, ANAME("q_norm"), hd, norm_add))) return DFL_ERR;
    ld_why(c, "head_dim %d", hd);
    if (!(*out.k_norm = ld_vec1(c, ANAME("k_norm"), hd, norm_add))) return DFL_ERR;
#undef ANAME
    return DFL_OK;
}

int ld_mlp(ld_ctx *c, const char *pre, int H, int I, dfl_mat *gate, dfl_mat *up, dfl_mat *down) {
    char n[512];
    ld_why(c, "intermediate_size %d, hidden_size %d", I, H);
    if (ld_mat(c, (snprintf(n, sizeof n, "%smlp.gate_proj.weight", pre), n), I, H, gate)) return DFL_ERR;
    ld_why(c, "intermediate_size %d, hidden_size %d", I, H);
    if (ld_mat(c, (snprintf(n, sizeof n, "%smlp.up_proj.weight", pre), n), I, H, up)) return DFL_ERR;
    ld_why(c, "hidden_size %d, intermediate_size %d", H, I);
    return ld_mat(c, (snprintf(n, sizeof n, "%smlp.down_proj.weight", pre), n), H, I, down);
}

void ld_layer_free(dfl_layer_w *l, int n_experts) {
    free(l->input_norm), free(l->post_norm), free(l->q_norm), free(l->k_norm);
    free(l->conv_w), free(l->neg_exp_A), free(l->dt_bias), free(l->gnorm);
    dfl_mat *mats[] = {&l->q_proj, &l->k_proj,  &l->v_proj,   &l->o_proj,  &l->in_qkv,  &l->in_z,
                       &l->in_b,   &l->in_a,    &l->out_proj, &l->gate,    &l->up,      &l->down,
                       &l->router, &l->sh_gate, &l->sh_up,    &l->sh_down, &l->sh_score};
    for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) ld_mat_free(mats[k]);
    for (int e = 0; l->exp_gate && l->exp_up && l->exp_down && e < n_experts; e++)
        ld_mat_free(&l->exp_gate[e]), ld_mat_free(&l->exp_up[e]), ld_mat_free(&l->exp_down[e]);
    free(l->exp_gate), free(l->exp_up), free(l->exp_down), free(l->exp_owned);
    memset(l, 0, sizeof *l);
}
