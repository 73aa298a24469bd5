/* Drafts as the loops read them: the argmax of each row and its top K (include/dfl/draft.h). */
#include "dfl/draft.h"

#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/kernels.h"

int dfl_draft_summarize(const float *logits, int D, int V, float *probs, const dfl_draft_top *out) {
    int bad = 0;
#pragma omp parallel for num_threads(kn_team((size_t)D *V)) schedule(dynamic, 1) reduction(| : bad)
    for (int k = 0; k < D; k++) { /* rows are independent: one per thread */
        const float *l = logits + (size_t)k * V;
        out->argmax[k] = kn_argmax(l, V);
        if (out->K > 0) {
            float *p = probs + (size_t)k * V;
            if (p != l) memcpy(p, l, (size_t)V * sizeof(float));
            kn_softmax(p, V);
            bad |=
                ddtree_topk(p, 1, V, out->K, out->top + (size_t)k * out->K, out->toplp + (size_t)k * out->K) != DFL_OK;
        }
    }
    return bad ? dfl_seterr("out of memory summarizing a draft") : DFL_OK;
}

int dfl_draft_topk(const dfl_draft_if *d, int32_t anchor, int B, int V, const dfl_draft_top *out, float *logits,
                   int want_logits, float *probs) {
    if (out->K < 0 || out->K > V) return dfl_seterr("draft: %d candidates a row, must be in [0, %d]", out->K, V);
    if (d->draft_top) return d->draft_top(d->ctx, anchor, B, out, want_logits ? logits : NULL);
    if (out->K == 0 && !want_logits && d->draft_ids) return d->draft_ids(d->ctx, anchor, B, out->argmax, logits);
    if (d->draft(d->ctx, anchor, B, logits)) return DFL_ERR;
    return dfl_draft_summarize(logits, B - 1, V, probs, out);
}
