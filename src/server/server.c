/* dfl serve: HTTP front end (libmicrohttpd, one thread per connection), the request queue and
 * the worker thread that owns the model state, Prometheus metrics.
 *
 * A generation request is parsed and tokenized on its connection thread, then queued; the one
 * worker runs queued jobs in arrival order (the engine decodes one sequence at a time: no
 * batching), resetting the target and drafter states between them. A non-streamed request's
 * connection thread waits for its job; a streamed one reads SSE bytes that the worker's token
 * callback appends. A connection that goes away cancels its job: the token callback returns
 * nonzero and spec_generate stops at once. */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/sockios.h>
#include <time.h>

#include <microhttpd.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/kernels.h"
#include "server/server_internal.h"

const int server_statuses[N_STATUS] = {200, 400, 404, 405, 413, 499, 500, 503, 0};

static const char *const ep_paths[EP_COUNT] = {
    "/v1/completions", "/v1/chat/completions", "/generate", "/tokenize", "/detokenize", "/health", "/metrics",
    "/v1/models", "other",
};

static int ep_is_post(endpoint ep) { return ep <= EP_DETOKENIZE; }

static endpoint route(const char *url) {
    for (int i = 0; i < EP_OTHER; i++)
        if (strcmp(url, ep_paths[i]) == 0) return (endpoint)i;
    return EP_OTHER;
}

/* Per-request context (MHD's con_cls): the body as it arrives. */
typedef struct req {
    endpoint ep;
    char *body;
    size_t len, cap, seen;
    int too_big;
    double t0;
} req;

void server_opts_default(dfl_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->max_queue = DFL_SERVE_DEFAULT_QUEUE;
    o->max_body = DFL_SERVE_DEFAULT_BODY;
    o->timeout_s = DFL_SERVE_DEFAULT_TIMEOUT;
    o->max_conns = DFL_SERVE_DEFAULT_CONNS;
    o->max_conns_per_client = DFL_SERVE_DEFAULT_CONNS_PER_CLIENT;
}

int server_port(const dfl_server *s) { return s->port; }
int server_max_context(const dfl_server *s) { return s->max_ctx; }

/* ---- jobs ---- */

void job_free(job *j) {
    for (int i = 0; i < j->n_sub; i++) job_free(j->sub[i]);
    free(j->sub);
    free(j->prompt);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    free(j->stops);
    free(j->sb);
    free(j->acc_len);
    free(j->echo_text), free(j->lp), free(j->top_id), free(j->top_lp);
    textout_free(&j->out);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* srv->mu held */
static void job_unref(job *j) {
    if (--j->refs == 0) job_free(j);
}

/* Append SSE bytes for the connection (takes s). srv->mu held. */
static void stream_put(job *j, char *s) {
    if (!s) return;
    const size_t n = strlen(s);
    if (j->sb_off == j->sb_len) j->sb_off = j->sb_len = 0;
    if (j->sb_len + n > j->sb_cap) {
        size_t cap = j->sb_cap ? j->sb_cap : 4096;
        while (cap < j->sb_len + n) cap *= 2;
        char *p = realloc(j->sb, cap);
        if (!p) {
            free(s);
            return;
        }
        j->sb = p;
        j->sb_cap = cap;
    }
    memcpy(j->sb + j->sb_len, s, n);
    j->sb_len += n;
    free(s);
    pthread_cond_broadcast(&j->cv);
}

static void stream_put_locked(dfl_server *srv, job *j, char *s) {
    pthread_mutex_lock(&srv->mu);
    stream_put(j, s);
    pthread_mutex_unlock(&srv->mu);
}

/* A job that will never run: answer it with an error. srv->mu held; drops the queue's ref. */
static void job_abandon(dfl_server *srv, job *j, int status, const char *msg) {
    job **p = &srv->head;
    job *prev = NULL;
    while (*p && *p != j) prev = *p, p = &(*p)->next;
    if (*p) {
        *p = j->next;
        if (srv->tail == j) srv->tail = prev;
        srv->n_waiting--;
    }
    j->err_status = status;
    snprintf(j->err_msg, sizeof j->err_msg, "%s", msg);
    if (j->stream) stream_put(j, api_stream_error(j));
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    job_unref(j);
}

/* The client went away: a queued job leaves the queue, a running one stops at its next
 * committed tokens. srv->mu held. */
static void job_cancel(dfl_server *srv, job *j) {
    if (j->cancelled || j->state == JOB_DONE) return;
    j->cancelled = 1;
    srv->cancelled++;
    if (j->state == JOB_QUEUED) job_abandon(srv, j, 499, "client closed the connection");
}

/* 1 when the peer has closed its side (checked while a request waits, so that a vanished
 * client does not keep the engine busy). */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd pf = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* While a request waits for the engine its connection is silent by design: no inactivity timeout
 * then (on = 0). Back on, the timer starts afresh (MHD resets it when a zero timeout is raised):
 * an answer the client does not read, or a stream it stops reading, times out. Called on the
 * connection's own thread. */
static void conn_timeout(dfl_server *srv, struct MHD_Connection *c, int on) {
    if (srv->timeout_s) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, on ? srv->timeout_s : 0u);
}

static void wait_a_bit(pthread_cond_t *cv, pthread_mutex_t *mu) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* ---- connections: per-address caps with a reserve, the request deadline ---- */

/* A request must arrive whole within --timeout seconds of its start (the connection's, or the
 * previous answer's end on a keep-alive connection), plus one second per REQUEST_MIN_RATE bytes
 * of body received: a client trickling bytes just often enough to beat the inactivity timeout is
 * cut all the same. */
#define REQUEST_MIN_RATE 65536.0

/* A stream whose client has not read this many bytes (ours not yet handed to the socket, plus the
 * socket's send queue) holds the engine back; when the backlog does not shrink for --timeout
 * seconds, the request is cancelled. */
#define STREAM_BACKLOG (64u << 10)

static int addr_key(const struct sockaddr *sa, unsigned char *key, int *family) {
    *family = sa->sa_family;
    if (sa->sa_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 4;
    }
    if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        return 16;
    }
    return 0;
}

/* Open connections in all, and from the address of sa. srv->mu held. */
static int conns_from(const dfl_server *srv, const struct sockaddr *sa, int *total) {
    unsigned char key[16];
    int family;
    const int n = addr_key(sa, key, &family);
    int same = 0;
    for (const conn_rec *r = srv->conns; r; r = r->next)
        same += r->family == family && r->alen == n && memcmp(r->addr, key, (size_t)n) == 0;
    *total = srv->n_conns;
    return same;
}

/* MHD's accept policy: at most --max-connections-per-client from one address, at most
 * --max-connections in all, and the last `reserve` of those only for an address that holds no
 * connection yet: however many addresses fill the rest, a new client (a health check) still gets
 * in. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *sa, socklen_t len) {
    (void)len;
    dfl_server *srv = cls;
    int total;
    pthread_mutex_lock(&srv->mu);
    const int same = conns_from(srv, sa, &total);
    const int ok = same < srv->per_client && total < srv->max_conns &&
                   (same == 0 || total < srv->max_conns - srv->reserve);
    pthread_mutex_unlock(&srv->mu);
    return ok ? MHD_YES : MHD_NO;
}

/* MHD's connection notifications: STARTED is called on the accepting thread before the next
 * accept (the caps above see every connection), CLOSED before the socket is closed (the reaper
 * never shuts down a descriptor that was reused). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    dfl_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_rec *r = calloc(1, sizeof *r);
        if (!r) return;
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        r->fd = fi ? fi->connect_fd : -1;
        if (ai && ai->client_addr) r->alen = addr_key(ai->client_addr, r->addr, &r->family);
        r->receiving = 1;
        r->t_begin = dfl_now();
        pthread_mutex_lock(&srv->mu);
        r->next = srv->conns;
        if (srv->conns) srv->conns->prev = r;
        srv->conns = r;
        srv->n_conns++;
        pthread_mutex_unlock(&srv->mu);
        *socket_context = r;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_rec *r = *socket_context;
        if (!r) return;
        pthread_mutex_lock(&srv->mu);
        if (r->prev) r->prev->next = r->next;
        else srv->conns = r->next;
        if (r->next) r->next->prev = r->prev;
        srv->n_conns--;
        pthread_mutex_unlock(&srv->mu);
        free(r);
        *socket_context = NULL;
    }
}

static conn_rec *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The connection's request is in whole (on = 0), or a new one begins (on = 1). */
static void conn_receiving(dfl_server *srv, struct MHD_Connection *c, int on) {
    conn_rec *r = conn_of(c);
    if (!r) return;
    pthread_mutex_lock(&srv->mu);
    r->receiving = on;
    if (on) r->t_begin = dfl_now(), r->got = 0;
    pthread_mutex_unlock(&srv->mu);
}

/* Cuts (shutdown: MHD's thread then sees the end and closes it) every connection whose request
 * has not arrived whole by its deadline. */
static void *reaper_main(void *arg) {
    dfl_server *srv = arg;
    pthread_mutex_lock(&srv->mu);
    while (!srv->reaper_quit) {
        const double now = dfl_now();
        for (conn_rec *r = srv->conns; r; r = r->next)
            if (r->receiving && !r->reaped && r->fd >= 0 &&
                now > r->t_begin + srv->timeout_s + (double)r->got / REQUEST_MIN_RATE) {
                shutdown(r->fd, SHUT_RDWR);
                r->reaped = 1;
                srv->reaped++;
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&srv->idle, &srv->mu, &ts);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* Bytes of a stream its client has not taken: ours not yet handed to the socket, plus the
 * socket's send queue (sent but not acknowledged, or not sent for want of window). srv->mu held. */
static size_t stream_backlog(const job *j) {
    int q = 0;
    if (j->fd >= 0 && ioctl(j->fd, SIOCOUTQ, &q) != 0) q = 0;
    return (j->sb_len - j->sb_off) + (size_t)(q > 0 ? q : 0);
}

/* Called by the worker after each chunk of a stream: while the client is STREAM_BACKLOG behind,
 * the engine waits for it; a backlog that does not shrink for --timeout seconds (a client that
 * stopped reading, though its socket buffers took what was sent) cancels the request (with
 * --timeout 0 it waits while the client stays connected, except while the server stops). Returns
 * 1 when the request is cancelled. */
static int stream_throttle(dfl_server *srv, job *j) {
    pthread_mutex_lock(&srv->mu);
    size_t least = (size_t)-1;
    double t_progress = dfl_now();
    while (!j->cancelled && j->conn) {
        const size_t b = stream_backlog(j);
        if (b <= STREAM_BACKLOG) break;
        const double now = dfl_now();
        /* no progress for --timeout; while the server stops, for at most the 30 s that answers in
         * flight get (server_stop), also with --timeout 0 */
        double limit = srv->timeout_s;
        if (srv->stopping && (limit == 0 || limit > 30)) limit = 30;
        if (b < least) least = b, t_progress = now;
        else if (limit > 0 && now - t_progress > limit) {
            srv->stalled++;
            job_cancel(srv, j);
            break;
        }
        wait_a_bit(&j->cv, &srv->mu);
    }
    const int stop = j->cancelled || !j->conn;
    pthread_mutex_unlock(&srv->mu);
    return stop;
}

/* ---- the worker ---- */

static void on_round(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted) {
    (void)start, (void)block, (void)bs, (void)draft, (void)V;
    job *j = ud;
    if (j->n_rounds == j->cap_rounds) {
        int cap = j->cap_rounds ? 2 * j->cap_rounds : 64;
        int *p = realloc(j->acc_len, (size_t)cap * sizeof *p);
        if (!p) return;
        j->acc_len = p;
        j->cap_rounds = cap;
    }
    j->acc_len[j->n_rounds++] = accepted + 1;
}

/* opts.on_logits: the logprob of each committed token (prompt tokens with echo) and its top
 * alternatives, from the target's logits row */
static void on_logits(void *ud, int prompt, int i, int32_t token, const float *row, int V) {
    job *j = ud;
    const size_t p = prompt ? (size_t)i : (size_t)j->n_prompt + (size_t)i, k = (size_t)j->logprobs;
    j->lp[p] = api_logprobs_row(row, V, token, j->logprobs, j->top_id + p * k, j->top_lp + p * k);
}

typedef struct run_ctx {
    dfl_server *srv;
    job *j;
    job *owner;   /* the queued request: j, or the list of prompts j belongs to (its cancel flag counts) */
    int failed;
} run_ctx;

/* vLLM's bucket bounds for its latency histograms (seconds). */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,  0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160., 640., 2560.};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,  15.0,  20.0,
                                    30.0, 40.0, 50.0, 60.0, 120., 240.0, 480.0, 960.0, 1920., 7680.};
#define NB(a) ((int)(sizeof a / sizeof a[0]))

static void hist_init(server_hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = bounds, h->n_bounds = n;
}

/* Caller holds the server mutex. */
static void hist_observe(server_hist *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    if (i < h->n_bounds) h->buckets[i]++;
    h->count++;
    h->sum += v;
}

static int on_tokens(void *ud, const int32_t *toks, int n) {
    run_ctx *rc = ud;
    job *j = rc->j;
    int stop = 0;
    /* latencies as vLLM reports them: the first tokens after the request arrived (queueing and
     * prefill included), then the time between successive outputs of the engine (one per round:
     * a verification round commits several tokens at once, as with vLLM's speculative decoding) */
    const double now = dfl_now();
    if (n > 0) {
        pthread_mutex_lock(&rc->srv->mu);
        if (j->t_last_tokens == 0) hist_observe(&rc->srv->ttft, now - j->t_start);
        else hist_observe(&rc->srv->itl, now - j->t_last_tokens);
        pthread_mutex_unlock(&rc->srv->mu);
        j->t_last_tokens = now;
    }
    for (int i = 0; i < n && !stop; i++) {
        int r = textout_push(&j->out, toks[i]);
        if (r < 0) rc->failed = 1;
        stop = r != 0;
    }
    if (j->stream && !rc->failed) {
        const size_t safe = textout_safe(&j->out);
        char *chunk = api_stream_chunk(rc->srv, j, j->stream_ids, j->stream_text, safe);
        j->stream_ids = j->out.n;
        j->stream_text = safe;
        stream_put_locked(rc->srv, j, chunk);
        if (stream_throttle(rc->srv, j)) stop = 1;
    }
    pthread_mutex_lock(&rc->srv->mu);
    stop |= rc->owner->cancelled;
    pthread_mutex_unlock(&rc->srv->mu);
    return stop;
}

static void run_job(dfl_server *srv, job *j, job *owner) {
    state_reset(&srv->s);
    if (srv->drafting) srv->dif.reset(srv->dif.ctx);
    dfl_gen_opts o = {.max_new = j->max_new, .block = srv->block, .tree_budget = srv->tree_budget,
                      .temperature = j->temperature, .top_p = j->top_p, .top_k = j->top_k,
                      .seed = j->seed, .ignore_eos = j->ignore_eos, .on_round = on_round, .on_round_ud = j};
    if (j->logprobs >= 0) {
        const size_t n = (size_t)j->n_prompt + (size_t)j->max_new, k = (size_t)(j->logprobs ? j->logprobs : 1);
        j->lp = malloc(n * sizeof *j->lp);
        j->top_id = malloc(n * k * sizeof *j->top_id);
        j->top_lp = malloc(n * k * sizeof *j->top_lp);
        if (!j->lp || !j->top_id || !j->top_lp) {
            j->err_status = 500;
            snprintf(j->err_msg, sizeof j->err_msg, "out of memory for the logprobs of %zu tokens", n);
            j->t_done = dfl_now();
            return;
        }
        for (size_t p = 0; p < n; p++) j->lp[p] = NAN;
        o.on_logits = on_logits, o.on_logits_ud = j, o.prompt_logits = j->echo;
    }
    int32_t *out = malloc((size_t)(j->max_new ? j->max_new : 1) * sizeof *out);
    run_ctx rc = {.srv = srv, .j = j, .owner = owner};
    if (j->stream) stream_put_locked(srv, j, api_stream_start(srv, j));
    int r = out ? spec_generate(&srv->s, srv->drafting ? &srv->dif : NULL, j->prompt, j->n_prompt, &o, out, &j->st,
                                on_tokens, &rc)
                : dfl_seterr("out of memory for %d output tokens", j->max_new);
    free(out);
    j->t_done = dfl_now();
    if (r != DFL_OK || rc.failed) {
        j->err_status = 500;
        snprintf(j->err_msg, sizeof j->err_msg, "generation failed: %s", r != DFL_OK ? dfl_errmsg() : "out of memory");
        if (j->stream) stream_put_locked(srv, j, api_stream_error(j));
        return;
    }
    /* a stop string, or the model's eos ending the output, is "stop"; the token budget is "length" */
    const int eos = j->out.n > 0 && !j->ignore_eos && spec_is_eos(&srv->m, j->out.ids[j->out.n - 1]);
    j->finish = j->out.stop_at >= 0 || eos ? "stop" : "length";
    if (j->stream) stream_put_locked(srv, j, api_stream_end(srv, j, j->stream_ids, j->stream_text));
}

/* The metrics of a finished generation (a request, or one prompt of a list, as vLLM counts
 * them). srv->mu held. */
static void account(dfl_server *srv, const job *j) {
    if (j->err_status || j->cancelled) return;
    const dfl_gen_stats *st = &j->st;
    srv->requests_ok++;
    hist_observe(&srv->e2e, j->t_done - j->t_start);
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

static void *worker_main(void *arg) {
    dfl_server *srv = arg;
    pthread_mutex_lock(&srv->mu);
    for (;;) {
        while ((!srv->head || srv->held) && !srv->stopping) pthread_cond_wait(&srv->cv, &srv->mu);
        job *j = srv->head;
        if (!j) break; /* stopping, nothing queued */
        srv->head = j->next;
        if (!srv->head) srv->tail = NULL;
        srv->n_waiting--;
        j->state = JOB_RUNNING;
        srv->running = 1;
        pthread_mutex_unlock(&srv->mu);
        if (!j->n_sub) {
            run_job(srv, j, j);
            pthread_mutex_lock(&srv->mu);
            account(srv, j);
        } else { /* a list of prompts, in order; the first failure ends the request */
            pthread_mutex_lock(&srv->mu);
            for (int i = 0; i < j->n_sub && !j->cancelled && !j->err_status; i++) {
                job *c = j->sub[i];
                pthread_mutex_unlock(&srv->mu);
                run_job(srv, c, j);
                pthread_mutex_lock(&srv->mu);
                if (c->err_status) {
                    j->err_status = c->err_status;
                    snprintf(j->err_msg, sizeof j->err_msg, "prompt[%d]: %.280s", i, c->err_msg);
                }
                if (!j->cancelled) account(srv, c); /* a prompt cut short by a cancel is not a finished one */
            }
            j->t_done = dfl_now();
        }
        srv->running = 0;
        j->state = JOB_DONE;
        pthread_cond_broadcast(&j->cv);
        job_unref(j);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* ---- responses ---- */

static void record(dfl_server *srv, const req *r, const char *method, const char *url, int status) {
    int k = N_STATUS - 1;
    for (int i = 0; i < N_STATUS - 1; i++)
        if (server_statuses[i] == status) k = i;
    pthread_mutex_lock(&srv->mu);
    srv->http[r->ep][k]++;
    pthread_mutex_unlock(&srv->mu);
    if (srv->log) fprintf(stderr, "dfl serve: %s %s %d %.3fs\n", method, url, status, dfl_now() - r->t0);
}

static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *ctype, char *body,
                                 const char *allow) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_json(dfl_server *srv, struct MHD_Connection *c, const req *r, const char *method,
                                 const char *url, int status, cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return MHD_NO;
    record(srv, r, method, url, status);
    return send_body(c, status, "application/json", s, NULL);
}

static enum MHD_Result send_error(dfl_server *srv, struct MHD_Connection *c, const req *r, const char *method,
                                  const char *url, const api_err *e) {
    record(srv, r, method, url, e->status);
    return send_body(c, e->status, "application/json", api_error_body(e),
                     e->status == 405 ? (ep_is_post(r->ep) ? "POST" : "GET, HEAD") : NULL);
}

/* ---- streaming ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    dfl_server *srv = j->srv;
    ssize_t n;
    int waited = 0;
    pthread_mutex_lock(&srv->mu);
    struct MHD_Connection *c = j->conn;
    for (;;) {
        if (j->sb_off < j->sb_len) {
            n = (ssize_t)(j->sb_len - j->sb_off < max ? j->sb_len - j->sb_off : max);
            memcpy(buf, j->sb + j->sb_off, (size_t)n);
            j->sb_off += (size_t)n;
            break;
        }
        if (j->cancelled) {
            n = MHD_CONTENT_READER_END_WITH_ERROR;
            break;
        }
        if (j->state == JOB_DONE) {
            n = MHD_CONTENT_READER_END_OF_STREAM;
            break;
        }
        if (!waited) { /* not under srv->mu: MHD takes a lock of its own */
            pthread_mutex_unlock(&srv->mu);
            conn_timeout(srv, c, 0);
            pthread_mutex_lock(&srv->mu);
            waited = 1;
            continue;
        }
        wait_a_bit(&j->cv, &srv->mu);
        if (client_gone(j->conn)) job_cancel(srv, j);
    }
    pthread_mutex_unlock(&srv->mu);
    if (waited) conn_timeout(srv, c, 1);
    return n;
}

/* MHD is done with the response (sent, or the connection failed). */
static void stream_free(void *cls) {
    job *j = cls;
    dfl_server *srv = j->srv;
    pthread_mutex_lock(&srv->mu);
    if (j->state != JOB_DONE) job_cancel(srv, j);
    j->conn = NULL;
    job_unref(j);
    pthread_mutex_unlock(&srv->mu);
}

/* ---- generation requests ---- */

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static enum MHD_Result handle_generation(dfl_server *srv, struct MHD_Connection *c, req *r, const char *method,
                                         const char *url, cJSON *body) {
    api_err e = {0};
    job *j = calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(body);
        api_seterr(&e, 500, NULL, "out of memory");
        return send_error(srv, c, r, method, url, &e);
    }
    pthread_cond_init(&j->cv, NULL);
    j->srv = srv;
    j->refs = 1;
    j->t_start = r->t0;
    j->created = (long)time(NULL);
    int bad = api_parse_generation(srv, r->ep, body, j, &e);
    cJSON_Delete(body);
    if (bad) {
        job_free(j);
        return send_error(srv, c, r, method, url, &e);
    }
    textout_init(&j->out, srv->tok, j->stops, j->n_stops);
    for (int i = 0; i < j->n_sub; i++) {
        job *c = j->sub[i];
        textout_init(&c->out, srv->tok, c->stops, c->n_stops);
        c->t_start = j->t_start, c->created = j->created;
    }
    pthread_mutex_lock(&srv->mu);
    if (!j->seed_given) j->seed = splitmix(&srv->seed_ctr) >> 11; /* fits a JSON number exactly */
    /* a list of prompts with a seed: each prompt gets it (the choices equal one request per
     * prompt, as vLLM does); without one, each draws its own */
    for (int i = 0; i < j->n_sub; i++) j->sub[i]->seed = j->seed_given ? j->seed : splitmix(&srv->seed_ctr) >> 11;
    snprintf(j->id, sizeof j->id, "%s%lx%06lu", r->ep == EP_COMPLETIONS ? "cmpl-" : r->ep == EP_CHAT ? "chatcmpl-" : "",
             (unsigned long)j->created, ++srv->next_id);
    if (srv->stopping) api_seterr(&e, 503, NULL, "the server is shutting down");
    else if (srv->n_waiting + srv->running > srv->max_queue) /* it would wait behind max_queue others */
        api_seterr(&e, 503, NULL, "the queue is full (%d requests waiting, %d running, --max-queue %d); retry later",
                   srv->n_waiting, srv->running, srv->max_queue);
    if (e.status) {
        pthread_mutex_unlock(&srv->mu);
        job_free(j);
        return send_error(srv, c, r, method, url, &e);
    }
    j->refs = 2; /* this connection + the queue */
    j->conn = c;
    const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = fi ? fi->connect_fd : -1;
    j->state = JOB_QUEUED;
    if (srv->tail) srv->tail->next = j;
    else srv->head = j;
    srv->tail = j;
    srv->n_waiting++;
    pthread_cond_signal(&srv->cv);
    if (j->stream) {
        pthread_mutex_unlock(&srv->mu);
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j,
                                                                      stream_free);
        if (!resp) {
            pthread_mutex_lock(&srv->mu);
            job_cancel(srv, j);
            job_unref(j);
            pthread_mutex_unlock(&srv->mu);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        record(srv, r, method, url, 200);
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    pthread_mutex_unlock(&srv->mu);
    conn_timeout(srv, c, 0);
    pthread_mutex_lock(&srv->mu);
    while (j->state != JOB_DONE) {
        wait_a_bit(&j->cv, &srv->mu);
        if (j->state != JOB_DONE && client_gone(c)) job_cancel(srv, j);
    }
    const int cancelled = j->cancelled;
    pthread_mutex_unlock(&srv->mu);
    conn_timeout(srv, c, 1);
    enum MHD_Result ret;
    if (cancelled) {
        record(srv, r, method, url, 499);
        ret = MHD_NO;
    } else if (j->err_status) {
        api_seterr(&e, j->err_status, NULL, "%s", j->err_msg);
        ret = send_error(srv, c, r, method, url, &e);
    } else {
        cJSON *resp = api_response(srv, j);
        if (resp) {
            ret = send_json(srv, c, r, method, url, 200, resp);
        } else {
            api_seterr(&e, 500, NULL, "out of memory");
            ret = send_error(srv, c, r, method, url, &e);
        }
    }
    pthread_mutex_lock(&srv->mu);
    j->conn = NULL;
    job_unref(j);
    pthread_mutex_unlock(&srv->mu);
    return ret;
}

void server_hold(dfl_server *srv, int on) {
    pthread_mutex_lock(&srv->mu);
    srv->held = on;
    pthread_cond_signal(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
}

int server_connections(dfl_server *srv) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return di ? (int)di->num_connections : -1;
}

void server_queue_depth(dfl_server *srv, int *waiting, int *running) {
    pthread_mutex_lock(&srv->mu);
    *waiting = srv->n_waiting, *running = srv->running;
    pthread_mutex_unlock(&srv->mu);
}

/* ---- metrics ---- */

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

static char *metrics_text(dfl_server *srv) {
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
                fprintf(f, "dfl_http_requests_total{endpoint=\"%s\",status=\"%d\"} %ld\n", ep_paths[e],
                        server_statuses[k], srv->http[e][k]);
    counter_head(f, "dfl_requests_cancelled", "Generation requests whose client went away before the end.");
    fprintf(f, "dfl_requests_cancelled_total %ld\n", srv->cancelled);
    fprintf(f, "# HELP dfl_queue_capacity Requests that may wait behind the running one (--max-queue).\n"
               "# TYPE dfl_queue_capacity gauge\ndfl_queue_capacity %d\n", srv->max_queue);
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
    vllm_counter(f, "vllm:spec_decode_num_drafts", "Verification rounds that checked drafted tokens.", mn,
                 srv->drafts);
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
                   "Time from the request's arrival to its first generated token (queueing and prefill included).",
                   mn, &srv->ttft);
    vllm_histogram(f, "vllm:inter_token_latency_seconds",
                   "Time between successive outputs of a request (one per verification round, which may commit "
                   "several tokens).", mn, &srv->itl);
    vllm_histogram(f, "vllm:e2e_request_latency_seconds",
                   "Time from the request's arrival to its end, finished requests.", mn, &srv->e2e);
    pthread_mutex_unlock(&srv->mu);
    fclose(f);
    return buf;
}

/* ---- the access handler ---- */

/* The JSON path ("messages[1].content") of the first string value in the body that holds U+0000,
 * written into path; 0 if none. cJSON ends its strings at a NUL, so such a prompt would be cut
 * short without a word: refuse it instead. The body is valid JSON (checked by cJSON first). */
static int find_nul_string(const char *s, char *path, size_t cap) {
    enum { MAXD = 64 };
    struct {
        int is_obj, index;
        char key[64];
    } st[MAXD];
    int d = -1;
    char key[64] = "";
    int expect_key = 0;
    for (const char *p = s; *p; p++) {
        const char c = *p;
        if (c == '{' || c == '[') {
            if (++d >= MAXD) return 0; /* deeper than any request field: nothing of ours lives there */
            st[d].is_obj = c == '{', st[d].index = 0;
            snprintf(st[d].key, sizeof st[d].key, "%s", key);
            expect_key = st[d].is_obj;
        } else if (c == '}' || c == ']') {
            d--;
        } else if (c == ',') {
            if (d >= 0 && !st[d].is_obj) st[d].index++;
            expect_key = d >= 0 && st[d].is_obj;
        } else if (c == '"') {
            const char *b = ++p;
            int nul = 0;
            for (; *p != '"'; p++)
                if (*p == '\\') {
                    p++;
                    if (*p == 'u' && strncmp(p + 1, "0000", 4) == 0) nul = 1;
                }
            if (expect_key) {
                snprintf(key, sizeof key, "%.*s", (int)(p - b < 63 ? p - b : 63), b);
                expect_key = 0;
                if (nul) return snprintf(path, cap, "body"), 1;
                continue;
            }
            if (nul) { /* the path: each level's key or [index], then this value's key */
                size_t k = 0;
                path[0] = 0;
                for (int i = 1; i <= d && k < cap; i++)
                    k += (size_t)(st[i - 1].is_obj ? snprintf(path + k, cap - k, "%s%s", k ? "." : "", st[i].key)
                                                   : snprintf(path + k, cap - k, "[%d]", st[i - 1].index));
                if (d >= 0 && k < cap)
                    k += (size_t)(st[d].is_obj ? snprintf(path + k, cap - k, "%s%s", k ? "." : "", key)
                                               : snprintf(path + k, cap - k, "[%d]", st[d].index));
                return 1;
            }
        }
    }
    return 0;
}

static cJSON *parse_body(const req *r, api_err *e) {
    const char *end = NULL;
    cJSON *body = cJSON_ParseWithOpts(r->body ? r->body : "", &end, 1);
    if (!body) {
        const size_t at = end && r->body ? (size_t)(end - r->body) : 0;
        api_seterr(e, 400, "body", "the request body is not valid JSON (error at byte %zu)", at);
        return NULL;
    }
    if (!cJSON_IsObject(body)) {
        cJSON_Delete(body);
        api_seterr(e, 400, "body", "the request body must be a JSON object");
        return NULL;
    }
    char path[256];
    if (find_nul_string(r->body, path, sizeof path)) {
        cJSON_Delete(body);
        api_seterr(e, 400, path, "%s holds a NUL character (\\u0000), which dfl does not accept in text", path);
        return NULL;
    }
    return body;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    dfl_server *srv = cls;
    req *r = *con_cls;
    api_err e = {0};
    if (!r) { /* headers only */
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->ep = route(url);
        r->t0 = dfl_now();
        *con_cls = r;
        pthread_mutex_lock(&srv->mu);
        srv->active++;
        pthread_mutex_unlock(&srv->mu);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->max_body) { /* refuse before reading it */
            api_seterr(&e, 413, NULL, "the request body (%s bytes) exceeds --max-body %zu", cl, srv->max_body);
            return send_error(srv, c, r, method, url, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) { /* body data */
        r->seen += *upload_size;
        conn_rec *cr = conn_of(c);
        if (cr) {
            pthread_mutex_lock(&srv->mu);
            cr->got = r->seen;
            pthread_mutex_unlock(&srv->mu);
        }
        if (r->too_big || r->len + *upload_size > srv->max_body) {
            /* keep reading to the end so that the answer reaches the client, within reason */
            r->too_big = 1;
            if (r->seen > 4 * srv->max_body + (1u << 20)) return MHD_NO;
        } else {
            if (r->len + *upload_size + 1 > r->cap) {
                size_t cap = r->cap ? r->cap : 4096;
                while (cap < r->len + *upload_size + 1) cap *= 2;
                char *p = realloc(r->body, cap);
                if (!p) return MHD_NO;
                r->body = p;
                r->cap = cap;
            }
            memcpy(r->body + r->len, upload, *upload_size);
            r->len += *upload_size;
            r->body[r->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole request is in */
    conn_receiving(srv, c, 0);
    const int is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    const int is_post = strcmp(method, "POST") == 0;
    if (r->ep == EP_OTHER) {
        api_seterr(&e, 404, NULL, "no such endpoint: %s %s (see docs/serve.md)", method, url);
        return send_error(srv, c, r, method, url, &e);
    }
    if (ep_is_post(r->ep) ? !is_post : !is_get) {
        api_seterr(&e, 405, NULL, "%s takes %s, not %s", url, ep_is_post(r->ep) ? "POST" : "GET", method);
        return send_error(srv, c, r, method, url, &e);
    }
    if (r->too_big) {
        api_seterr(&e, 413, NULL, "the request body exceeds --max-body %zu bytes", srv->max_body);
        return send_error(srv, c, r, method, url, &e);
    }
    switch (r->ep) {
    case EP_HEALTH: {
        pthread_mutex_lock(&srv->mu);
        const int stopping = srv->stopping;
        pthread_mutex_unlock(&srv->mu);
        if (stopping) {
            api_seterr(&e, 503, NULL, "the server is shutting down");
            return send_error(srv, c, r, method, url, &e);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        return send_json(srv, c, r, method, url, 200, o);
    }
    case EP_METRICS:
        record(srv, r, method, url, 200);
        return send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", metrics_text(srv), NULL);
    case EP_MODELS: {
        cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddStringToObject(m, "id", srv->model_name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddStringToObject(m, "owned_by", "dfl");
        cJSON_AddNumberToObject(m, "max_model_len", srv->max_ctx);
        cJSON_AddStringToObject(m, "activations", kn_act_name(kn_act_get())); /* DFL_ACT: f32 or bf16 */
        cJSON_AddStringToObject(m, "device", dfl_device_name(srv->m.device)); /* --device: where the target runs */
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
        return send_json(srv, c, r, method, url, 200, o);
    }
    default: break;
    }
    cJSON *body = parse_body(r, &e);
    if (!body) return send_error(srv, c, r, method, url, &e);
    if (r->ep == EP_TOKENIZE || r->ep == EP_DETOKENIZE) {
        cJSON *o = r->ep == EP_TOKENIZE ? api_tokenize(srv, body, &e) : api_detokenize(srv, body, &e);
        cJSON_Delete(body);
        return o ? send_json(srv, c, r, method, url, 200, o) : send_error(srv, c, r, method, url, &e);
    }
    return handle_generation(srv, c, r, method, url, body);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    dfl_server *srv = cls;
    conn_receiving(srv, c, 1); /* a keep-alive connection's next request: a fresh deadline */
    req *r = *con_cls;
    if (!r) return;
    pthread_mutex_lock(&srv->mu);
    if (--srv->active == 0) pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    free(r->body);
    free(r);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const dfl_server *srv = cls;
    if (!srv->log) return;
    fprintf(stderr, "dfl serve: ");
    vfprintf(stderr, fmt, ap);
}

/* ---- start / stop ---- */

static void server_free(dfl_server *srv) {
    if (srv->have_s) state_free(&srv->s);
    if (srv->tok) tok_close(srv->tok);
    if (srv->have_ad) anydrafter_close(&srv->ad);
    model_close(&srv->m);
    free(srv->model_name);
    pthread_cond_destroy(&srv->cv);
    pthread_cond_destroy(&srv->idle);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}

static char *default_name(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    return strndup(dir + b, n - b);
}

static int load(dfl_server *srv, const dfl_server_opts *o) {
    if (!o->target) return dfl_seterr("no target checkpoint given");
    if (o->block && !o->drafter) return dfl_seterr("a block size needs a drafter");
    if (o->tree_budget && !o->drafter) return dfl_seterr("a tree budget needs a drafter");
    if (o->tree_budget < 0 || o->tree_budget > DDTREE_MAX_BUDGET)
        return dfl_seterr("tree budget %d: must be in [0, %d]", o->tree_budget, DDTREE_MAX_BUDGET);
    srv->tree_budget = o->tree_budget;
    if (o->max_queue < 0) return dfl_seterr("max_queue %d: must be >= 0", o->max_queue);
    if (o->timeout_s < 0) return dfl_seterr("timeout %d s: must be >= 0", o->timeout_s);
    if (o->max_conns < 1 || o->max_conns_per_client < 1 || o->max_conns_per_client > o->max_conns)
        return dfl_seterr("connection limits %d in all, %d per client: need 1 <= per client <= in all", o->max_conns,
                          o->max_conns_per_client);
    if (model_open(&srv->m, o->target, o->check_weights) != DFL_OK) return DFL_ERR;
    if (o->device != DFL_DEVICE_CPU) { /* the target's forwards run there (the drafter stays on the CPU) */
        const double t0 = dfl_now();
        if (model_use_device(&srv->m, (dfl_device)o->device) != DFL_OK) return DFL_ERR;
        fprintf(stderr, "dfl serve: target on %s (%.2f GB of weights uploaded in %.1f s)\n",
                dfl_device_name((dfl_device)o->device), srv->m.weight_bytes / 1e9, dfl_now() - t0);
    }
    if (o->drafter) {
        if (anydrafter_open(&srv->ad, o->drafter, &srv->m, o->target, o->block, o->check_weights,
                            srv->drafter_warning, sizeof srv->drafter_warning) != DFL_OK)
            return DFL_ERR;
        srv->have_ad = 1;
        srv->block = srv->ad.block;
        int causal = DFL_BLOCK_ATTN_AUTO;
        if (o->block_attn && (drafter_causal_parse(o->block_attn, &causal) != DFL_OK ||
                              anydrafter_set_causal(&srv->ad, causal) != DFL_OK))
            return DFL_ERR;
    }
    const int maxpos = srv->m.cfg.max_position;
    srv->max_ctx = o->max_context ? o->max_context
                                  : (maxpos && maxpos < DFL_SERVE_DEFAULT_CONTEXT ? maxpos : DFL_SERVE_DEFAULT_CONTEXT);
    if (srv->max_ctx < 2) return dfl_seterr("max_context %d: must be >= 2", srv->max_ctx);
    if (maxpos && srv->max_ctx > maxpos)
        return dfl_seterr("max_context %d exceeds the model's max_position_embeddings %d", srv->max_ctx, maxpos);
    if (!(srv->tok = tok_open(o->tokenizer ? o->tokenizer : o->target))) return DFL_ERR;
    /* prefill in chunks of up to 512 tokens, as dfl generate does (same numbers) */
    const int chunk = srv->max_ctx < 512 ? srv->max_ctx : 512;
    int max_batch = chunk > srv->block ? chunk : srv->block;
    if (srv->tree_budget + 1 > max_batch) max_batch = srv->tree_budget + 1;
    /* a DDTree round holds its nodes in cache slots past the committed positions */
    if (state_init(&srv->s, &srv->m, srv->max_ctx + srv->tree_budget, max_batch, srv->have_ad) != DFL_OK)
        return DFL_ERR;
    srv->have_s = 1;
    if (srv->tree_budget && state_enable_tree(&srv->s, srv->tree_budget + 1) != DFL_OK) return DFL_ERR;
    if (srv->have_ad) {
        if (anydrafter_state_init(&srv->ad, &srv->m, srv->max_ctx, &srv->dif) != DFL_OK) return DFL_ERR;
        srv->drafting = 1;
    }
    srv->model_name = o->model_name ? strdup(o->model_name) : default_name(o->target);
    if (!srv->model_name) return dfl_seterr("out of memory");
    return DFL_OK;
}

static int listen_start(dfl_server *srv, const dfl_server_opts *o) {
    const char *host = o->host ? o->host : "127.0.0.1";
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    const int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai) return dfl_seterr("cannot resolve host '%s': %s", host, gai_strerror(gai));
    /* One thread per connection, so connections are capped (in all and per client address) below
     * what the process can start, with a reserve for new addresses (on_accept): clients holding
     * idle connections cannot lock others out. Silent connections time out (slow or stalled
     * requests, unread answers); a request waiting for the engine is exempt (conn_timeout); a
     * request has a deadline to arrive whole (reaper_main). */
    /* The listening socket is ours, so that a port in use or an address not on this host is
     * reported with the host:port and the reason (libmicrohttpd's own log line names neither). */
    const int v6 = ai->ai_family == AF_INET6;
    char where[320];
    snprintf(where, sizeof where, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", o->port);
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        const int e = errno;
        freeaddrinfo(ai);
        return dfl_seterr("cannot listen on %s: socket: %s", where, strerror(e));
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        const int e = errno;
        close(fd);
        freeaddrinfo(ai);
        if (e == EADDRINUSE)
            return dfl_seterr("cannot listen on %s: the port is in use (another dfl serve or server? pick another with "
                              "--port, or --port 0 for a free one)", where);
        if (e == EADDRNOTAVAIL) return dfl_seterr("cannot listen on %s: %s is not an address of this host", where, host);
        if (e == EACCES)
            return dfl_seterr("cannot listen on %s: permission denied (ports below 1024 need privileges)", where);
        return dfl_seterr("cannot listen on %s: %s", where, strerror(e));
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    freeaddrinfo(ai);
    srv->mhd = MHD_start_daemon(flags, 0, on_accept, srv, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
                                MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                                (unsigned)o->max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                (unsigned)o->max_conns_per_client, MHD_OPTION_END);
    if (!srv->mhd) {
        close(fd);
        return dfl_seterr("cannot start the HTTP server on %s (libmicrohttpd refused; see above)", where);
    }
    /* the port bound (o->port 0: the one the kernel chose) */
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    srv->port = o->port;
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        srv->port = sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&sa)->sin_port);
    return DFL_OK;
}

static void reaper_stop(dfl_server *srv) {
    if (!srv->have_reaper) return;
    pthread_mutex_lock(&srv->mu);
    srv->reaper_quit = 1;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    pthread_join(srv->reaper, NULL);
    srv->have_reaper = 0;
}

dfl_server *server_start(const dfl_server_opts *o) {
    dfl_server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        dfl_seterr("out of memory");
        return NULL;
    }
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    pthread_cond_init(&srv->idle, NULL);
    srv->max_queue = o->max_queue;
    srv->max_body = o->max_body;
    srv->timeout_s = o->timeout_s > 0 ? (unsigned)o->timeout_s : 0;
    srv->max_conns = o->max_conns, srv->per_client = o->max_conns_per_client;
    srv->reserve = o->max_conns / 8; /* for addresses that hold no connection */
    srv->log = o->log_requests;
    hist_init(&srv->ttft, ttft_bounds, NB(ttft_bounds));
    hist_init(&srv->itl, itl_bounds, NB(itl_bounds));
    hist_init(&srv->e2e, e2e_bounds, NB(e2e_bounds));
    srv->seed_ctr = (uint64_t)time(NULL) ^ ((uint64_t)(dfl_now() * 1e9) << 16);
    if (load(srv, o) != DFL_OK) {
        server_free(srv);
        return NULL;
    }
    if (pthread_create(&srv->worker, NULL, worker_main, srv) != 0) {
        dfl_seterr("cannot start the worker thread: %s", strerror(errno));
        server_free(srv);
        return NULL;
    }
    srv->have_worker = 1;
    if (srv->timeout_s) {
        if (pthread_create(&srv->reaper, NULL, reaper_main, srv) != 0) {
            dfl_seterr("cannot start the connection reaper thread: %s", strerror(errno));
            pthread_mutex_lock(&srv->mu);
            srv->stopping = 1;
            pthread_cond_signal(&srv->cv);
            pthread_mutex_unlock(&srv->mu);
            pthread_join(srv->worker, NULL);
            server_free(srv);
            return NULL;
        }
        srv->have_reaper = 1;
    }
    if (listen_start(srv, o) != DFL_OK) {
        reaper_stop(srv);
        pthread_mutex_lock(&srv->mu);
        srv->stopping = 1;
        pthread_cond_signal(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
        pthread_join(srv->worker, NULL);
        server_free(srv);
        return NULL;
    }
    return srv;
}

void server_stop(dfl_server *srv) {
    if (!srv) return;
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    while (srv->head) job_abandon(srv, srv->head, 503, "the server is shutting down");
    pthread_cond_signal(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    pthread_join(srv->worker, NULL); /* the running job, if any, finishes */
    /* let the answers in flight reach their clients (bounded: a stalled reader cannot hold the
     * shutdown), then close every connection */
    pthread_mutex_lock(&srv->mu);
    const double deadline = dfl_now() + 30;
    while (srv->active > 0 && dfl_now() < deadline) wait_a_bit(&srv->idle, &srv->mu);
    pthread_mutex_unlock(&srv->mu);
    MHD_stop_daemon(srv->mhd);
    reaper_stop(srv);
    server_free(srv);
}

const char *server_drafter_warning(const dfl_server *s) { return s->drafter_warning; }

const char *server_drafter_attn(const dfl_server *s) {
    const char *a = s->have_ad ? anydrafter_attn_semantics(&s->ad) : NULL;
    return a ? a : "";
}
