/* Saved truths and features (dfl eval --save-features / --features / --features-from): one
 * safetensors file per prompt and turn in the `dfl hidden` layout (input_ids I64 [T], layer.{k}
 * F32 [T, H]) plus truth_ids I64 [n + n_ext] and the target's identity in __metadata__. */
#include "eval/features.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dfl/common.h"
#include "dfl/safetensors.h"

#define FEATURES_FORMAT "dfl-features-1"

int eval_device_lookup(const char *name) {
    for (int d = 0; d < DFL_DEVICE_COUNT; d++)
        if (strcmp(name, dfl_device_name((dfl_device)d)) == 0) return d;
    return -1;
}

void eval_features_name(int index, int turn, char *buf, size_t n) {
    snprintf(buf, n, "%05d-t%d.safetensors", index, turn);
}

int eval_features_save(const char *path, const eval_truth *t, const eval_features_meta *meta) {
    const int T = t->n_rows, H = t->H, nl = t->n_layers;
    char turn[16], np[16], nt[16], ext[16], mx[16];
    snprintf(turn, sizeof turn, "%d", meta->turn);
    snprintf(np, sizeof np, "%d", t->n_prompt);
    snprintf(nt, sizeof nt, "%d", t->n);
    snprintf(ext, sizeof ext, "%d", t->n_ext);
    snprintf(mx, sizeof mx, "%d", meta->max_new);
    const char *const md[][2] = {
        {"format", FEATURES_FORMAT},
        {"prompt_id", meta->prompt_id},
        {"turn", turn},
        {"prompt_tokens", np},
        {"tokens", nt},
        {"extended", ext},
        {"stop", t->eos_stop ? "eos" : "max_new"},
        {"max_new", mx},
        {"target", meta->target},
        {"target_config_hash", meta->id.config_hash},
        {"target_weights_hash", meta->id.weights_hash},
        {"target_layout", meta->id.layout},
        {"target_dtype", meta->id.dtype},
        {"act", meta->act_bf16 ? "bf16" : "f32"},
        {"device", dfl_device_name((dfl_device)meta->device)}, /* the last: left out on the CPU */
    };
    int64_t *in = malloc((size_t)T * sizeof *in), *truth = malloc((size_t)(t->n + t->n_ext) * sizeof *truth);
    float *per = malloc((size_t)T * nl * H * sizeof *per);
    st_write_entry *e = calloc((size_t)nl + 2, sizeof *e);
    char(*names)[32] = calloc((size_t)nl, sizeof *names);
    int rc = DFL_ERR, ne = 0;
    if (!in || !truth || !per || !e || !names) {
        dfl_seterr("out of memory saving features");
        goto done;
    }
    for (int p = 0; p < T; p++) in[p] = p < t->n_prompt ? t->prompt[p] : t->ids[p - t->n_prompt];
    for (int i = 0; i < t->n + t->n_ext; i++) truth[i] = t->ids[i];
    for (int k = 0; k < nl; k++) /* rows [T][nl][H] -> one [T, H] tensor per layer */
        for (int p = 0; p < T; p++)
            memcpy(per + ((size_t)k * T + p) * H, t->feat + ((size_t)p * nl + k) * H, (size_t)H * sizeof(float));
    e[ne++] = (st_write_entry){.name = "input_ids", .dtype = ST_I64, .ndim = 1, .shape = {T}, .data = in};
    e[ne++] =
        (st_write_entry){.name = "truth_ids", .dtype = ST_I64, .ndim = 1, .shape = {t->n + t->n_ext}, .data = truth};
    for (int k = 0; k < nl; k++) {
        snprintf(names[k], sizeof names[k], "layer.%d", t->layers[k]);
        e[ne++] = (st_write_entry){
            .name = names[k], .dtype = ST_F32, .ndim = 2, .shape = {T, H}, .data = per + (size_t)k * T * H};
    }
    /* written whole, then renamed: an interrupted run never leaves a torn file under the name */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (st_write_meta(tmp, e, ne, md, (int)(sizeof md / sizeof md[0]) - (meta->device == DFL_DEVICE_CPU)) != DFL_OK)
        goto done;
    if (rename(tmp, path) != 0) {
        dfl_seterr("%s: cannot rename into place: %s", path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    rc = DFL_OK;
done:
    free(in), free(truth), free(per), free(e), free(names);
    return rc;
}

static int meta_int(const st_checkpoint *st, const char *path, const char *key, int lo, int hi, int *v) {
    char buf[64];
    if (st_meta_get(st, 0, key, buf, sizeof buf)) return DFL_ERR;
    char *end;
    errno = 0;
    const long x = strtol(buf, &end, 10);
    if (errno || *end || end == buf || x < lo || x > hi)
        return dfl_seterr("%s: __metadata__ %s: expected an integer in [%d, %d], found '%s'", path, key, lo, hi, buf);
    *v = (int)x;
    return DFL_OK;
}

/* "[2, 3, 4]": every dimension of x. */
static const char *shape_of(const st_tensor *x, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < x->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)x->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* An I64 or I32 tensor [n] as int32 ids. */
static int read_ids(const st_tensor *x, const char *path, const char *name, int32_t *out, int n, int vocab) {
    char sh[160];
    if (x->ndim != 1 || x->shape[0] < n || (x->dtype != ST_I64 && x->dtype != ST_I32))
        return dfl_seterr("%s: %s: expected I64 [>= %d], found %s %s", path, name, n, st_dtype_name(x->dtype),
                          shape_of(x, sh, sizeof sh));
    for (int i = 0; i < n; i++) {
        int64_t v;
        if (x->dtype == ST_I64) memcpy(&v, x->data + (size_t)i * 8, 8);
        else {
            int32_t w;
            memcpy(&w, x->data + (size_t)i * 4, 4);
            v = w;
        }
        if (v < 0 || v >= vocab)
            return dfl_seterr("%s: %s[%d] = %lld outside the vocabulary of %d", path, name, i, (long long)v, vocab);
        out[i] = (int32_t)v;
    }
    return DFL_OK;
}

/* layer.{k} [>= rows, H] of each of t's layers into t->feat. */
/* optional: a layer id the file may lack (its columns stay zero, absent[its column] = 1), or -1. */
static int read_layers(const st_checkpoint *st, const char *path, eval_truth *t, int rows, int optional,
                       unsigned char *absent) {
    const int H = t->H, nl = t->n_layers;
    float *f = malloc((size_t)rows * nl * H * sizeof *f);
    if (!f) return dfl_seterr("%s: out of memory for %d feature rows", path, rows);
    for (int k = 0; k < nl; k++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%d", t->layers[k]);
        const st_tensor *x = st_find(st, name);
        if (!x && t->layers[k] == optional) {
            for (int p = 0; p < rows; p++) memset(f + ((size_t)p * nl + k) * H, 0, (size_t)H * sizeof *f);
            absent[k] = 1;
            continue;
        }
        if (!x) {
            free(f);
            return dfl_seterr(
                "%s: no tensor %s: the features hold other layers than the drafter reads (target layer %d)", path, name,
                t->layers[k]);
        }
        if (x->ndim != 2 || x->shape[0] < rows || x->shape[1] != H ||
            (x->dtype != ST_F32 && x->dtype != ST_BF16 && x->dtype != ST_F16)) {
            free(f);
            char sh[160];
            return dfl_seterr("%s: %s: expected F32 [>= %d, %d], found %s %s", path, name, rows, H,
                              st_dtype_name(x->dtype), shape_of(x, sh, sizeof sh));
        }
        for (int p = 0; p < rows; p++) {
            float *row = f + ((size_t)p * nl + k) * H;
            if (st_read_f32(x, (int64_t)p * H, H, row) != DFL_OK) {
                free(f);
                return dfl_preperr("%s: %s", path, name);
            }
            for (int c = 0; c < H; c++)
                if (!isfinite(row[c])) { /* a drafter would fail later, naming neither file nor row */
                    const float v = row[c];
                    free(f);
                    return dfl_seterr("%s: %s position %d column %d is %s: the features hold non-finite "
                                      "values",
                                      path, name, p, c, isnan(v) ? "NaN" : "Inf");
                }
        }
    }
    free(t->feat);
    t->feat = f, t->n_rows = t->cap_rows = rows;
    return DFL_OK;
}

/* The ids and feature rows of a features file whose metadata said np prompt tokens, n output
 * tokens and ext extended ones, into t. */
static int read_sequence(const st_checkpoint *st, const char *path, eval_truth *t, int np, int n, int ext, int eos_stop,
                         int vocab) {
    int rc = DFL_ERR;
    const int rows = np + n - 1;
    int32_t *in = malloc((size_t)rows * sizeof *in), *ids = malloc((size_t)(n + ext) * sizeof *ids);
    const st_tensor *xi = st_find(st, "input_ids"), *xt = st_find(st, "truth_ids");
    if (!in || !ids) dfl_seterr("out of memory");
    else if (!xi || !xt) dfl_seterr("%s: no tensor %s", path, !xi ? "input_ids" : "truth_ids");
    else if (read_ids(xi, path, "input_ids", in, rows, vocab) == DFL_OK &&
             read_ids(xt, path, "truth_ids", ids, n + ext, vocab) == DFL_OK) {
        /* input_ids = the prompt, then every output token but the last */
        int bad = -1;
        for (int p = np; p < rows && bad < 0; p++)
            if (in[p] != ids[p - np]) bad = p;
        if (bad >= 0)
            dfl_seterr("%s: input_ids[%d] = %d but truth_ids[%d] = %d", path, bad, in[bad], bad - np, ids[bad - np]);
        else if (read_layers(st, path, t, rows, -1, NULL) == DFL_OK &&
                 eval_truth_set(t, in, np, ids, n, ext, eos_stop) == DFL_OK)
            rc = DFL_OK;
    }
    free(in), free(ids);
    return rc;
}

int eval_features_load(const char *path, eval_truth *t, eval_features_meta *meta, int vocab) {
    st_checkpoint st = {0};
    if (st_open_file(&st, path) != DFL_OK) return DFL_ERR;
    int rc = DFL_ERR, np = 0, n = 0, ext = 0;
    char fmt[64], stop[16];
    char act[16] = "f32"; /* absent (files written before the mode existed): float32 */
    char dev[16] = "cpu"; /* absent: the CPU */
    memset(meta, 0, sizeof *meta);
    if (st_meta_get(&st, 0, "format", fmt, sizeof fmt)) goto done;
    if (strcmp(fmt, FEATURES_FORMAT) != 0) {
        dfl_seterr("%s: __metadata__ format: expected %s, found '%s'", path, FEATURES_FORMAT, fmt);
        goto done;
    }
    if (meta_int(&st, path, "prompt_tokens", 1, 1 << 24, &np) || meta_int(&st, path, "tokens", 1, 1 << 24, &n) ||
        meta_int(&st, path, "extended", 0, 1 << 24, &ext) || meta_int(&st, path, "turn", 0, 1, &meta->turn) ||
        meta_int(&st, path, "max_new", 1, 1 << 24, &meta->max_new) || st_meta_get(&st, 0, "stop", stop, sizeof stop) ||
        st_meta_get(&st, 0, "prompt_id", meta->prompt_id, sizeof meta->prompt_id) ||
        st_meta_get(&st, 0, "target", meta->target, sizeof meta->target) ||
        st_meta_get(&st, 0, "target_config_hash", meta->id.config_hash, sizeof meta->id.config_hash) ||
        st_meta_get(&st, 0, "target_weights_hash", meta->id.weights_hash, sizeof meta->id.weights_hash) ||
        st_meta_get(&st, 0, "target_layout", meta->id.layout, sizeof meta->id.layout) ||
        st_meta_get(&st, 0, "target_dtype", meta->id.dtype, sizeof meta->id.dtype))
        goto done;
    if (st_meta_get(&st, 0, "act", act, sizeof act) != DFL_OK) snprintf(act, sizeof act, "f32");
    if (strcmp(act, "f32") != 0 && strcmp(act, "bf16") != 0) {
        dfl_seterr("%s: __metadata__ act: expected f32 or bf16, found '%s'", path, act);
        goto done;
    }
    meta->act_bf16 = strcmp(act, "bf16") == 0;
    if (st_meta_get(&st, 0, "device", dev, sizeof dev) != DFL_OK) snprintf(dev, sizeof dev, "cpu");
    if ((meta->device = eval_device_lookup(dev)) < 0) {
        dfl_seterr("%s: __metadata__ device: expected cpu or cuda, found '%s'", path, dev);
        goto done;
    }
    /* the fields must agree with each other: a replay sizes its reads by them */
    if (strcmp(stop, "eos") != 0 && strcmp(stop, "max_new") != 0) {
        dfl_seterr("%s: __metadata__ stop: expected eos or max_new, found '%s'", path, stop);
        goto done;
    }
    if (n > meta->max_new) {
        dfl_seterr("%s: __metadata__ tokens %d exceeds max_new %d", path, n, meta->max_new);
        goto done;
    }
    if (strcmp(stop, "max_new") == 0 && (n != meta->max_new || ext != 0)) {
        dfl_seterr("%s: __metadata__ stop max_new: expected tokens = max_new (%d) and extended 0, found tokens %d, "
                   "extended %d",
                   path, meta->max_new, n, ext);
        goto done;
    }
    if (ext > DFL_MAX_BLOCK) {
        dfl_seterr("%s: __metadata__ extended: expected at most %d (a block past the eos), found %d", path,
                   DFL_MAX_BLOCK, ext);
        goto done;
    }
    rc = read_sequence(&st, path, t, np, n, ext, strcmp(stop, "eos") == 0, vocab);
done:
    st_close(&st);
    return rc;
}

int eval_features_load_pipeline(const char *path, const eval_truth *ref, eval_truth *t, int optional,
                                unsigned char *absent) {
    st_checkpoint st = {0};
    if (st_open_file(&st, path) != DFL_OK) return DFL_ERR;
    const int rows = ref->n_rows;
    int rc = DFL_ERR;
    int32_t *in = malloc((size_t)rows * sizeof *in);
    const st_tensor *xi = st_find(&st, "input_ids");
    if (!in) dfl_seterr("out of memory");
    else if (!xi) dfl_seterr("%s: no tensor input_ids (the token ids the features were computed for)", path);
    else if (xi->ndim != 1 || xi->shape[0] < rows)
        dfl_seterr("%s: input_ids: expected [>= %d] (the prompt and the output but its last token), found %lld ids",
                   path, rows, (long long)(xi->ndim == 1 ? xi->shape[0] : -1));
    else if (read_ids(xi, path, "input_ids", in, rows, 1 << 30) == DFL_OK) {
        int bad = -1;
        for (int p = 0; p < rows && bad < 0; p++) {
            const int32_t want = p < ref->n_prompt ? ref->prompt[p] : ref->ids[p - ref->n_prompt];
            if (in[p] != want) bad = p;
        }
        if (bad >= 0)
            dfl_seterr("%s: input_ids[%d] = %d, but the truth has %d there: the features are for another sequence",
                       path, bad, in[bad], bad < ref->n_prompt ? ref->prompt[bad] : ref->ids[bad - ref->n_prompt]);
        else if (read_layers(&st, path, t, rows, optional, absent) == DFL_OK &&
                 eval_truth_set(t, ref->prompt, ref->n_prompt, ref->ids, ref->n, ref->n_ext, ref->eos_stop) == DFL_OK)
            rc = DFL_OK;
    }
    free(in);
    st_close(&st);
    return rc;
}

int eval_target_id_check(const eval_target_id *want, const eval_target_id *have, const char *what) {
    if (strcmp(want->config_hash, have->config_hash) != 0)
        return dfl_seterr("%s: recorded on a target with config hash %s, this target's config.json hashes to %s "
                          "(another target?)",
                          what, want->config_hash, have->config_hash);
    if (strcmp(want->weights_hash, have->weights_hash) != 0)
        return dfl_seterr("%s: recorded on a target with weights hash %s, this target's is %s (other weights under the "
                          "same config?)",
                          what, want->weights_hash, have->weights_hash);
    if (strcmp(want->dtype, have->dtype) != 0)
        return dfl_seterr("%s: recorded on %s weights, this target has %s", what, want->dtype, have->dtype);
    return DFL_OK;
}
