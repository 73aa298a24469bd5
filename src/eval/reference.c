/* Reference agreement: the first position where dfl's greedy target output and a reference
 * (a file of outputs, or a running server) diverge. */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/jsonl.h"
#include "dfl/reference.h"

int ref_first_divergence(const int32_t *a, int na, const int32_t *b, int nb) {
    const int n = na < nb ? na : nb;
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return i;
    return na == nb ? -1 : n;
}

/* Token ids from a JSON array; DFL_ERR if it is not an array of integers. */
static int ids_from_json(const cJSON *x, int32_t **ids, int *n) {
    if (!cJSON_IsArray(x)) return DFL_ERR;
    *n = cJSON_GetArraySize(x);
    *ids = malloc(((size_t)*n + 1) * sizeof(int32_t));
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, x) {
        if (!cJSON_IsNumber(e)) {
            free(*ids);
            *ids = NULL;
            return DFL_ERR;
        }
        (*ids)[i++] = (int32_t)e->valuedouble;
    }
    return DFL_OK;
}

int ref_file_load(ref_set *rs, const char *path, const dfl_tokenizer *tok) {
    memset(rs, 0, sizeof *rs);
    dfl_jsonl in;
    if (dfl_jsonl_open(&in, path, DFL_JSONL_LAST_LINE_OK)) return dfl_preperr("reference file");
    int rc = DFL_OK, more;
    while (rc == DFL_OK && (more = dfl_jsonl_next(&in)) == 1) {
        const int lineno = in.lineno;
        cJSON *o = dfl_jsonl_object(&in);
        const cJSON *id = o ? cJSON_GetObjectItemCaseSensitive(o, "id") : NULL;
        if (!id && o) id = cJSON_GetObjectItemCaseSensitive(o, "prompt_id");
        const cJSON *turn = o ? cJSON_GetObjectItemCaseSensitive(o, "turn") : NULL;
        const cJSON *ids = NULL, *text = NULL;
        if (o) {
            static const char *const keys[] = {"output_ids", "token_ids", "tokens", NULL};
            for (int k = 0; keys[k] && !ids; k++) ids = cJSON_GetObjectItemCaseSensitive(o, keys[k]);
            text = cJSON_GetObjectItemCaseSensitive(o, "text");
        }
        ref_entry e = {0};
        if (!o || !cJSON_IsObject(o) || !(cJSON_IsString(id) || cJSON_IsNumber(id))) {
            rc = dfl_seterr("%s:%d: expected a JSON object with an \"id\" (string or number)", path, lineno);
        } else if (ids && ids_from_json(ids, &e.ids, &e.n) == DFL_OK) {
        } else if (cJSON_IsString(text)) {
            size_t n = 0;
            if (tok_encode(tok, text->valuestring, strlen(text->valuestring), &e.ids, &n) != DFL_OK)
                rc = dfl_preperr("%s:%d", path, lineno);
            e.n = (int)n;
        } else {
            rc = dfl_seterr("%s:%d: expected \"output_ids\" / \"token_ids\" / \"tokens\" (integers) or \"text\"", path,
                            lineno);
        }
        if (rc == DFL_OK) {
            if (cJSON_IsString(id)) snprintf(e.id, sizeof e.id, "%s", id->valuestring);
            else snprintf(e.id, sizeof e.id, "%.0f", id->valuedouble);
            e.turn = cJSON_IsNumber(turn) ? (int)turn->valuedouble : 0;
            rs->e = realloc(rs->e, (size_t)(rs->n + 1) * sizeof *rs->e);
            rs->e[rs->n++] = e;
        }
        cJSON_Delete(o);
    }
    if (rc == DFL_OK && more < 0) rc = DFL_ERR;
    dfl_jsonl_close(&in);
    if (rc != DFL_OK) ref_set_free(rs);
    return rc;
}

const ref_entry *ref_find(const ref_set *rs, const char *id, int turn) {
    for (int i = 0; i < rs->n; i++)
        if (rs->e[i].turn == turn && strcmp(rs->e[i].id, id) == 0) return &rs->e[i];
    return NULL;
}

void ref_set_free(ref_set *rs) {
    for (int i = 0; i < rs->n; i++) free(rs->e[i].ids);
    free(rs->e);
    memset(rs, 0, sizeof *rs);
}

typedef struct buf {
    char *p;
    size_t n;
} buf;

static size_t on_data(char *d, size_t sz, size_t nm, void *ud) {
    buf *b = ud;
    const size_t k = sz * nm;
    char *np = realloc(b->p, b->n + k + 1);
    if (!np) return 0;
    b->p = np;
    memcpy(b->p + b->n, d, k);
    b->n += k;
    b->p[b->n] = 0;
    return k;
}

int ref_url_generate(const char *url, const int32_t *prompt, int n_prompt, int max_new, int32_t **ids, int *n) {
    /* SGLang's /generate takes input_ids; otherwise an OpenAI-compatible /v1/completions */
    const int sglang = strlen(url) >= 9 && strcmp(url + strlen(url) - 9, "/generate") == 0;
    cJSON *req = cJSON_CreateObject();
    cJSON *p = cJSON_CreateArray();
    for (int i = 0; i < n_prompt; i++) cJSON_AddItemToArray(p, cJSON_CreateNumber(prompt[i]));
    if (sglang) {
        cJSON_AddItemToObject(req, "input_ids", p);
        cJSON *sp = cJSON_AddObjectToObject(req, "sampling_params");
        cJSON_AddNumberToObject(sp, "max_new_tokens", max_new);
        cJSON_AddNumberToObject(sp, "temperature", 0);
    } else {
        cJSON_AddItemToObject(req, "prompt", p);
        cJSON_AddNumberToObject(req, "max_tokens", max_new);
        cJSON_AddNumberToObject(req, "temperature", 0);
        cJSON_AddBoolToObject(req, "return_token_ids", 1); /* vLLM; dfl serve always returns them */
    }
    char *body = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    CURL *c = curl_easy_init();
    buf b = {0};
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
    CURLcode cr = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(body);
    int rc = DFL_ERR;
    if (cr != CURLE_OK) {
        dfl_seterr("%s: %s", url, curl_easy_strerror(cr));
    } else if (status != 200) {
        dfl_seterr("%s: HTTP %ld: %.300s", url, status, b.p ? b.p : "");
    } else {
        cJSON *o = cJSON_Parse(b.p ? b.p : "");
        const cJSON *x = NULL;
        if (o && sglang) x = cJSON_GetObjectItemCaseSensitive(o, "output_ids");
        else if (o) {
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
            x = cJSON_GetObjectItemCaseSensitive(ch, "token_ids");
        }
        if (ids_from_json(x, ids, n) == DFL_OK) rc = DFL_OK;
        else dfl_seterr("%s: the response has no token ids (%s)", url, sglang ? "output_ids" : "choices[0].token_ids");
        cJSON_Delete(o);
    }
    free(b.p);
    return rc;
}
