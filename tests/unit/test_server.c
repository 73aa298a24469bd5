/* dfl serve in-process (qwen3_tiny + dflash_qwen3 on a free port), driven with libcurl:
 * /health; completions (greedy and seeded sampling, OpenAI and SGLang forms, streamed) equal
 * spec_generate's output for the same prompt and options, top_p / top_k included; a list of
 * prompts gives one choice per prompt, each equal to the prompt sent alone; the field rule (what
 * is not implemented is refused naming the field unless it is a no-op); logprobs (greedy and echoed prompt
 * tokens) equal a plain forward's log_softmax, with the same tokens as without them; stop
 * strings cut the text; a bounded
 * load run (200 requests from 4 client threads) completes without error; malformed JSON and
 * wrong types -> 400, unknown path -> 404, wrong method -> 405, oversize body -> 413, queue
 * overflow -> 503 (the queue brought into a known state with server_hold); a NUL in a JSON string
 * -> 400 naming the field; a streaming client that disconnects cancels its generation; one client
 * holding idle half-sent connections is capped and others are still served; silent connections
 * time out, requests waiting for the engine do not; server_stop frees everything (the ASan build
 * checks for leaks). Every wait is bounded and generous: nothing depends on timing. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "dfl/common.h"
#include "dfl/server.h"
#include "dfl/spec.h"
#include "server/server_internal.h"
#include "testutil.h"

static const int32_t prompt[] = {11, 200, 37, 512, 99, 3, 641, 77, 12};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

typedef struct reply {
    long status;
    char *body;
    size_t len;
    int abort_after; /* > 0: abort the transfer after this many bytes (a client going away) */
} reply;

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
    reply *r = ud;
    char *b = realloc(r->body, r->len + sz * n + 1);
    if (!b) return 0;
    r->body = b;
    memcpy(r->body + r->len, p, sz * n);
    r->len += sz * n;
    r->body[r->len] = 0;
    if (r->abort_after > 0 && r->len >= (size_t)r->abort_after) return 0;
    return sz * n;
}

/* One request; body NULL = GET. Returns the status (0 on a transport error). */
static reply http(int port, const char *method, const char *path, const char *body, int abort_after) {
    reply r = {.abort_after = abort_after};
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *c = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    if (method) curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return r;
}

static cJSON *json_of(const reply *r) { return r->body ? cJSON_Parse(r->body) : NULL; }

/* The token ids under path a.b.c (array) into out; returns the count or -1. */
static int ids_at(const cJSON *o, const char *const *path, int n_path, int32_t *out, int cap) {
    for (int i = 0; i < n_path && o; i++)
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(path[i])) : cJSON_GetObjectItemCaseSensitive(o, path[i]);
    if (!cJSON_IsArray(o)) return -1;
    int n = 0;
    for (cJSON *x = o->child; x && n < cap; x = x->next) out[n++] = (int32_t)x->valuedouble;
    return n;
}

static const char *const completion_ids[] = {"choices", "0", "token_ids"};

/* spec_generate on a fresh model + drafter, as dfl generate sets it up; top_p / top_k (0 = off). */
static int reference_f(int max_new, float temp, float top_p, int top_k, uint64_t seed, int ignore_eos, int32_t *out,
                       dfl_gen_stats *st) {
    dfl_model m;
    dfl_drafter d;
    if (model_open(&m, test_fixture("qwen3_tiny"), 0) != DFL_OK) return -1;
    if (drafter_open(&d, test_fixture("dflash_qwen3"), m.cfg.n_layers) != DFL_OK) return -1;
    const int B = d.cfg.block_size, ctx = NP + max_new;
    dfl_target_state s;
    dfl_drafter_state ds;
    int rc = -1;
    if (target_state_init(&s, &m, ctx, NP > B ? NP : B, 1) == DFL_OK) {
        if (drafter_state_init(&ds, &d, &m, ctx, B) == DFL_OK) {
            dfl_draft_if dif = spec_dflash_drafter(&ds);
            dfl_gen_opts o = {.max_new = max_new,
                              .block = B,
                              .temperature = temp,
                              .seed = seed,
                              .ignore_eos = ignore_eos,
                              .top_p = top_p,
                              .top_k = top_k};
            if (spec_generate(&s, &dif, prompt, NP, &o, out, st, NULL, NULL) == DFL_OK) rc = st->generated;
            drafter_state_free(&ds);
        }
        target_state_free(&s);
    }
    drafter_close(&d);
    model_close(&m);
    return rc;
}

static int reference(int max_new, float temp, uint64_t seed, int ignore_eos, int32_t *out, dfl_gen_stats *st) {
    return reference_f(max_new, temp, 0, 0, seed, ignore_eos, out, st);
}

/* The prompt as a JSON array, written once: client threads read it concurrently (rewriting a
 * shared buffer on every call let one thread read another's half-written text: a 400 now and then). */
static char prompt_buf[128];
static pthread_once_t prompt_once = PTHREAD_ONCE_INIT;

static void prompt_fill(void) {
    int k = snprintf(prompt_buf, sizeof prompt_buf, "[");
    for (int i = 0; i < NP; i++) k += snprintf(prompt_buf + k, sizeof prompt_buf - k, "%s%d", i ? "," : "", prompt[i]);
    snprintf(prompt_buf + k, sizeof prompt_buf - k, "]");
}

static const char *prompt_json(void) {
    pthread_once(&prompt_once, prompt_fill);
    return prompt_buf;
}

static void check_equal(const char *what, const int32_t *a, int na, const int32_t *b, int nb) {
    CHECK(na == nb && na > 0 && memcmp(a, b, (size_t)na * sizeof *a) == 0, "%s: %d tokens vs reference %d%s", what, na,
          nb, na == nb ? " (ids differ)" : "");
}

/* Reassemble a stream's token ids and text; returns the id count, -1 if malformed. */
static int stream_ids(const char *body, int32_t *ids, int cap, char *text, size_t tcap, int *done) {
    int n = 0;
    size_t tl = 0;
    *done = 0;
    text[0] = 0;
    for (const char *p = body; (p = strstr(p, "data: ")); p += 6) {
        if (strncmp(p + 6, "[DONE]", 6) == 0) {
            *done = 1;
            break;
        }
        const char *end = strstr(p, "\n\n");
        if (!end) return -1;
        cJSON *o = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
        if (!o) return -1;
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(ch, "text");
        for (cJSON *x = ch ? cJSON_GetObjectItemCaseSensitive(ch, "token_ids")->child : NULL; x && n < cap; x = x->next)
            ids[n++] = (int32_t)x->valuedouble;
        if (cJSON_IsString(t) && tl + strlen(t->valuestring) < tcap) {
            strcpy(text + tl, t->valuestring);
            tl += strlen(t->valuestring);
        }
        cJSON_Delete(o);
    }
    return n;
}

static void test_outputs(int port) {
    char body[1024];
    int32_t ref[64], got[64];
    dfl_gen_stats st;
    /* greedy, to the token budget */
    int nr = reference(40, 0, 0, 1, ref, &st);
    CHECK(nr == 40, "reference failed: %s", dfl_errmsg());
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 40, \"temperature\": 0, \"ignore_eos\": true}",
             prompt_json());
    reply r = http(port, NULL, "/v1/completions", body, 0);
    cJSON *o = json_of(&r);
    CHECK(r.status == 200 && o, "completion: %ld %s", r.status, r.body ? r.body : "");
    check_equal("greedy completion", got, ids_at(o, completion_ids, 3, got, 64), ref, nr);
    cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    CHECK(cJSON_GetObjectItemCaseSensitive(u, "completion_tokens")->valuedouble == 40 &&
              cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens")->valuedouble == NP,
          "usage wrong");
    CHECK(strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0),
                                                  "finish_reason")
                     ->valuestring,
                 "length") == 0,
          "finish_reason should be length");
    /* a stop string taken from the middle of that text: the text ends right before it */
    char full[512], stop[8];
    snprintf(full, sizeof full, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
                 cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0), "text")));
    size_t cut = 4; /* a plain-ASCII stop string from inside the text */
    while (full[cut] && !(full[cut] > ' ' && full[cut] < 127 && full[cut + 1] > ' ' && full[cut + 1] < 127)) cut++;
    snprintf(stop, sizeof stop, "%.2s", full + cut);
    const char *first = strstr(full, stop);
    cJSON_Delete(o);
    free(r.body);
    cJSON *req = cJSON_CreateObject();
    cJSON_AddItemToObject(req, "prompt", cJSON_Parse(prompt_json()));
    cJSON_AddNumberToObject(req, "max_tokens", 40);
    cJSON_AddNumberToObject(req, "temperature", 0);
    cJSON_AddBoolToObject(req, "ignore_eos", 1);
    cJSON_AddStringToObject(req, "stop", stop);
    char *js = cJSON_PrintUnformatted(req);
    r = http(port, NULL, "/v1/completions", js, 0);
    o = json_of(&r);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const char *got_text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ch, "text"));
    CHECK(r.status == 200 && got_text && strlen(got_text) == (size_t)(first - full) &&
              strncmp(got_text, full, strlen(got_text)) == 0 &&
              strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason")), "stop") == 0,
          "stop '%s': text should be the %zu bytes before it, got %s", stop, (size_t)(first - full), r.body);
    cJSON_Delete(o);
    free(r.body);
    /* the same, streamed: the chunks reassemble to the same text */
    cJSON_AddBoolToObject(req, "stream", 1);
    free(js);
    js = cJSON_PrintUnformatted(req);
    r = http(port, NULL, "/v1/completions", js, 0);
    char stext[512];
    int done = 0;
    int ns = stream_ids(r.body ? r.body : "", got, 64, stext, sizeof stext, &done);
    CHECK(r.status == 200 && done && ns > 0 && strlen(stext) == (size_t)(first - full) &&
              strncmp(stext, full, strlen(stext)) == 0,
          "streamed stop: text '%s' (%d ids, done %d)", stext, ns, done);
    free(r.body);
    cJSON_Delete(req);
    free(js);

    /* seeded sampling, SGLang form: same tokens as spec_generate with that seed; meta_info */
    nr = reference(32, 0.8f, 1234, 1, ref, &st);
    snprintf(body, sizeof body,
             "{\"input_ids\": %s, \"sampling_params\": {\"max_new_tokens\": 32, \"temperature\": 0.8, \"seed\": 1234, "
             "\"ignore_eos\": true}}",
             prompt_json());
    r = http(port, NULL, "/generate", body, 0);
    o = json_of(&r);
    static const char *const out_ids[] = {"output_ids"};
    CHECK(r.status == 200 && o, "generate: %ld %s", r.status, r.body ? r.body : "");
    check_equal("seeded /generate", got, ids_at(o, out_ids, 1, got, 64), ref, nr);
    cJSON *mi = cJSON_GetObjectItemCaseSensitive(o, "meta_info");
    cJSON *vct = cJSON_GetObjectItemCaseSensitive(mi, "spec_verify_ct");
    cJSON *tau = cJSON_GetObjectItemCaseSensitive(mi, "spec_accept_length");
    CHECK(cJSON_IsNumber(vct) && vct->valuedouble == st.rounds, "spec_verify_ct %g vs rounds %d",
          vct ? vct->valuedouble : -1, st.rounds);
    CHECK(cJSON_IsNumber(tau) && tau->valuedouble > spec_tau(&st) - 1e-9 && tau->valuedouble < spec_tau(&st) + 1e-9,
          "spec_accept_length vs tau %g", spec_tau(&st));
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(mi, "spec_accept_rate_per_pos")) == st.max_block - 1,
          "per-position acceptance has %d entries", st.max_block - 1);
    cJSON_Delete(o);
    free(r.body);

    /* greedy with eos allowed, chat form streamed with usage */
    r = http(port, NULL, "/v1/chat/completions",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Janet has 3 apples\"}], \"max_tokens\": 12, "
             "\"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}",
             0);
    CHECK(r.status == 200 && r.body && strstr(r.body, "\"role\":\"assistant\"") && strstr(r.body, "\"usage\"") &&
              strstr(r.body, "data: [DONE]"),
          "chat stream: %s", r.body ? r.body : "");
    free(r.body);
}

/* ---- load ---- */

typedef struct load_arg {
    int port, n, failures, mismatches;
    const int32_t *expect;
    int n_expect;
} load_arg;

static void *load_client(void *p) {
    load_arg *a = p;
    char body[512];
    int32_t got[16];
    for (int i = 0; i < a->n; i++) {
        const int kind = i % 4; /* completions, /generate, streamed completions, chat */
        const char *path = kind == 1 ? "/generate" : kind == 3 ? "/v1/chat/completions" : "/v1/completions";
        if (kind == 1)
            snprintf(body, sizeof body,
                     "{\"input_ids\": %s, \"sampling_params\": {\"max_new_tokens\": 4, "
                     "\"temperature\": 0, \"ignore_eos\": true}}",
                     prompt_json());
        else if (kind == 3)
            snprintf(body, sizeof body,
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"load %d\"}], "
                     "\"max_tokens\": 4, \"temperature\": 0.7, \"seed\": %d}",
                     i, i);
        else
            snprintf(body, sizeof body,
                     "{\"prompt\": %s, \"max_tokens\": 4, \"temperature\": 0, \"ignore_eos\": true%s}", prompt_json(),
                     kind == 2 ? ", \"stream\": true" : "");
        reply r = http(a->port, NULL, path, body, 0);
        if (r.status != 200 || !r.body) {
            a->failures++;
            fprintf(stderr, "load: %s -> %ld %s\n", path, r.status, r.body ? r.body : "");
        } else if (kind != 3) {
            int n;
            if (kind == 2) {
                char text[256];
                int done;
                n = stream_ids(r.body, got, 16, text, sizeof text, &done);
            } else {
                cJSON *o = cJSON_Parse(r.body);
                static const char *const out_ids[] = {"output_ids"};
                n = kind == 1 ? ids_at(o, out_ids, 1, got, 16) : ids_at(o, completion_ids, 3, got, 16);
                cJSON_Delete(o);
            }
            if (n != a->n_expect || memcmp(got, a->expect, (size_t)n * sizeof *got) != 0) a->mismatches++;
        }
        free(r.body);
    }
    return NULL;
}

static void test_load(int port) {
    int32_t expect[4];
    dfl_gen_stats st;
    const int ne = reference(4, 0, 0, 1, expect, &st);
    load_arg a[4];
    pthread_t th[4];
    const double t0 = dfl_now();
    for (int i = 0; i < 4; i++) {
        a[i] = (load_arg){.port = port, .n = 50, .expect = expect, .n_expect = ne};
        pthread_create(&th[i], NULL, load_client, &a[i]);
    }
    int fails = 0, mism = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        fails += a[i].failures;
        mism += a[i].mismatches;
    }
    CHECK(fails == 0 && mism == 0, "load: %d of 200 requests failed, %d gave other tokens", fails, mism);
    printf("load: 200 requests from 4 clients in %.2f s\n", dfl_now() - t0);
}

/* ---- errors ---- */

static void expect_error(int port, const char *method, const char *path, const char *body, long status,
                         const char *param) {
    reply r = http(port, method, path, body, 0);
    cJSON *o = json_of(&r);
    cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "param"));
    CHECK(r.status == status && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "message")) &&
              cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "type")) && (!param || (p && strcmp(p, param) == 0)),
          "%s %s %.60s: expected %ld (param %s), got %ld %s", method ? method : "POST", path, body ? body : "", status,
          param ? param : "-", r.status, r.body ? r.body : "");
    cJSON_Delete(o);
    free(r.body);
}

/* log_softmax rows of the target over seq in one plain forward (no speculation): ref[t * V + v]
 * = log p(v | seq[0..t]); malloc'd, NULL on error. */
static double *ref_logprobs(const int32_t *seq, int n, int *V) {
    dfl_model m;
    if (model_open(&m, test_fixture("qwen3_tiny"), 0) != DFL_OK) return NULL;
    *V = m.cfg.vocab;
    dfl_target_state s;
    float *lg = malloc((size_t)n * *V * sizeof *lg);
    double *out = malloc((size_t)n * *V * sizeof *out);
    int ok = 0;
    if (lg && out && target_state_init(&s, &m, n, n, 0) == DFL_OK) {
        ok = model_forward(&s, seq, n, lg, 0, NULL) == DFL_OK;
        target_state_free(&s);
    }
    for (int t = 0; t < n && ok; t++) {
        const float *row = lg + (size_t)t * *V;
        double mx = row[0], sum = 0;
        for (int v = 0; v < *V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < *V; v++) sum += exp(row[v] - mx);
        for (int v = 0; v < *V; v++) out[(size_t)t * *V + v] = row[v] - mx - log(sum);
    }
    free(lg);
    model_close(&m);
    if (!ok) free(out);
    return ok ? out : NULL;
}

static cJSON *choice0(cJSON *o) { return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0); }

static cJSON *lp_field(cJSON *o, const char *name) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice0(o), "logprobs"), name);
}

/* logprobs and echo on /v1/completions against a plain forward's log_softmax. */
static void test_logprobs(int port) {
    enum { NG = 12, NC = 5 };
    char body[1024];
    int32_t ref[64], got[64], seq[NP + NG];
    dfl_gen_stats st;
    const int nr = reference(NG, 0, 0, 1, ref, &st);
    CHECK(nr == NG, "reference failed: %s", dfl_errmsg());
    if (nr != NG) return;
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + NP, ref, NG * sizeof *ref);
    int V = 0;
    double *lp = ref_logprobs(seq, NP + NG, &V);
    CHECK(lp, "reference logprobs: %s", dfl_errmsg());
    if (!lp) return;
    /* greedy: the tokens of spec_generate, each token's logprob, the top-1 alternative is it */
    snprintf(body, sizeof body,
             "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true, "
             "\"logprobs\": 3}",
             prompt_json(), NG);
    reply r = http(port, NULL, "/v1/completions", body, 0);
    cJSON *o = json_of(&r);
    CHECK(r.status == 200 && o, "logprobs completion: %ld %s", r.status, r.body ? r.body : "");
    check_equal("greedy completion with logprobs", got, ids_at(o, completion_ids, 3, got, 64), ref, nr);
    cJSON *tl = lp_field(o, "token_logprobs"), *top = lp_field(o, "top_logprobs");
    CHECK(cJSON_GetArraySize(tl) == NG && cJSON_GetArraySize(top) == NG &&
              cJSON_GetArraySize(lp_field(o, "tokens")) == NG && cJSON_GetArraySize(lp_field(o, "text_offset")) == NG,
          "logprobs arrays: %s", r.body ? r.body : "");
    double worst = 0;
    for (int i = 0; i < NG && cJSON_GetArraySize(tl) == NG; i++) {
        const double want = lp[(size_t)(NP - 1 + i) * V + ref[i]], g = cJSON_GetArrayItem(tl, i)->valuedouble;
        worst = fabs(want - g) > worst ? fabs(want - g) : worst;
        cJSON *t = cJSON_GetArrayItem(top, i), *best = t ? t->child : NULL;
        const char *tok = cJSON_GetStringValue(cJSON_GetArrayItem(lp_field(o, "tokens"), i));
        CHECK(best && tok && strcmp(best->string, tok) == 0 && best->valuedouble == g && cJSON_GetArraySize(t) <= 4,
              "top-1 at %d is not the greedy token %s", i, tok ? tok : "?");
    }
    CHECK(worst < 1e-4, "greedy token logprobs vs a plain forward: worst |diff| %g", worst);
    cJSON_Delete(o);
    free(r.body);
    /* sampled: the same tokens with and without logprobs */
    int32_t a[64];
    int na = -1, nb = -2;
    for (int with = 0; with < 2; with++) {
        snprintf(body, sizeof body,
                 "{\"prompt\": %s, \"max_tokens\": 20, \"temperature\": 0.8, \"seed\": 5, "
                 "\"ignore_eos\": true%s}",
                 prompt_json(), with ? ", \"logprobs\": 0" : "");
        r = http(port, NULL, "/v1/completions", body, 0);
        o = json_of(&r);
        if (with) nb = ids_at(o, completion_ids, 3, got, 64);
        else na = ids_at(o, completion_ids, 3, a, 64);
        if (with) CHECK(cJSON_GetArraySize(lp_field(o, "token_logprobs")) == 20, "sampled logprobs: %s", r.body);
        cJSON_Delete(o);
        free(r.body);
    }
    check_equal("sampled completion with logprobs", got, nb, a, na);
    /* echo, max_tokens 0 (lm-eval's loglikelihood): prompt = context + continuation */
    char ids[512];
    int k = snprintf(ids, sizeof ids, "[");
    for (int i = 0; i < NP + NC; i++) k += snprintf(ids + k, sizeof ids - k, "%s%d", i ? "," : "", seq[i]);
    snprintf(ids + k, sizeof ids - k, "]");
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 0, \"echo\": true, \"logprobs\": 1}", ids);
    r = http(port, NULL, "/v1/completions", body, 0);
    o = json_of(&r);
    tl = lp_field(o, "token_logprobs");
    CHECK(r.status == 200 && cJSON_GetArraySize(tl) == NP + NC && cJSON_IsNull(cJSON_GetArrayItem(tl, 0)) &&
              cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(choice0(o), "token_ids")) == 0,
          "echo max_tokens 0: %ld %s", r.status, r.body ? r.body : "");
    double sum = 0, want = 0;
    worst = 0;
    for (int p = 1; p < NP + NC && cJSON_GetArraySize(tl) == NP + NC; p++) {
        const double w = lp[(size_t)(p - 1) * V + seq[p]], g = cJSON_GetArrayItem(tl, p)->valuedouble;
        worst = fabs(w - g) > worst ? fabs(w - g) : worst;
        if (p >= NP) sum += g, want += w;
    }
    CHECK(worst < 1e-4 && fabs(sum - want) < 1e-4, "echo logprobs: worst |diff| %g, continuation %g vs %g", worst, sum,
          want);
    cJSON_Delete(o);
    free(r.body);
    free(lp);
    /* chat: the logprobs of the generated tokens, top_logprobs k entries, the first the greedy token */
    r = http(port, NULL, "/v1/chat/completions",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 6, \"temperature\": 0, "
             "\"ignore_eos\": true, \"logprobs\": true, \"top_logprobs\": 2}",
             0);
    o = json_of(&r);
    cJSON *content =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice0(o), "logprobs"), "content");
    int chat_ok = r.status == 200 && cJSON_GetArraySize(content) == 6;
    for (cJSON *x = content ? content->child : NULL; x && chat_ok; x = x->next) {
        cJSON *tops = cJSON_GetObjectItemCaseSensitive(x, "top_logprobs");
        chat_ok =
            cJSON_GetArraySize(tops) == 2 && cJSON_GetObjectItemCaseSensitive(tops->child, "logprob")->valuedouble ==
                                                 cJSON_GetObjectItemCaseSensitive(x, "logprob")->valuedouble;
    }
    CHECK(chat_ok, "chat logprobs: %ld %s", r.status, r.body ? r.body : "");
    cJSON_Delete(o);
    free(r.body);
    const char *bad[] = {"21", "-1", "\"x\"", "true", "2.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"logprobs\": %s}", bad[i]);
        expect_error(port, NULL, "/v1/completions", body, 400, "logprobs");
    }
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", \"echo\": 1}", 400, "echo");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "max_tokens");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", \"logprobs\": 2, \"stream\": true}", 400,
                 "logprobs");
    expect_error(port, NULL, "/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"stream\": true}",
                 400, "logprobs");
    expect_error(port, NULL, "/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", 400,
                 "top_logprobs");
}

static void test_errors(int port, size_t max_body) {
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", ", 400, "body");
    expect_error(port, NULL, "/v1/completions", "[1, 2]", 400, "body");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": \"ten\"}", 400, "max_tokens");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", \"temperature\": -1}", 400, "temperature");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", \"stop\": 5}", 400, "stop");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": 5}", 400, "prompt");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": [1, 99999]}", 400, "prompt");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 100000}", 400, "max_tokens");
    expect_error(port, NULL, "/v1/chat/completions", "{\"messages\": [{\"content\": \"hi\"}]}", 400,
                 "messages[0].role");
    expect_error(port, NULL, "/generate", "{\"text\": \"x\", \"sampling_params\": {\"max_new_tokens\": 1.5}}", 400,
                 "sampling_params.max_new_tokens");
    expect_error(port, NULL, "/tokenize", "{\"text\": 3}", 400, "text");
    /* a NUL inside a string would cut it short in cJSON: refused, naming where it is */
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": \"a\\u0000b\", \"max_tokens\": 1}", 400, "prompt");
    expect_error(port, NULL, "/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\", "
                 "\"content\": \"x\\u0000\"}]}",
                 400, "messages[1].content");
    expect_error(port, NULL, "/generate", "{\"text\": \"x\", \"sampling_params\": {\"stop\": [\"a\", \"\\u0000\"]}}",
                 400, "sampling_params.stop[1]");
    expect_error(port, NULL, "/tokenize", "{\"text\": \"\\u0000\"}", 400, "text");
    { /* an escaped backslash before u0000 is text, not a NUL */
        reply r = http(port, NULL, "/tokenize", "{\"text\": \"a\\\\u0000\"}", 0);
        CHECK(r.status == 200, "/tokenize of a backslash then u0000: %ld %s", r.status, r.body ? r.body : "");
        free(r.body);
    }
    expect_error(port, NULL, "/detokenize", "{\"tokens\": [\"a\"]}", 400, "tokens");
    expect_error(port, NULL, "/no/such/path", "{}", 404, NULL);
    expect_error(port, "GET", "/v1/completions", NULL, 405, NULL);
    expect_error(port, NULL, "/health", "{}", 405, NULL);
    /* a prompt longer than the context */
    char *big = malloc(max_body + 64);
    int k = snprintf(big, max_body, "{\"prompt\": [");
    for (int i = 0; i < 2100; i++) k += snprintf(big + k, max_body - k, "%s5", i ? "," : "");
    snprintf(big + k, max_body - k, "], \"max_tokens\": 1}");
    expect_error(port, NULL, "/v1/completions", big, 400, "prompt");
    /* a body over --max-body */
    memset(big, ' ', max_body + 32);
    big[0] = '{';
    memcpy(big + max_body + 30, "}", 2);
    expect_error(port, NULL, "/v1/completions", big, 413, NULL);
    free(big);
}

/* ---- sampling as served, lists of prompts, the field rule ---- */

static cJSON *choice_at(cJSON *o, int i) {
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), i);
}

/* POST body to path: status 200 and the parsed response (NULL otherwise, with a failed CHECK). */
static cJSON *post_ok(int port, const char *path, const char *body) {
    reply r = http(port, NULL, path, body, 0);
    cJSON *o = json_of(&r);
    CHECK(r.status == 200 && o, "%s %.120s: %ld %s", path, body, r.status, r.body ? r.body : "");
    free(r.body);
    if (r.status != 200) cJSON_Delete(o), o = NULL;
    return o;
}

static void test_sampling_fields(int port) {
    char body[1024];
    int32_t ref[64], got[64];
    dfl_gen_stats st;
    /* Qwen's recommended sampling: the same tokens as spec_generate with those filters and seed, on
     * both the OpenAI and the SGLang form */
    int nr = reference_f(24, 1.0f, 0.95f, 20, 77, 1, ref, &st);
    snprintf(body, sizeof body,
             "{\"prompt\": %s, \"max_tokens\": 24, \"temperature\": 1, \"top_p\": 0.95, "
             "\"top_k\": 20, \"seed\": 77, \"ignore_eos\": true}",
             prompt_json());
    cJSON *o = post_ok(port, "/v1/completions", body);
    check_equal("completion with top_p / top_k", got, ids_at(o, completion_ids, 3, got, 64), ref, nr);
    cJSON_Delete(o);
    snprintf(body, sizeof body,
             "{\"input_ids\": %s, \"sampling_params\": {\"max_new_tokens\": 24, \"temperature\": 1, "
             "\"top_p\": 0.95, \"top_k\": 20, \"seed\": 77, \"ignore_eos\": true}}",
             prompt_json());
    o = post_ok(port, "/generate", body);
    static const char *const out_ids[] = {"output_ids"};
    check_equal("/generate with top_p / top_k", got, ids_at(o, out_ids, 1, got, 64), ref, nr);
    cJSON_Delete(o);
    int32_t full[64];
    const int nf = reference_f(24, 1.0f, 0, 0, 77, 1, full, &st);
    CHECK(nf != nr || memcmp(full, ref, (size_t)nr * sizeof *ref) != 0,
          "top_p 0.95 / top_k 20 gave the tokens of the full distribution: the filters do nothing here");
    /* top_k -1 (vLLM's off) and top_p 1 are the full distribution */
    snprintf(body, sizeof body,
             "{\"prompt\": %s, \"max_tokens\": 24, \"temperature\": 1, \"top_p\": 1, "
             "\"top_k\": -1, \"seed\": 77, \"ignore_eos\": true}",
             prompt_json());
    o = post_ok(port, "/v1/completions", body);
    check_equal("top_p 1, top_k -1", got, ids_at(o, completion_ids, 3, got, 64), full, nf);
    cJSON_Delete(o);

    /* a list of prompts: one choice per prompt, in order, each equal to the prompt sent alone (greedy;
     * seeded sampling, each prompt with the seed; lm-eval's echo + logprobs shape) */
    static const char *const opts[] = {
        "\"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true",
        "\"max_tokens\": 6, \"temperature\": 0.9, \"top_k\": 20, \"seed\": 5, \"ignore_eos\": true",
        "\"max_tokens\": 1, \"temperature\": 0, \"echo\": true, \"logprobs\": 1, \"seed\": 1234",
    };
    const char *prompts[3] = {prompt_json(), "\"Janet has 3 apples\"", "[[5, 6, 7, 8]]"};
    char one_p[64];
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        snprintf(body, sizeof body, "{\"prompt\": [%s, %s, [5, 6, 7, 8]], %s}", prompts[0], prompts[1], opts[k]);
        cJSON *b = post_ok(port, "/v1/completions", body);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(b, "choices")) == 3, "list of 3 prompts: %d choices",
              cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(b, "choices")));
        int sum_p = 0, sum_c = 0;
        for (int i = 0; i < 3 && b; i++) {
            snprintf(one_p, sizeof one_p, "%s", i == 2 ? "[5, 6, 7, 8]" : prompts[i]);
            snprintf(body, sizeof body, "{\"prompt\": %s, %s}", one_p, opts[k]);
            cJSON *a = post_ok(port, "/v1/completions", body);
            cJSON *ca = choice0(a), *cb = choice_at(b, i);
            cJSON_DeleteItemFromObjectCaseSensitive(ca, "index");
            cJSON *idx = cJSON_DetachItemFromObjectCaseSensitive(cb, "index");
            CHECK(cJSON_IsNumber(idx) && idx->valuedouble == i, "choice %d has index %g", i,
                  idx ? idx->valuedouble : -1);
            cJSON_Delete(idx);
            CHECK(ca && cb && cJSON_Compare(ca, cb, 1),
                  "options %zu, prompt %d: the list's choice differs from the "
                  "prompt sent alone",
                  k, i);
            cJSON *u = cJSON_GetObjectItemCaseSensitive(a, "usage");
            sum_p += (int)cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens")->valuedouble;
            sum_c += (int)cJSON_GetObjectItemCaseSensitive(u, "completion_tokens")->valuedouble;
            cJSON_Delete(a);
        }
        cJSON *u = cJSON_GetObjectItemCaseSensitive(b, "usage");
        CHECK(b && cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens")->valuedouble == sum_p &&
                  cJSON_GetObjectItemCaseSensitive(u, "completion_tokens")->valuedouble == sum_c,
              "options %zu: the list's usage is not the sum of its prompts'", k);
        cJSON_Delete(b);
    }
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": [\"a\", \"b\"], \"stream\": true}", 400, "stream");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": [\"a\", \"\"]}", 400, "prompt[1]");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": [\"a\", 5]}", 400, "prompt[1]");
    expect_error(port, NULL, "/v1/completions", "{\"prompt\": [[1, 2], [1, 99999]]}", 400, "prompt[1]");

    /* sampling values: top_p in (0, 1], top_k an integer >= -1 (also at temperature 0) */
    static const struct {
        const char *extra, *param;
    } bad[] = {
        {"\"top_p\": 0", "top_p"},
        {"\"top_p\": 1.5", "top_p"},
        {"\"top_p\": \"x\"", "top_p"},
        {"\"top_k\": -2", "top_k"},
        {"\"top_k\": 2.5", "top_k"},
        {"\"top_p\": 0, \"temperature\": 0", "top_p"},
        /* the field rule: what dfl does not implement, unless it is a no-op */
        {"\"logit_bias\": {\"5\": 10}", "logit_bias"},
        {"\"n\": 2", "n"},
        {"\"best_of\": 3", "best_of"},
        {"\"min_p\": 0.1, \"temperature\": 1", "min_p"},
        {"\"presence_penalty\": 0.5", "presence_penalty"},
        {"\"repetition_penalty\": 1.1", "repetition_penalty"},
        {"\"suffix\": \"x\"", "suffix"},
        {"\"stop_token_ids\": [3]", "stop_token_ids"},
        {"\"skip_special_tokens\": false", "skip_special_tokens"},
        {"\"frobnicate\": 1", "frobnicate"},
        {"\"stream_options\": {\"x\": true}", "stream_options.x"},
        {"\"response_format\": {\"type\": \"text\"}", "response_format"}, /* chat's, not completions' */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"max_tokens\": 1, %s}", bad[i].extra);
        expect_error(port, NULL, "/v1/completions", body, 400, bad[i].param);
    }
    static const struct {
        const char *extra, *param;
    } bad_chat[] = {
        {"\"response_format\": {\"type\": \"json_object\"}", "response_format"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", "tools"},
        {"\"tool_choice\": \"auto\"", "tool_choice"},
        {"\"logit_bias\": {\"1\": -100}", "logit_bias"},
        {"\"echo\": true", "echo"},
        {"\"chat_template_kwargs\": {\"tools\": []}", "chat_template_kwargs.tools"},
        {"\"best_of\": 1", "best_of"}, /* completions' */
    };
    for (size_t i = 0; i < sizeof bad_chat / sizeof bad_chat[0]; i++) {
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 1, %s}",
                 bad_chat[i].extra);
        expect_error(port, NULL, "/v1/chat/completions", body, 400, bad_chat[i].param);
    }
    expect_error(port, NULL, "/v1/chat/completions",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"name\": \"bob\"}]}", 400,
                 "messages[0].name");
    expect_error(port, NULL, "/generate", "{\"text\": \"x\", \"sampling_params\": {\"regex\": \"a+\"}}", 400,
                 "sampling_params.regex");
    expect_error(port, NULL, "/generate", "{\"text\": \"x\", \"sampling_params\": {\"top_p\": 2}}", 400,
                 "sampling_params.top_p");
    expect_error(port, NULL, "/generate", "{\"text\": \"x\", \"return_logprob\": true}", 400, "return_logprob");
    expect_error(port, NULL, "/generate", "{\"text\": \"x\", \"top_p\": 0.5}", 400, "top_p"); /* sampling_params' */
    /* no-ops are accepted, and change nothing */
    nr = reference(6, 0, 0, 1, ref, &st);
    snprintf(body, sizeof body,
             "{\"prompt\": %s, \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true, "
             "\"n\": 1, \"best_of\": 1, \"logit_bias\": {}, \"min_p\": 0.2, \"top_p\": 0.5, \"top_k\": 3, "
             "\"presence_penalty\": 0, \"frequency_penalty\": 0, \"repetition_penalty\": 1, \"suffix\": \"\", "
             "\"stop_token_ids\": [], \"skip_special_tokens\": true, \"include_stop_str_in_output\": false, "
             "\"min_tokens\": 0, \"user\": \"u\", \"model\": \"any\", \"logprobs\": null, "
             "\"return_token_ids\": true}",
             prompt_json());
    o = post_ok(port, "/v1/completions", body);
    check_equal("no-op fields, greedy", got, ids_at(o, completion_ids, 3, got, 64), ref, nr);
    cJSON_Delete(o);
    o = post_ok(port, "/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, "
                "\"response_format\": {\"type\": \"text\"}, \"tools\": [], \"tool_choice\": \"none\", "
                "\"parallel_tool_calls\": true, \"logit_bias\": {}, \"echo\": false, \"n\": 1, "
                "\"chat_template_kwargs\": {\"enable_thinking\": false}}");
    cJSON_Delete(o);
}

/* ---- queue overflow ---- */

typedef struct long_arg {
    int port;
    int stream;
    long status;
    int done_event; /* the stream ended with data: [DONE] */
} long_arg;

static void *long_client(void *p) {
    long_arg *a = p;
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\": %s, \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true%s}",
             prompt_json(), a->stream ? ", \"stream\": true" : "");
    reply r = http(a->port, NULL, "/v1/completions", body, 0);
    a->status = r.status;
    a->done_event = r.body && strstr(r.body, "data: [DONE]") != NULL;
    free(r.body);
    return NULL;
}

/* Wait (bounded, generously) until the queue holds `waiting` requests. */
static int wait_queue(dfl_server *srv, int waiting) {
    int w = -1, run = -1;
    for (int i = 0; i < 1200; i++) { /* up to 60 s */
        server_queue_depth(srv, &w, &run);
        if (w == waiting) return 1;
        usleep(50000);
    }
    fprintf(stderr, "queue: %d waiting, %d running; expected %d waiting\n", w, run, waiting);
    return 0;
}

static dfl_server *small_server(int max_queue, int timeout_s, int max_conns, int per_client) {
    dfl_server_opts o;
    server_opts_default(&o);
    o.target = test_fixture("qwen3_tiny");
    o.drafter = test_fixture("dflash_qwen3");
    o.max_queue = max_queue;
    o.max_context = 512;
    o.timeout_s = timeout_s;
    o.max_conns = max_conns;
    o.max_conns_per_client = per_client;
    dfl_server *srv = server_start(&o);
    CHECK(srv, "server (queue %d, timeout %d): %s", max_queue, timeout_s, dfl_errmsg());
    return srv;
}

/* With the worker held the queue only grows: max_queue 1 admits two waiting requests (one would
 * run, one wait behind it), a third gets 503; released, both admitted requests complete. */
static void test_queue(void) {
    dfl_server *srv = small_server(1, DFL_SERVE_DEFAULT_TIMEOUT, 64, 64);
    if (!srv) return;
    server_hold(srv, 1);
    long_arg a[2];
    pthread_t th[2];
    int started = 0;
    for (int i = 0; i < 2; i++) {
        a[i] = (long_arg){.port = server_port(srv), .stream = i == 1};
        pthread_create(&th[i], NULL, long_client, &a[i]);
        started++;
        if (!wait_queue(srv, i + 1)) break;
    }
    long_arg c = {.port = server_port(srv)};
    long_client(&c);
    CHECK(c.status == 503, "max_queue 1 with 2 waiting: a third request got %ld, expected 503", c.status);
    server_hold(srv, 0);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    CHECK(a[0].status == 200 && a[1].status == 200 && a[1].done_event,
          "the admitted requests after release: %ld, %ld (stream ended: %d)", a[0].status, a[1].status,
          a[1].done_event);
    server_stop(srv);
}

/* ---- connection limits and timeouts ---- */

/* A TCP connection to the server from local address `from` (127.0.0.x) that sends the start of a
 * request and then nothing. -1 on failure. */
static int half_request(int port, const char *from) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, from, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    static const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le";
    if (bind(fd, (struct sockaddr *)&src, sizeof src) || connect(fd, (struct sockaddr *)&dst, sizeof dst) ||
        send(fd, head, sizeof head - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof head - 1)) {
        fprintf(stderr, "half request from %s: %s\n", from, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* 1 when the server has closed fd (EOF or reset), waiting up to ms. */
static int closed_by_server(int fd, int ms) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, ms) <= 0) return 0;
    char b[64];
    const ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* Open n half requests from `from`; then wait (bounded) until all beyond `expect_open` are closed
 * by the server. Returns how many stay open; fds[] keeps the open ones (-1 for closed). */
static int hold_connections(int port, const char *from, int n, int expect_open, int *fds) {
    for (int i = 0; i < n; i++) fds[i] = half_request(port, from);
    int open_n = 0;
    for (int i = 0; i < n; i++) open_n += fds[i] >= 0;
    for (int round = 0; round < 600 && open_n > expect_open; round++) /* up to 60 s */
        for (int i = 0; i < n; i++)
            if (fds[i] >= 0 && closed_by_server(fds[i], round ? 100 / n + 1 : 0)) close(fds[i]), fds[i] = -1, open_n--;
    for (int i = 0; i < n; i++) /* the survivors must still be open */
        if (fds[i] >= 0 && closed_by_server(fds[i], 0)) close(fds[i]), fds[i] = -1, open_n--;
    return open_n;
}

static void close_all(int *fds, int n) {
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]), fds[i] = -1;
}

/* One client holding idle half-sent connections gets no more than its share; /health and a
 * generation from another client still answer; the total cap holds too. */
static void test_connection_limits(void) {
    dfl_server *srv = small_server(4, 600, 24, 8);
    if (!srv) return;
    const int port = server_port(srv);
    int a[12], b[8], c[8], d[2];
    int open_a = hold_connections(port, "127.0.0.2", 12, 8, a);
    CHECK(open_a == 8, "one client, 12 idle connections, 8 per client allowed: %d stay open", open_a);
    reply r = http(port, NULL, "/health", NULL, 0);
    CHECK(r.status == 200, "/health while one client holds its connections: %ld", r.status);
    free(r.body);
    long_arg g = {.port = port};
    long_client(&g);
    CHECK(g.status == 200, "a generation while one client holds its connections: %ld", g.status);
    /* the server counts a closed client until its connection thread sees the close: wait (bounded)
     * until only the 8 held ones are left, so that the total below is exact */
    int conns = -1;
    for (int i = 0; i < 600 && (conns = server_connections(srv)) != 8; i++) usleep(100000); /* up to 60 s */
    CHECK(conns == 8, "connections open after /health and a generation closed: %d, expected the 8 held", conns);
    /* two more clients reach 21 = 24 - the reserve of 3 (24 / 8): the third gets 5 of its 8 */
    const int open_b = hold_connections(port, "127.0.0.3", 8, 8, b);
    const int open_c = hold_connections(port, "127.0.0.4", 8, 5, c);
    CHECK(open_b == 8 && open_c == 5, "two more clients: %d of 8 and %d of 8 open, expected 8 and 5", open_b, open_c);
    /* the reserve: a new address gets one connection (not two), /health from another answers */
    const int open_d = hold_connections(port, "127.0.0.5", 2, 1, d);
    CHECK(open_d == 1, "a new address with 21 connections held: %d of 2 open, expected 1", open_d);
    r = http(port, NULL, "/health", NULL, 0);
    CHECK(r.status == 200, "/health from a new address with 22 connections held: %ld", r.status);
    free(r.body);
    for (int i = 0; i < 600 && (conns = server_connections(srv)) != 22; i++) usleep(100000); /* /health's closed */
    CHECK(conns == 22, "connections open after /health closed: %d, expected the 22 held", conns);
    /* the total cap: two more new addresses fill 24, the next is closed at accept */
    int e[3];
    const int open_e0 = hold_connections(port, "127.0.0.6", 1, 1, e);
    const int open_e1 = hold_connections(port, "127.0.0.7", 1, 1, e + 1);
    const int open_e2 = hold_connections(port, "127.0.0.8", 1, 0, e + 2);
    CHECK(open_e0 == 1 && open_e1 == 1 && open_e2 == 0,
          "24 connections open (the total cap): new addresses got %d, %d, %d", open_e0, open_e1, open_e2);
    close_all(a, 12), close_all(b, 8), close_all(c, 8), close_all(d, 2), close_all(e, 3);
    /* the server sees the closes on its own threads: /health answers again within a bound */
    long st = 0;
    for (int i = 0; i < 120 && st != 200; i++) {
        if (i) usleep(250000);
        r = http(port, NULL, "/health", NULL, 0);
        st = r.status;
        free(r.body);
    }
    CHECK(st == 200, "/health after the idle connections closed: %ld", st);
    server_stop(srv);
}

/* A silent connection is closed after --timeout; requests waiting for the engine longer than the
 * timeout (the worker held) are not cut, streamed or not. */
static void test_timeout(void) {
    dfl_server *srv = small_server(4, 1, 64, 64);
    if (!srv) return;
    const int port = server_port(srv);
    const double t0 = dfl_now();
    int fd = half_request(port, "127.0.0.1");
    int closed = 0;
    for (int i = 0; i < 600 && fd >= 0 && !closed; i++) closed = closed_by_server(fd, 100); /* up to 60 s */
    const double dt = dfl_now() - t0;
    CHECK(fd >= 0 && closed && dt >= 0.9, "a silent connection with --timeout 1: closed %d after %.2f s", closed, dt);
    if (fd >= 0) close(fd);
    server_hold(srv, 1);
    long_arg a[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        a[i] = (long_arg){.port = port, .stream = i};
        pthread_create(&th[i], NULL, long_client, &a[i]);
    }
    wait_queue(srv, 2);
    sleep(3); /* three timeouts pass while both wait */
    server_hold(srv, 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(a[0].status == 200 && a[1].status == 200 && a[1].done_event,
          "requests that waited 3 s with --timeout 1: %ld, stream %ld (ended: %d)", a[0].status, a[1].status,
          a[1].done_event);
    server_stop(srv);
}

/* ---- a streaming client that goes away ---- */

static long metric(int port, const char *name) {
    reply r = http(port, NULL, "/metrics", NULL, 0);
    long v = -1;
    const char *p = r.body ? strstr(r.body, name) : NULL;
    if (p) {
        const char *sp = strchr(p, ' ');
        if (sp) v = atol(sp + 1);
    }
    free(r.body);
    return v;
}

static void test_disconnect(int port) {
    const long before = metric(port, "\ndfl_requests_cancelled_total");
    char body[256];
    snprintf(body, sizeof body,
             "{\"prompt\": %s, \"max_tokens\": 2000, \"temperature\": 0, \"ignore_eos\": true, "
             "\"stream\": true}",
             prompt_json());
    reply r = http(port, NULL, "/v1/completions", body, 600);
    CHECK(r.status == 200 && r.len >= 600, "aborted stream: status %ld, %zu bytes", r.status, r.len);
    free(r.body);
    long after = before;
    for (int i = 0; i < 1200 && after == before; i++) { /* up to 60 s */
        usleep(50000);
        after = metric(port, "\ndfl_requests_cancelled_total");
    }
    CHECK(after == before + 1, "cancelled requests %ld -> %ld after a client went away", before, after);
    r = http(port, NULL, "/health", NULL, 0);
    CHECK(r.status == 200, "health after a disconnect: %ld", r.status);
    free(r.body);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    dfl_server_opts o;
    server_opts_default(&o);
    /* own copies: test_fixture's buffers are a ring of 8, reused by the reference runs */
    char target[4096], drafter[4096];
    snprintf(target, sizeof target, "%s", test_fixture("qwen3_tiny"));
    snprintf(drafter, sizeof drafter, "%s", test_fixture("dflash_qwen3"));
    o.target = target;
    o.drafter = drafter;
    o.port = 0;
    o.max_context = 2048;
    o.max_body = 16 * 1024;
    dfl_server *srv = server_start(&o);
    CHECK(srv, "server_start: %s", dfl_errmsg());
    if (!srv) return test_done("server");
    const int port = server_port(srv);
    CHECK(port > 0, "port %d", port);
    reply r = http(port, NULL, "/health", NULL, 0);
    CHECK(r.status == 200 && r.body && strstr(r.body, "\"ok\""), "health: %ld", r.status);
    free(r.body);
    double t0 = dfl_now();
    test_outputs(port);
    printf("outputs: %.2f s\n", dfl_now() - t0);
    t0 = dfl_now();
    test_logprobs(port);
    printf("logprobs: %.2f s\n", dfl_now() - t0);
    test_errors(port, o.max_body);
    t0 = dfl_now();
    test_sampling_fields(port);
    printf("sampling and fields: %.2f s\n", dfl_now() - t0);
    test_load(port);
    t0 = dfl_now();
    test_disconnect(port);
    printf("disconnect: %.2f s\n", dfl_now() - t0);
    const long ok = metric(port, "dfl_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}");
    CHECK(ok >= 100, "metrics: %ld successful completions counted", ok);
    /* a second server on the port already taken fails cleanly */
    dfl_server_opts o2 = o;
    o2.port = port;
    dfl_server *srv2 = server_start(&o2);
    CHECK(!srv2 && strstr(dfl_errmsg(), "listen"), "a second server on port %d: %s", port,
          srv2 ? "started" : dfl_errmsg());
    if (srv2) server_stop(srv2);
    t0 = dfl_now();
    server_stop(srv);
    printf("stop: %.2f s\n", dfl_now() - t0);
    t0 = dfl_now();
    test_queue();
    printf("queue: %.2f s\n", dfl_now() - t0);
    t0 = dfl_now();
    test_connection_limits();
    printf("connection limits: %.2f s\n", dfl_now() - t0);
    t0 = dfl_now();
    test_timeout();
    printf("timeout: %.2f s\n", dfl_now() - t0);
    curl_global_cleanup();
    return test_done("server");
}
