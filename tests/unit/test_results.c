/* results.jsonl lines (eval_result_write / eval_result_parse, what --resume and eval-merge read):
 * round trip, and the inputs tests/fuzz/fuzz_results found mishandled: out-of-range numbers were
 * cast to int/long (undefined behaviour), inf and nan were read and written back as non-JSON, a
 * mode or method with a quote was written unescaped, and arrays longer than block_size were read
 * but not written back. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"
#include "testutil.h"

/* A chain-mode line as eval writes it, with the field `key` given `value` (NULL: as is). */
static const char *const FIELDS[][2] = {
    {"prompt_id", "\"7\""},
    {"turn", "0"},
    {"drafter", "\"d\""},
    {"mode", "\"chain\""},
    {"tokens", "9"},
    {"rounds", "3"},
    {"drafted", "9"},
    {"accepted", "5"},
    {"block_size", "4"},
    {"time_s", "0.5"},
    {"prefill_s", "0.1"},
    {"draft_s", "0.2"},
    {"verify_s", "0.2"},
    {"rollback_s", "0"},
    {"tree_depth_sum", "0"},
    {"match", "true"},
    {"first_mismatch", "-1"},
    {"method", "\"replay\""},
    {"features", "\"dfl\""},
    {"tree_nodes", "0"},
    {"modeled_s", "0.25"},
    {"accept_hist", "[1, 1, 0, 1]"},
    {"pos_drafted", "[3, 3, 3]"},
    {"pos_accepted", "[2, 2, 1]"},
    {"output_ids", "[1, 2, 3]"},
};

static const char *line_with(const char *key, const char *value) {
    static char buf[2048];
    size_t o = 0;
    for (size_t i = 0; i < sizeof FIELDS / sizeof *FIELDS; i++) {
        const char *v = key && strcmp(key, FIELDS[i][0]) == 0 ? value : FIELDS[i][1];
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\"%s\": %s", i ? ", " : "{", FIELDS[i][0], v);
    }
    snprintf(buf + o, sizeof buf - o, "}");
    return buf;
}

static char *written(const eval_result *r, const int32_t *ids, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    eval_result_write(f, r, ids, n);
    fclose(f);
    return buf;
}

static void refused(const char *line, const char *needle) {
    eval_result r;
    int32_t *ids = NULL;
    int n = 0;
    dfl_clearerr();
    int rc = eval_result_parse(line, &r, &ids, &n);
    CHECK(rc == DFL_ERR && strstr(dfl_errmsg(), needle) && ids == NULL, "%s: expected an error with '%s', got %s", line,
          needle, rc == DFL_OK ? "success" : dfl_errmsg());
    free(ids);
}

int main(void) {
    eval_result r, r2;
    int32_t *ids = NULL, *ids2 = NULL;
    int n = 0, n2 = 0;
    /* a line as eval writes it parses, and writes back to the same line */
    CHECK(eval_result_parse(line_with(NULL, NULL), &r, &ids, &n) == DFL_OK && n == 3 && ids[2] == 3 &&
              r.max_block == 4 && r.pos_accepted[3] == 1 && r.accept_hist[3] == 1 && r.modeled_s == 0.25 &&
              r.modeled_ar_s < 0,
          "parse: %s", dfl_errmsg());
    char *w = written(&r, ids, n);
    CHECK(eval_result_parse(w, &r2, &ids2, &n2) == DFL_OK, "written line parses: %s", dfl_errmsg());
    char *w2 = written(&r2, ids2, n2);
    CHECK(strcmp(w, w2) == 0, "round trip:\n%s\n%s", w, w2);
    free(w), free(w2), free(ids), free(ids2);

    /* strings with quotes and backslashes in every string field are written as JSON strings */
    eval_result_init(&r);
    snprintf(r.prompt_id, sizeof r.prompt_id, "p\"1\\");
    snprintf(r.drafter, sizeof r.drafter, "dr\"after");
    snprintf(r.mode, sizeof r.mode, "cha\"in\\");
    snprintf(r.method, sizeof r.method, "re\"play");
    snprintf(r.features, sizeof r.features, "x\\\"y");
    r.max_block = 2;
    w = written(&r, NULL, 0);
    CHECK(eval_result_parse(w, &r2, NULL, NULL) == DFL_OK && strcmp(r2.mode, r.mode) == 0 &&
              strcmp(r2.method, r.method) == 0 && strcmp(r2.features, r.features) == 0 &&
              strcmp(r2.prompt_id, r.prompt_id) == 0,
          "quoted strings: %s: %s", dfl_errmsg(), w);
    free(w);

    /* --repeat's "rep": written only for repetitions, read back; absent = 0; range checked */
    eval_result_init(&r);
    r.rep = 2, r.max_block = 2;
    w = written(&r, NULL, 0);
    CHECK(strstr(w, "\"rep\": 2") && eval_result_parse(w, &r2, NULL, NULL) == DFL_OK && r2.rep == 2,
          "rep round trip: %s: %s", dfl_errmsg(), w);
    free(w);
    r.rep = 0;
    w = written(&r, NULL, 0);
    CHECK(!strstr(w, "\"rep\"") && eval_result_parse(w, &r2, NULL, NULL) == DFL_OK && r2.rep == 0,
          "the first run has no rep field: %s", w);
    free(w);
    refused(line_with("turn", "0, \"rep\": -1"), "field 'rep'");
    refused(line_with("turn", "0, \"rep\": 100"), "field 'rep'");
    refused(line_with("turn", "0, \"rep\": 1.5"), "field 'rep'");

    /* "act": written only for bf16 activations, read back; absent = f32; a line of the other mode
     * than the running one fails eval_result_act_check, naming where it came from */
    eval_result_init(&r);
    CHECK(r.act_bf16 == 0, "a new result has f32 activations");
    r.act_bf16 = 1, r.max_block = 2;
    w = written(&r, NULL, 0);
    CHECK(strstr(w, "\"act\": \"bf16\"") && eval_result_parse(w, &r2, NULL, NULL) == DFL_OK && r2.act_bf16 == 1,
          "act round trip: %s: %s", dfl_errmsg(), w);
    CHECK(eval_result_act_check(&r2, 0, "f.jsonl:3") == DFL_ERR && strstr(dfl_errmsg(), "f.jsonl:3") &&
              strstr(dfl_errmsg(), "bf16"),
          "a bf16 line in an f32 process is refused: %s", dfl_errmsg());
    free(w);
    r.act_bf16 = 0;
    w = written(&r, NULL, 0);
    CHECK(!strstr(w, "\"act\"") && eval_result_parse(w, &r2, NULL, NULL) == DFL_OK && r2.act_bf16 == 0 &&
              eval_result_act_check(&r2, 0, "x") == DFL_OK,
          "f32 lines have no act field: %s", w);
    free(w);
    refused(line_with("turn", "0, \"act\": \"fp8\""), "field act");
    refused(line_with("turn", "0, \"act\": 1"), "field act");

    /* "device": written only off the CPU (--device cuda), read back whether or not this build has
     * that device; absent = cpu; a line of another device fails eval_result_device_check */
    eval_result_init(&r);
    CHECK(r.device == 0, "a new result ran on the cpu");
    r.device = 1, r.max_block = 2;
    w = written(&r, NULL, 0);
    CHECK(strstr(w, "\"device\": \"cuda\"") && eval_result_parse(w, &r2, NULL, NULL) == DFL_OK && r2.device == 1,
          "device round trip: %s: %s", dfl_errmsg(), w);
    CHECK(eval_result_device_check(&r2, 0, "f.jsonl:4") == DFL_ERR && strstr(dfl_errmsg(), "f.jsonl:4") &&
              strstr(dfl_errmsg(), "ran on cuda") && strstr(dfl_errmsg(), "on cpu"),
          "a cuda line in a cpu run is refused: %s", dfl_errmsg());
    free(w);
    r.device = 0;
    w = written(&r, NULL, 0);
    CHECK(!strstr(w, "\"device\"") && eval_result_parse(w, &r2, NULL, NULL) == DFL_OK && r2.device == 0 &&
              eval_result_device_check(&r2, 0, "x") == DFL_OK,
          "cpu lines have no device field: %s", w);
    free(w);
    CHECK(eval_result_parse(line_with("turn", "0, \"device\": \"cpu\""), &r2, NULL, NULL) == DFL_OK && r2.device == 0,
          "device cpu given: %s", dfl_errmsg());
    refused(line_with("turn", "0, \"device\": \"tpu\""), "field device");
    refused(line_with("turn", "0, \"device\": 1"), "field device");

    /* numbers outside what the fields hold are refused, not cast (UBSan: float-cast-overflow) */
    refused(line_with("tokens", "1e300"), "field 'tokens'");
    refused(line_with("turn", "-1e300"), "field 'turn'");
    refused(line_with("tree_depth_sum", "-1e30"), "field 'tree_depth_sum'");
    refused(line_with("rounds", "2.5"), "field 'rounds'");
    refused(line_with("first_mismatch", "-2"), "field 'first_mismatch'");
    refused(line_with("tree_nodes", "1e20"), "tree_nodes");
    refused(line_with("accept_hist", "[1e300]"), "accept_hist");
    refused(line_with("accept_hist", "[\"x\"]"), "accept_hist");
    refused(line_with("output_ids", "[1, 1e20]"), "output_ids[1]");
    refused(line_with("output_ids", "[-1]"), "output_ids[0]");
    refused(line_with("output_ids", "{}"), "output_ids");
    /* inf and nan cannot be written back as JSON */
    refused(line_with("modeled_s", "1e999"), "modeled_s");
    refused(line_with("time_s", "-1e999"), "time_s");
    /* arrays longer than block_size holds (the writer writes B and B - 1 entries) */
    refused(line_with("accept_hist", "[1, 1, 0, 1, 0]"), "accept_hist");
    refused(line_with("pos_drafted", "[1, 1, 1, 1]"), "pos_drafted");
    refused(line_with("block_size", "100000"), "block_size");
    /* strictly one JSON object a line: two run together (two writers appending at once) are no line */
    {
        char joined[4096];
        snprintf(joined, sizeof joined, "%s{\"prompt_id\"", line_with(NULL, NULL));
        refused(joined, "not a JSON object");
        snprintf(joined, sizeof joined, "%s \r\n", line_with(NULL, NULL));
        CHECK(eval_result_parse(joined, &r, NULL, NULL) == DFL_OK, "trailing white space is fine: %s", dfl_errmsg());
    }
    /* the autoregressive row: block_size 0, one histogram entry, no positions */
    CHECK(eval_result_parse("{\"prompt_id\": \"7\", \"turn\": 0, \"drafter\": \"\", \"mode\": \"ar\", \"tokens\": 9, "
                            "\"rounds\": 0, \"drafted\": 0, \"accepted\": 0, \"block_size\": 0, \"time_s\": 0.5, "
                            "\"prefill_s\": 0.1, \"draft_s\": 0, \"verify_s\": 0, \"rollback_s\": 0, "
                            "\"tree_depth_sum\": 0, \"match\": null, \"first_mismatch\": -1, \"accept_hist\": [0], "
                            "\"pos_drafted\": [], \"pos_accepted\": [], \"output_ids\": null}",
                            &r, &ids, &n) == DFL_OK &&
              ids == NULL && n == 0 && r.match == -1,
          "ar row: %s", dfl_errmsg());
    return test_done("test_results");
}
