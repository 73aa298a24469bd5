/* Training-time metrics on a recorded trajectory (include/dfl/train_metrics.h). */
#include "dfl/train_metrics.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/kernels.h"
#include "dfl/model.h"

/* Softmax with the normalizer summed in double: 1 - (a top-K's mass) is read to small values, and
 * a float sum over a 150k-250k vocabulary is off by ~1e-5 relative. */
static void softmax_d(float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    const double inv = 1.0 / s;
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] * inv);
}

/* ---- the target's distribution ---------------------------------------------------------- */

void tm_target_free(tm_target *tt) {
    free(tt->ids), free(tt->p), free(tt->left);
    memset(tt, 0, sizeof *tt);
}

int tm_target_from_truth(tm_target *tt, const eval_truth *t, int col, const dfl_model *m, int K) {
    memset(tt, 0, sizeof *tt);
    const int H = t->H, V = m->cfg.vocab, first = t->n_prompt - 1, n = t->n;
    if (col < 0 || col >= t->n_layers) return dfl_seterr("target distribution: no feature column %d", col);
    if (first + n > t->n_rows)
        return dfl_seterr("target distribution: %d feature rows, positions up to %d needed", t->n_rows, first + n - 1);
    K = K < V ? K : V;
    tt->K = K, tt->first = first, tt->n = n;
    tt->ids = malloc((size_t)n * K * sizeof *tt->ids);
    tt->p = malloc((size_t)n * K * sizeof *tt->p);
    tt->left = malloc((size_t)n * sizeof *tt->left);
    const int chunk = 16;
    float *xn = malloc((size_t)chunk * H * sizeof(float)), *lg = dfl_alloc((size_t)chunk * V * sizeof(float));
    double *lp = malloc((size_t)K * sizeof(double));
    int rc = DFL_OK;
    if (!tt->ids || !tt->p || !tt->left || !xn || !lg || !lp)
        rc = dfl_seterr("out of memory for the target's distribution");
    for (int q0 = 0; q0 < n && rc == DFL_OK; q0 += chunk) {
        const int c = n - q0 < chunk ? n - q0 : chunk;
        for (int i = 0; i < c; i++) /* the forward's own last step: final norm, then lm_head */
            kn_rmsnorm(xn + (size_t)i * H, t->feat + ((size_t)(first + q0 + i) * t->n_layers + col) * H, m->final_norm,
                       H, m->cfg.rms_eps);
        model_lm_head(m, xn, lg, c);
        for (int i = 0; i < c && rc == DFL_OK; i++) {
            float *row = lg + (size_t)i * V;
            softmax_d(row, V);
            const size_t o = (size_t)(q0 + i) * K;
            if (ddtree_topk(row, 1, V, K, tt->ids + o, lp) != DFL_OK) {
                rc = dfl_seterr("out of memory for the target's top-%d", K);
                break;
            }
            double s = 0;
            for (int j = 0; j < K; j++) tt->p[o + j] = row[tt->ids[o + j]], s += row[tt->ids[o + j]];
            tt->left[q0 + i] = s < 1 ? 1 - s : 0;
        }
    }
    free(xn), free(lg), free(lp);
    if (rc) tm_target_free(tt);
    return rc;
}

/* ---- scoring ------------------------------------------------------------------------------ */

uint64_t tm_hash(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Up to m of the n valid anchors p0 .. p0+n-1, uniformly without replacement, ascending. */
static int sample_anchors(int p0, int n, int m, uint64_t seed, int **out) {
    m = m < n ? m : n;
    int *all = malloc((size_t)(n > 0 ? n : 1) * sizeof *all);
    if (!all) return dfl_seterr("out of memory for anchors");
    for (int i = 0; i < n; i++) all[i] = p0 + i;
    for (int i = 0; i < m; i++) { /* partial Fisher-Yates */
        const int j = i + (int)(splitmix(&seed) % (uint64_t)(n - i));
        const int x = all[i];
        all[i] = all[j], all[j] = x;
    }
    qsort(all, (size_t)m, sizeof *all, cmp_int);
    *out = all;
    return m;
}

/* What one anchor's draft gave: per slot correct (0/1), alpha, and how many slots are supervised. */
typedef struct anchor_res {
    int n_valid, lead;
    uint8_t ok[DFL_MAX_BLOCK];
    double alpha[DFL_MAX_BLOCK], left[DFL_MAX_BLOCK];
    int have_alpha;
} anchor_res;

/* bonus: the round would commit the target's own next token after the drafts (1), or the drafts
 * reached the end of the labels (0: a serving round stops at the eos, no bonus). */
static void counts_add_anchor(tm_counts *c, const anchor_res *a, int bonus) {
    c->anchors++;
    for (int k = 1; k <= a->n_valid; k++) {
        c->valid[k]++;
        c->correct[k] += a->ok[k];
        if (k - 1 <= a->lead) c->cont[k]++;
        if (k <= a->lead) c->reach[k]++;
    }
    c->len_sum += bonus + a->lead;
    if (!a->have_alpha) return;
    c->exp_anchors++;
    double prod = 1, e = 1;
    for (int k = 1; k <= a->n_valid; k++) {
        c->alpha[k] += a->alpha[k], c->left[k] += a->left[k];
        prod *= a->alpha[k], e += prod;
    }
    c->exp_len_sum += e;
}

/* alpha of one slot: the drafter's row (probabilities) against the target's top K at position q. */
static double slot_alpha(const float *pd, const tm_target *tt, int q, double *left) {
    const size_t o = (size_t)(q - tt->first) * tt->K;
    double a = 0;
    for (int j = 0; j < tt->K; j++) {
        const double pt = tt->p[o + j], d = pd[tt->ids[o + j]];
        a += d < pt ? d : pt;
    }
    *left = tt->left[q - tt->first];
    return a;
}

/* One anchor's draft (logits [B-1, V], softmaxed in place when tt is given) against the labels. */
static void score_anchor(const eval_truth *t, int V, const tm_target *tt, int B, int p, float *logits, anchor_res *a) {
    const int T = t->n_prompt + t->n;
    const int32_t *lab = t->ids - t->n_prompt; /* lab[q] = the label at position q >= n_prompt */
    memset(a, 0, sizeof *a);
    a->n_valid = T - 1 - p < B - 1 ? T - 1 - p : B - 1;
    a->have_alpha = tt != NULL;
    int run = 1;
    for (int k = 1; k <= a->n_valid; k++) {
        float *row = logits + (size_t)(k - 1) * V;
        a->ok[k] = kn_argmax(row, V) == lab[p + k];
        if (run && a->ok[k]) a->lead++;
        else run = 0;
        if (tt) {
            softmax_d(row, V);
            a->alpha[k] = slot_alpha(row, tt, p + k - 1, &a->left[k]);
        }
    }
}

/* Blocks per drafter forward: logits of at most 64 MiB, at most 32 blocks. */
static int blocks_per_forward(const dfl_draft_if *dft, int B, int V) {
    if (!dft->draft_many) return 1;
    const long per = (long)(B - 1) * V * (long)sizeof(float), nb = (64L << 20) / per;
    return nb < 1 ? 1 : nb > 32 ? 32 : (int)nb;
}

/* Draft the anchors np + i, i in [i0, i1), in forwards of nb blocks, and score them. */
static int score_all(const eval_truth *t, dfl_draft_if *dft, const int *col, int V, const tm_target *tt, int B, int nb,
                     anchor_res *res, int n_anchor) {
    const int np = t->n_prompt, nd = dft->n_feature_layers;
    const int32_t *lab = t->ids - np;
    float *logits = dfl_alloc((size_t)nb * (B - 1) * V * sizeof(float));
    float *rows = malloc((size_t)B * nd * t->H * sizeof(float));
    int32_t *toks = malloc((size_t)B * sizeof(int32_t)), anchors[32];
    int starts[32], rc = DFL_OK;
    if (!logits || !rows || !toks) rc = dfl_seterr("out of memory for training metrics");
    for (int i0 = 0; i0 < n_anchor && rc == DFL_OK; i0 += nb) {
        const int n = n_anchor - i0 < nb ? n_anchor - i0 : nb, last = np + i0 + n - 1;
        for (int b = 0; b < n; b++) starts[b] = np + i0 + b, anchors[b] = lab[np + i0 + b];
        /* the context must reach the last block's start; each block sees positions < its own */
        rc = eval_replay_grow(dft, t, col, rows, toks, B, last, NULL);
        if (rc == DFL_OK)
            rc = n == 1 && dft->context_len(dft->ctx) == starts[0]
                     ? dft->draft(dft->ctx, anchors[0], B, logits)
                     : dft->draft_many(dft->ctx, anchors, starts, n, B, logits);
        for (int b = 0; b < n && rc == DFL_OK; b++)
            score_anchor(t, V, tt, B, starts[b], logits + (size_t)b * (B - 1) * V, &res[i0 + b]);
    }
    free(logits), free(rows), free(toks);
    return rc;
}

int tm_score(const eval_truth *t, dfl_draft_if *dft, const int *col, int V, const tm_target *tt, const tm_opts *o,
             uint64_t key, tm_unit *u) {
    memset(u, 0, sizeof *u);
    const int B = o->B, np = t->n_prompt, T = np + t->n;
    u->B = B;
    if (B < 2 || B > DFL_MAX_BLOCK)
        return dfl_seterr("training metrics: block size %d outside [2, %d]", B, DFL_MAX_BLOCK);
    if (dft->context_len(dft->ctx) != 0) return dfl_seterr("training metrics: the drafter context is not empty");
    if (tt && (tt->first > np - 1 || tt->first + tt->n < T - 1))
        return dfl_seterr("training metrics: the target's distribution covers positions %d..%d, %d..%d needed",
                          tt->first, tt->first + tt->n - 1, np - 1, T - 2);
    /* anchors p in [np, T-2]: p and p + 1 are labels */
    const int n_anchor = T - 1 - np > 0 ? T - 1 - np : 0;
    u->n_valid = n_anchor;
    anchor_res *res = calloc((size_t)(n_anchor > 0 ? n_anchor : 1), sizeof *res);
    int rc = res ? DFL_OK : dfl_seterr("out of memory for training metrics");
    const double t0 = dfl_now();
    int nb = blocks_per_forward(dft, B, V);
    if (o->blocks > 0 && o->blocks < nb) nb = o->blocks;
    if (rc == DFL_OK) rc = score_all(t, dft, col, V, tt, B, nb, res, n_anchor);
    u->draft_s = dfl_now() - t0, u->drafts = n_anchor;
    if (rc == DFL_OK) {
        for (int i = 0; i < n_anchor; i++) counts_add_anchor(&u->all, &res[i], 1);
        /* the serving walk: a round at p commits its leading run and the bonus token, but for the
         * round whose drafts reach the last label (the eos): the output ends there */
        for (int p = np; p <= T - 2; p += res[p - np].lead + 1)
            counts_add_anchor(&u->walk, &res[p - np], p + res[p - np].lead < T - 1);
        const int m = sample_anchors(np, n_anchor, o->num_anchors, o->seed ^ key, &u->anchors);
        if (m < 0) rc = DFL_ERR;
        else {
            u->n_anchors = m;
            for (int i = 0; i < m; i++) counts_add_anchor(&u->rnd, &res[u->anchors[i] - np], 1);
        }
    }
    free(res);
    if (rc) tm_unit_free(u);
    return rc;
}

void tm_unit_free(tm_unit *u) {
    free(u->anchors);
    u->anchors = NULL, u->n_anchors = 0;
}

/* ---- derived figures ---------------------------------------------------------------------- */

double tm_default_gamma(int B) { return B == 10 ? 5.0 : B == 8 ? 4.0 : 7.0; }

double tm_accuracy(const tm_counts *c, int B) {
    long v = 0, k1 = 0;
    for (int k = 1; k < B; k++) v += c->valid[k], k1 += c->correct[k];
    return v ? (double)k1 / v : 0;
}

double tm_accuracy_weighted(const tm_counts *c, int B, double gamma) {
    double v = 0, ok = 0;
    for (int k = 1; k < B; k++) {
        const double w = exp(-(k - 1) / gamma);
        v += w * c->valid[k], ok += w * c->correct[k];
    }
    return v > 0 ? ok / v : 0;
}

double tm_sim_len(const tm_counts *c) { return c->anchors ? c->len_sum / c->anchors : 0; }

double tm_naive_len(const tm_counts *c, int B) {
    double prod = 1, e = 1;
    for (int k = 1; k < B && c->valid[k]; k++) prod *= (double)c->correct[k] / c->valid[k], e += prod;
    return e;
}

double tm_exp_len(const tm_counts *c) { return c->exp_anchors ? c->exp_len_sum / c->exp_anchors : -1; }

void tm_counts_add(tm_counts *d, const tm_counts *s) {
    d->anchors += s->anchors, d->len_sum += s->len_sum;
    d->exp_anchors += s->exp_anchors, d->exp_len_sum += s->exp_len_sum;
    for (int k = 0; k < DFL_MAX_BLOCK; k++) {
        d->valid[k] += s->valid[k], d->correct[k] += s->correct[k], d->cont[k] += s->cont[k];
        d->reach[k] += s->reach[k], d->alpha[k] += s->alpha[k], d->left[k] += s->left[k];
    }
}

/* ---- train.jsonl lines -------------------------------------------------------------------- */

static void longs(FILE *f, const char *name, const long *v, int B) {
    fprintf(f, ", \"%s\": [", name);
    for (int k = 1; k < B; k++) fprintf(f, "%s%ld", k > 1 ? ", " : "", v[k]);
    fputc(']', f);
}

static void doubles(FILE *f, const char *name, const double *v, int B) {
    fprintf(f, ", \"%s\": [", name);
    for (int k = 1; k < B; k++) fprintf(f, "%s%.17g", k > 1 ? ", " : "", v[k]);
    fputc(']', f);
}

static void counts_write(FILE *f, const char *name, const tm_counts *c, int B) {
    fprintf(f, ", \"%s\": {\"anchors\": %ld, \"len_sum\": %.17g", name, c->anchors, c->len_sum);
    longs(f, "valid", c->valid, B), longs(f, "correct", c->correct, B);
    longs(f, "cont", c->cont, B), longs(f, "reach", c->reach, B);
    if (c->exp_anchors) {
        fprintf(f, ", \"exp_anchors\": %ld, \"exp_len_sum\": %.17g", c->exp_anchors, c->exp_len_sum);
        doubles(f, "alpha", c->alpha, B), doubles(f, "left", c->left, B);
    }
    fputc('}', f);
}

void tm_row_write(FILE *f, const tm_row *r) {
    fputs("{\"prompt_id\": ", f);
    dfl_json_write_string(f, r->prompt_id);
    fprintf(f, ", \"turn\": %d, \"drafter\": ", r->turn);
    dfl_json_write_string(f, r->drafter);
    fprintf(f,
            ", \"labels\": \"%s\", \"features\": \"%s\", \"attn\": \"%s\", \"block_size\": %d, "
            "\"prompt_tokens\": %d, \"tokens\": %d, \"valid_anchors\": %d, \"draft_s\": %.6f, \"drafts\": %ld, "
            "\"random_anchors\": [",
            r->labels, r->features, r->attn, r->B, r->prompt_tokens, r->tokens, r->u.n_valid, r->u.draft_s,
            r->u.drafts);
    for (int i = 0; i < r->u.n_anchors; i++) fprintf(f, "%s%d", i ? ", " : "", r->u.anchors[i]);
    fputc(']', f);
    counts_write(f, "random", &r->u.rnd, r->B);
    counts_write(f, "all", &r->u.all, r->B);
    counts_write(f, "walk", &r->u.walk, r->B);
    fputc('}', f);
}

static int get_str(const cJSON *o, const char *k, char *buf, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) return dfl_seterr("field '%s': expected a string", k);
    snprintf(buf, n, "%s", v->valuestring);
    return DFL_OK;
}

static int get_num(const cJSON *o, const char *k, double *x) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return dfl_seterr("field '%s': expected a number", k);
    *x = v->valuedouble;
    return DFL_OK;
}

static int get_arr(const cJSON *o, const char *k, int B, long *li, double *dd) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != B - 1)
        return dfl_seterr("field '%s': expected an array of %d numbers", k, B - 1);
    int k1 = 1;
    for (const cJSON *x = v->child; x; x = x->next, k1++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0)
            return dfl_seterr("field '%s'[%d]: expected a non-negative number", k, k1 - 1);
        if (li) li[k1] = (long)x->valuedouble;
        else dd[k1] = x->valuedouble;
    }
    return DFL_OK;
}

static int counts_parse(const cJSON *o, const char *name, tm_counts *c, int B) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsObject(x)) return dfl_seterr("field '%s': expected an object", name);
    double a = 0, l = 0;
    if (get_num(x, "anchors", &a) || get_num(x, "len_sum", &l) || get_arr(x, "valid", B, c->valid, NULL) ||
        get_arr(x, "correct", B, c->correct, NULL) || get_arr(x, "cont", B, c->cont, NULL) ||
        get_arr(x, "reach", B, c->reach, NULL))
        return dfl_preperr("'%s'", name);
    c->anchors = (long)a, c->len_sum = l;
    if (cJSON_GetObjectItemCaseSensitive(x, "exp_anchors")) {
        double e = 0, el = 0;
        if (get_num(x, "exp_anchors", &e) || get_num(x, "exp_len_sum", &el) || get_arr(x, "alpha", B, NULL, c->alpha) ||
            get_arr(x, "left", B, NULL, c->left))
            return dfl_preperr("'%s'", name);
        c->exp_anchors = (long)e, c->exp_len_sum = el;
    }
    return DFL_OK;
}

int tm_row_parse(const char *line, tm_row *r) {
    memset(r, 0, sizeof *r);
    cJSON *o = cJSON_Parse(line);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dfl_seterr("not a JSON object");
    }
    double turn = 0, B = 0, np = 0, n = 0, nv = 0;
    int rc = get_str(o, "prompt_id", r->prompt_id, sizeof r->prompt_id);
    if (rc == DFL_OK) rc = get_str(o, "drafter", r->drafter, sizeof r->drafter);
    if (rc == DFL_OK) rc = get_str(o, "labels", r->labels, sizeof r->labels);
    if (rc == DFL_OK) rc = get_str(o, "features", r->features, sizeof r->features);
    if (rc == DFL_OK) rc = get_str(o, "attn", r->attn, sizeof r->attn);
    if (rc == DFL_OK && !(rc = get_num(o, "turn", &turn)) && !(rc = get_num(o, "block_size", &B)) &&
        !(rc = get_num(o, "prompt_tokens", &np)) && !(rc = get_num(o, "tokens", &n)) &&
        !(rc = get_num(o, "valid_anchors", &nv))) {
        if (B < 2 || B > DFL_MAX_BLOCK || B != floor(B))
            rc = dfl_seterr("field 'block_size': %g outside [2, %d]", B, DFL_MAX_BLOCK);
        r->turn = (int)turn, r->B = r->u.B = (int)B, r->prompt_tokens = (int)np, r->tokens = (int)n;
        r->u.n_valid = (int)nv;
    }
    double ds = 0;
    if (rc == DFL_OK && get_num(o, "draft_s", &ds) == DFL_OK) r->u.draft_s = ds;
    if (rc == DFL_OK && get_num(o, "drafts", &ds) == DFL_OK) r->u.drafts = (long)ds;
    dfl_clearerr();
    if (rc == DFL_OK) rc = counts_parse(o, "random", &r->u.rnd, r->B);
    if (rc == DFL_OK) rc = counts_parse(o, "all", &r->u.all, r->B);
    if (rc == DFL_OK) rc = counts_parse(o, "walk", &r->u.walk, r->B);
    cJSON_Delete(o);
    return rc;
}
