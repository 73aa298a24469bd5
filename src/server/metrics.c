/* dfl serve: the Prometheus text of /metrics (dfl_ and vllm: families) and the counters and
 * latency histograms behind it. */
#include <stdio.h>
#include <string.h>

#include "server/server_internal.h"

/* vLLM's bucket bounds for its latency histograms (seconds). */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,  0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160., 640., 2560.};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,  15.0, 20.0,
                                    30.0, 40.0, 50.0, 60.0, 120., 240.0, 480.0, 960.0, 1920., 7680.};
#define NB(a) ((int)(sizeof a / sizeof a[0]))

static void hist_init(server_hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = bounds, h->n_bounds = n;
}

void metrics_observe(server_hist *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    if (i < h->n_bounds) h->buckets[i]++;
    h->count++;
    h->sum += v;
}

void metrics_init(dfl_server *srv) {
    hist_init(&srv->ttft, ttft_bounds, NB(ttft_bounds));
    hist_init(&srv->itl, itl_bounds, NB(itl_bounds));
    hist_init(&srv->e2e, e2e_bounds, NB(e2e_bounds));
}

/* As vLLM counts them: cancelled and failed generations are not counted. */
void metrics_account(dfl_server *srv, const job *j) {
    if (j->err_status || j->cancelled) return;
    const dfl_gen_stats *st = &j->st;
    srv->requests_ok++;
    metrics_observe(&srv->e2e, j->t_done - j->t_start);
    srv->prompt_tokens += j->n_prompt;
    srv->gen_tokens += j->out.n;
    srv->rounds += st->rounds;
    if (st->max_block > 1) {
        srv->drafts += st->pos_drafted[1];
        srv->draft_tokens += st->drafted;
        srv->accepted_tokens += st->accepted;
        for (int k = 1; k < st->max_block; k++) srv->acc_pos[k - 1] += st->pos_accepted[k];
    }
}

/* A label value with \, " and newlines escaped (the text format's rules). */
static void label_value(FILE *f, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') fputc('\\', f), fputc(*v, f);
        else if (*v == '\n') fputs("\\n", f);
        else fputc(*v, f);
    }
}

/* HELP and TYPE of a counter: the family is named with its "_total" suffix, as its samples are
 * (prometheus_client's parser, and Prometheus, pair them so; vLLM's exposition does the same). */
static void counter_head(FILE *f, const char *name, const char *help) {
    fprintf(f, "# HELP %s_total %s\n# TYPE %s_total counter\n", name, help, name);
}

/* One vllm: counter with the model_name label. */
static void vllm_counter(FILE *f, const char *name, const char *help, const char *mn, long v) {
    counter_head(f, name, help);
    fprintf(f, "%s_total{model_name=\"", name);
    label_value(f, mn);
    fprintf(f, "\"} %ld\n", v);
}

static void vllm_gauge(FILE *f, const char *name, const char *help, const char *mn, long v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s{model_name=\"", name, help, name, name);
    label_value(f, mn);
    fprintf(f, "\"} %ld\n", v);
}

static void vllm_histogram(FILE *f, const char *name, const char *help, const char *mn, const server_hist *h) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long cum = 0;
    for (int i = 0; i <= h->n_bounds; i++) {
        char le[32];
        if (i < h->n_bounds) {
            cum += h->buckets[i];
            snprintf(le, sizeof le, "%g", h->bounds[i]);
        } else {
            cum = h->count;
            snprintf(le, sizeof le, "+Inf");
        }
        fprintf(f, "%s_bucket{le=\"%s\",model_name=\"", name, le);
        label_value(f, mn);
        fprintf(f, "\"} %ld\n", cum);
    }
    fprintf(f, "%s_sum{model_name=\"", name);
    label_value(f, mn);
    fprintf(f, "\"} %.9g\n%s_count{model_name=\"", h->sum, name);
    label_value(f, mn);
    fprintf(f, "\"} %ld\n", h->count);
}

char *metrics_text(dfl_server *srv) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    pthread_mutex_lock(&srv->mu);
    const char *mn = srv->model_name;
    counter_head(f, "dfl_http_requests",
                 "HTTP requests answered, by endpoint and status (499: the client closed the connection first).");
    for (int e = 0; e < EP_COUNT; e++)
        for (int k = 0; k < N_STATUS; k++)
            if (srv->http[e][k])
                fprintf(f, "dfl_http_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", server_ep_paths[e],
                        server_statuses[k], srv->http[e][k]);
    counter_head(f, "dfl_requests_cancelled", "Generation requests whose client went away before the end.");
    fprintf(f, "dfl_requests_cancelled_total %ld\n", srv->cancelled);
    fprintf(f,
            "# HELP dfl_queue_capacity Requests that may wait behind the running one (--max-queue).\n"
            "# TYPE dfl_queue_capacity gauge\ndfl_queue_capacity %d\n",
            srv->max_queue);
    counter_head(f, "dfl_connections_cut",
                 "Connections closed because their request did not arrive whole in time (--timeout, minimum rate).");
    fprintf(f, "dfl_connections_cut_total %ld\n", srv->reaped);
    counter_head(f, "dfl_streams_stalled",
                 "Streamed requests cancelled because their client stopped reading (no progress for --timeout).");
    fprintf(f, "dfl_streams_stalled_total %ld\n", srv->stalled);
    counter_head(f, "dfl_spec_decode_rounds",
                 "Verification rounds (target forwards after the prefill), including plain decode steps.");
    fprintf(f, "dfl_spec_decode_rounds_total %ld\n", srv->rounds);
    vllm_gauge(f, "vllm:num_requests_running", "Requests being generated.", mn, srv->running);
    vllm_gauge(f, "vllm:num_requests_waiting", "Requests waiting in the queue.", mn, srv->n_waiting);
    vllm_counter(f, "vllm:request_success", "Finished generation requests.", mn, srv->requests_ok);
    vllm_counter(f, "vllm:prompt_tokens", "Prefilled prompt tokens.", mn, srv->prompt_tokens);
    vllm_counter(f, "vllm:generation_tokens", "Generated tokens.", mn, srv->gen_tokens);
    vllm_counter(f, "vllm:spec_decode_num_drafts", "Verification rounds that checked drafted tokens.", mn, srv->drafts);
    vllm_counter(f, "vllm:spec_decode_num_draft_tokens", "Drafted tokens.", mn, srv->draft_tokens);
    vllm_counter(f, "vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens.", mn, srv->accepted_tokens);
    counter_head(f, "vllm:spec_decode_num_accepted_tokens_per_pos",
                 "Accepted draft tokens by position in the block (0 = the first draft after the anchor).");
    for (int k = 0; k + 1 < (srv->drafting ? srv->block : 1); k++) {
        fprintf(f, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"");
        label_value(f, mn);
        fprintf(f, "\",position=\"%d\"} %ld\n", k, srv->acc_pos[k]);
    }
    vllm_histogram(f, "vllm:time_to_first_token_seconds",
                   "Time from the request's arrival to its first generated token (queueing and prefill included).", mn,
                   &srv->ttft);
    vllm_histogram(f, "vllm:inter_token_latency_seconds",
                   "Time between successive outputs of a request (one per verification round, which may commit "
                   "several tokens).",
                   mn, &srv->itl);
    vllm_histogram(f, "vllm:e2e_request_latency_seconds",
                   "Time from the request's arrival to its end, finished requests.", mn, &srv->e2e);
    pthread_mutex_unlock(&srv->mu);
    fclose(f);
    return buf;
}
