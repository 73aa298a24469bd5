/* Fuzz results.jsonl lines as --resume and eval-merge read them (eval_result_parse), and the
 * round trip: a parsed result written back (eval_result_write, output ids included) parses
 * again to the same result (integers and strings equal, times within the 6 decimals written),
 * and writing that gives the same line byte for byte.
 * The same input as a whole results.jsonl (eval_results_read, what --resume reads): what it keeps
 * ends at a newline, and a line appended there (as a resumed run does after cutting the file to
 * good_end) reads back as one more result: a partial last line of any length is never kept (a
 * 1-byte one once was, and the next line was appended to it). */
#include <math.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"
#include "fuzz_util.h"

static char *write_line(const eval_result *r, const int32_t *ids, int n_ids) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    FUZZ_CHECK(f, "open_memstream");
    eval_result_write(f, r, ids, n_ids);
    fclose(f);
    FUZZ_CHECK(strlen(buf) == len && !memchr(buf, '\n', len), "a written result is not one line");
    return buf;
}

static void same_time(double a, double b, const char *what) {
    FUZZ_CHECK(a == b || fabs(a - b) <= 5.01e-7 * (1 + fabs(a)), "%s: %.17g written, %.17g read back", what, a, b);
}

static void check_equal(const eval_result *a, const eval_result *b) {
    FUZZ_CHECK(strcmp(a->prompt_id, b->prompt_id) == 0, "prompt_id '%s' vs '%s'", a->prompt_id, b->prompt_id);
    FUZZ_CHECK(strcmp(a->drafter, b->drafter) == 0, "drafter '%s' vs '%s'", a->drafter, b->drafter);
    FUZZ_CHECK(strcmp(a->mode, b->mode) == 0, "mode '%s' vs '%s'", a->mode, b->mode);
    FUZZ_CHECK(strcmp(a->method, b->method) == 0 && strcmp(a->features, b->features) == 0, "method/features");
    FUZZ_CHECK(a->turn == b->turn && a->tokens == b->tokens && a->rounds == b->rounds && a->drafted == b->drafted &&
                   a->accepted == b->accepted && a->max_block == b->max_block &&
                   a->tree_depth_sum == b->tree_depth_sum && a->match == b->match &&
                   a->first_mismatch == b->first_mismatch && a->tree_nodes == b->tree_nodes,
               "integer fields differ");
    FUZZ_CHECK(memcmp(a->accept_hist, b->accept_hist, sizeof a->accept_hist) == 0, "accept_hist differs");
    FUZZ_CHECK(memcmp(a->pos_drafted, b->pos_drafted, sizeof a->pos_drafted) == 0, "pos_drafted differs");
    FUZZ_CHECK(memcmp(a->pos_accepted, b->pos_accepted, sizeof a->pos_accepted) == 0, "pos_accepted differs");
    same_time(a->time_s, b->time_s, "time_s");
    same_time(a->prefill_s, b->prefill_s, "prefill_s");
    same_time(a->draft_s, b->draft_s, "draft_s");
    same_time(a->verify_s, b->verify_s, "verify_s");
    same_time(a->rollback_s, b->rollback_s, "rollback_s");
    if (a->modeled_s >= 0) same_time(a->modeled_s, b->modeled_s, "modeled_s");
    else FUZZ_CHECK(b->modeled_s < 0, "modeled_s appeared");
    if (a->modeled_ar_s >= 0) same_time(a->modeled_ar_s, b->modeled_ar_s, "modeled_ar_s");
    else FUZZ_CHECK(b->modeled_ar_s < 0, "modeled_ar_s appeared");
}

static const char APPENDED[] =
    "{\"prompt_id\": \"appended\", \"turn\": 0, \"drafter\": \"\", \"mode\": \"ar\", \"tokens\": 2, "
    "\"rounds\": 0, \"drafted\": 0, \"accepted\": 0, \"block_size\": 0, \"time_s\": 0, \"prefill_s\": 0, "
    "\"draft_s\": 0, \"verify_s\": 0, \"rollback_s\": 0, \"tree_depth_sum\": 0, \"match\": null, "
    "\"first_mismatch\": -1, \"accept_hist\": [0], \"pos_drafted\": [], \"pos_accepted\": []}\n";

static void check_file(const uint8_t *data, size_t size) {
    if (size == 0) return;
    FILE *f = fmemopen((void *)data, size, "r");
    FUZZ_CHECK(f, "fmemopen");
    eval_results d;
    dfl_clearerr();
    const int rc = eval_results_read(&d, f, "results.jsonl", 1, -1);
    fclose(f);
    FUZZ_CHECK(rc == DFL_OK || strstr(dfl_errmsg(), "results.jsonl:"), "error without path:line: %s", dfl_errmsg());
    FUZZ_CHECK(d.good_end >= 0 && (size_t)d.good_end <= size, "good_end %ld of %zu bytes", d.good_end, size);
    FUZZ_CHECK(d.good_end == 0 || data[d.good_end - 1] == '\n', "good_end %ld is not after a newline", d.good_end);
    FUZZ_CHECK(d.n >= 0 && (d.n == 0 || (d.r && d.line)), "results");
    for (int i = 1; i < d.n; i++) FUZZ_CHECK(d.line[i] > d.line[i - 1], "line order");
    if (rc == DFL_OK) { /* resumed: cut at good_end, a line appended */
        const size_t n = (size_t)d.good_end, m = sizeof APPENDED - 1;
        char *buf = malloc(n + m);
        FUZZ_CHECK(buf, "malloc");
        memcpy(buf, data, n);
        memcpy(buf + n, APPENDED, m);
        FILE *g = fmemopen(buf, n + m, "r");
        FUZZ_CHECK(g, "fmemopen");
        eval_results e;
        const int rc2 = eval_results_read(&e, g, "results.jsonl", 1, -1);
        fclose(g);
        FUZZ_CHECK(rc2 == DFL_OK && e.n == d.n + 1 && strcmp(e.r[d.n].prompt_id, "appended") == 0 &&
                       e.good_end == (long)(n + m),
                   "the line appended at good_end %ld does not read back (%s): %d of %d results", d.good_end,
                   rc2 == DFL_OK ? "ok" : dfl_errmsg(), e.n, d.n + 1);
        eval_results_free(&e);
        free(buf);
    }
    eval_results_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_file(data, size);
    char *line = fuzz_cstr(data, size);
    eval_result r, r2, r3;
    int32_t *ids = NULL, *ids2 = NULL;
    int n = 0, n2 = 0;
    dfl_clearerr();
    if (eval_result_parse(line, &r, &ids, &n) != DFL_OK) {
        FUZZ_CHECK(dfl_errmsg()[0] != 0, "error without a message");
        free(line);
        return 0;
    }
    FUZZ_CHECK(r.max_block >= 0 && r.max_block <= DFL_MAX_BLOCK, "block_size %d", r.max_block);
    FUZZ_CHECK(n >= 0 && (n == 0 || ids), "ids");
    char *w1 = write_line(&r, ids, n);
    FUZZ_CHECK(eval_result_parse(w1, &r2, &ids2, &n2) == DFL_OK, "a written result does not parse: %s\n%s",
               dfl_errmsg(), w1);
    check_equal(&r, &r2);
    FUZZ_CHECK(n2 == n && (n == 0 || memcmp(ids, ids2, (size_t)n * sizeof *ids) == 0), "output_ids differ");
    char *w2 = write_line(&r2, ids2, n2);
    FUZZ_CHECK(strcmp(w1, w2) == 0, "rewriting changed the line:\n%s\n%s", w1, w2);
    /* without ids: parses too, no ids */
    char *w3 = write_line(&r, NULL, 0);
    int32_t *ids3 = (int32_t *)1;
    int n3 = -1;
    FUZZ_CHECK(eval_result_parse(w3, &r3, &ids3, &n3) == DFL_OK && ids3 == NULL && n3 == 0, "no output_ids");
    free(w1), free(w2), free(w3), free(ids), free(ids2), free(line);
    return 0;
}
