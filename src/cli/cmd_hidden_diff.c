/* dfl hidden-diff A B: compare two hidden-state dumps layer by layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/safetensors.h"

static const char *usage_text =
    "usage: dfl hidden-diff A.safetensors B.safetensors [--tol X] [--json]\n"
    "\n"
    "Compare two dumps in the `dfl hidden` format (input_ids I32/I64 [T], layer.{k} [T, H], optional\n"
    "logits [T, V]; F32, F16 or BF16). B is the reference. For every tensor present in both:\n"
    "  max_abs   = max |A - B|\n"
    "  rel       = max_abs / max |B|   (relative to the tensor's scale)\n"
    "  first_bad = first position t whose row error max_i |A[t,i] - B[t,i]| exceeds\n"
    "              tol * max_i |B[t,i]|, or -1\n"
    "Exit status 1 if input_ids differ or any tensor has a position beyond tolerance.\n"
    "\n"
    "  --tol X     relative tolerance per position (default 1e-4)\n"
    "  --json      machine-readable output\n"
    "\n"
    "A PyTorch pipeline dumps the same format with:\n"
    "  out = model(ids[None], output_hidden_states=True)\n"
    "  d = {'input_ids': ids.to(torch.int64)}\n"
    "  for k in layers: d[f'layer.{k}'] = out.hidden_states[k + 1][0].float().contiguous()\n"
    "  safetensors.torch.save_file(d, 'ref.safetensors')\n"
    "(hidden_states[k+1] is decoder layer k's output, except the last entry, which transformers\n"
    "returns after the final norm: hook the last decoder layer for it.)\n";

static int read_ids(const st_tensor *t, int64_t *out) {
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == ST_I64) memcpy(&out[i], t->data + i * 8, 8);
        else if (t->dtype == ST_I32) {
            int32_t v;
            memcpy(&v, t->data + i * 4, 4);
            out[i] = v;
        } else {
            return dfl_seterr("input_ids has dtype %s, expected I64 or I32", st_dtype_name(t->dtype));
        }
    }
    return DFL_OK;
}

int cmd_hidden_diff(int argc, char **argv) {
    const char *pa = NULL, *pb = NULL;
    double tol = 1e-4;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--tol") == 0) {
            if (cli_parse_double("hidden-diff", "--tol", cli_value(argc, argv, &i), &tol)) return 2;
            if (tol < 0) return cli_usage_error("hidden-diff", "--tol must be >= 0");
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("hidden-diff", "unknown option '%s'", argv[i]);
        } else if (!pa) pa = argv[i];
        else if (!pb) pb = argv[i];
        else return cli_usage_error("hidden-diff", "unexpected argument '%s'", argv[i]);
    }
    if (!pa || !pb) return cli_usage_error("hidden-diff", "needs two files (see dfl hidden-diff --help)");
    const char *dir = dfl_is_dir(pa) ? pa : dfl_is_dir(pb) ? pb : NULL;
    if (dir) /* what to give instead */
        return cli_usage_error("hidden-diff",
                               "%s is a directory: hidden-diff compares two files, each one dump in "
                               "the `dfl hidden` format (A.safetensors B.safetensors); for directories of saved "
                               "features (dfl eval --save-features) compare a file of each, e.g. %s/<file> "
                               "%s/<file>, with the names manifest.jsonl lists",
                               dir, pa, pb);
    st_checkpoint a = {0}, b = {0};
    if (st_open_file(&a, pa) != DFL_OK) return cli_fail("hidden-diff", "%s", dfl_errmsg());
    if (st_open_file(&b, pb) != DFL_OK) {
        st_close(&a);
        return cli_fail("hidden-diff", "%s", dfl_errmsg());
    }
    int bad = 0, rc = 0, compared = 0;
    const st_tensor *ia = st_find(&a, "input_ids"), *ib = st_find(&b, "input_ids");
    long long ids_first_diff = -1;
    if (ia && ib) {
        int64_t *x = calloc((size_t)ia->numel + 1, 8), *y = calloc((size_t)ib->numel + 1, 8);
        if (read_ids(ia, x) || read_ids(ib, y)) {
            rc = cli_fail("hidden-diff", "%s", dfl_errmsg());
        } else {
            int64_t n = ia->numel < ib->numel ? ia->numel : ib->numel;
            for (int64_t i = 0; i < n && ids_first_diff < 0; i++)
                if (x[i] != y[i]) ids_first_diff = i;
            if (ids_first_diff < 0 && ia->numel != ib->numel) ids_first_diff = n;
        }
        free(x), free(y);
        if (rc) goto done;
        if (ids_first_diff >= 0) bad = 1;
    }
    if (json)
        printf("{\"a\": \"%s\", \"b\": \"%s\", \"tol\": %g, \"input_ids_first_diff\": %lld, \"tensors\": [", pa, pb,
               tol, ids_first_diff);
    else if (ids_first_diff >= 0) printf("input_ids differ first at position %lld\n", ids_first_diff);
    else if (!json) printf("%-16s %8s %12s %12s %10s\n", "tensor", "shape", "max_abs", "rel", "first_bad");
    for (int i = 0; i < a.n_tensors; i++) {
        const st_tensor *ta = &a.tensors[i];
        if (strcmp(ta->name, "input_ids") == 0) continue;
        const st_tensor *tb = st_find(&b, ta->name);
        if (!tb) {
            if (!json) printf("%-16s only in %s\n", ta->name, pa);
            continue;
        }
        if (ta->ndim != 2 || tb->ndim != 2 || ta->shape[0] != tb->shape[0] || ta->shape[1] != tb->shape[1]) {
            rc = cli_fail("hidden-diff", "tensor '%s': shapes differ or are not [T, H] (%s: %dD, %s: %dD)", ta->name,
                          pa, ta->ndim, pb, tb->ndim);
            goto done;
        }
        const int64_t T = ta->shape[0], W = ta->shape[1];
        float *ra = malloc((size_t)W * sizeof(float)), *rb = malloc((size_t)W * sizeof(float));
        double max_abs = 0, max_ref = 0;
        long long first_bad = -1;
        for (int64_t t = 0; t < T; t++) {
            if (st_read_f32(ta, t * W, W, ra) || st_read_f32(tb, t * W, W, rb)) {
                free(ra), free(rb);
                rc = cli_fail("hidden-diff", "%s", dfl_errmsg());
                goto done;
            }
            double row_err = 0, row_ref = 0;
            for (int64_t j = 0; j < W; j++) {
                double d = fabs((double)ra[j] - (double)rb[j]);
                if (!(d <= row_err)) row_err = d; /* NaN propagates as an error */
                if (fabs(rb[j]) > row_ref) row_ref = fabs(rb[j]);
            }
            if (!(row_err <= max_abs)) max_abs = row_err;
            if (row_ref > max_ref) max_ref = row_ref;
            if (first_bad < 0 && !(row_err <= tol * row_ref)) first_bad = t;
        }
        free(ra), free(rb);
        double rel = max_ref > 0 ? max_abs / max_ref : max_abs;
        if (first_bad >= 0) bad = 1;
        compared++;
        if (json)
            printf("%s{\"name\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"max_abs\": %.6g, \"rel\": %.6g, "
                   "\"first_bad\": %lld}",
                   compared > 1 ? ", " : "", ta->name, (long long)T, (long long)W, max_abs, rel, first_bad);
        else
            printf("%-16s %4lldx%-5lld %12.4g %12.4g %10lld\n", ta->name, (long long)T, (long long)W, max_abs, rel,
                   first_bad);
    }
    if (json) printf("], \"compared\": %d, \"ok\": %s}\n", compared, bad || !compared ? "false" : "true");
    else
        printf("%s: %d tensors compared, tolerance %g\n",
               bad        ? "DIFFERENT"
               : compared ? "OK"
                          : "NOTHING COMPARED",
               compared, tol);
    if (!compared) rc = cli_fail("hidden-diff", "no tensor present in both files");
    else rc = bad ? 1 : 0;
done:
    st_close(&a);
    st_close(&b);
    return rc;
}
