/* dfl serve: the request queue and the worker thread that owns the model state.
 *
 * The worker runs queued jobs in arrival order (the engine decodes one sequence at a time: no
 * batching), resetting the target and drafter states between them. A streamed job's token
 * callback appends SSE bytes for its connection and waits while the client falls too far behind;
 * a job whose client went away stops at its next committed tokens (the callback returns nonzero). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <time.h>

#include "dfl/common.h"
#include "server/server_internal.h"

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

void job_unref(job *j) {
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
    server_wake(j);
}

static void stream_put_locked(dfl_server *srv, job *j, char *s) {
    pthread_mutex_lock(&srv->mu);
    stream_put(j, s);
    pthread_mutex_unlock(&srv->mu);
}

void job_abandon(dfl_server *srv, job *j, int status, const char *msg) {
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
    server_wake(j);
    job_unref(j);
}

void job_cancel(dfl_server *srv, job *j) {
    if (j->cancelled || j->state == JOB_DONE) return;
    j->cancelled = 1;
    srv->cancelled++;
    if (j->state == JOB_QUEUED) job_abandon(srv, j, 499, "client closed the connection");
    else server_wake(j); /* a stream's reader ends it now */
}

void wait_a_bit(pthread_cond_t *cv, pthread_mutex_t *mu) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* A stream whose client has not read this many bytes (ours not yet handed to the socket, plus the
 * socket's send queue) holds the engine back; when the backlog does not shrink for --timeout
 * seconds, the request is cancelled. */
#define STREAM_BACKLOG (64u << 10)

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

/* opts.on_top (greedy, no echo): the committed token is its row's most probable, ids[0] */
static void on_top(void *ud, int i, int32_t token, const int32_t *ids, const float *lp) {
    job *j = ud;
    const size_t p = (size_t)j->n_prompt + (size_t)i, k = (size_t)j->logprobs;
    j->lp[p] = ids[0] == token ? lp[0] : NAN;
    memcpy(j->top_id + p * k, ids, k * sizeof *ids);
    memcpy(j->top_lp + p * k, lp, k * sizeof *lp);
}

typedef struct run_ctx {
    dfl_server *srv;
    job *j;
    job *owner; /* the queued request: j, or the list of prompts j belongs to (its cancel flag counts) */
    int failed;
} run_ctx;

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
        if (j->t_last_tokens == 0) metrics_observe(&rc->srv->ttft, now - j->t_start);
        else metrics_observe(&rc->srv->itl, now - j->t_last_tokens);
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
        char *chunk = api_stream_chunk(&rc->srv->api, j, j->stream_ids, j->stream_text, safe);
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
    target_state_reset(&srv->s);
    if (srv->drafting) srv->dif.reset(srv->dif.ctx);
    dfl_gen_opts o = {.max_new = j->max_new,
                      .block = srv->block,
                      .tree_budget = srv->tree_budget,
                      .temperature = j->temperature,
                      .top_p = j->top_p,
                      .top_k = j->top_k,
                      .seed = j->seed,
                      .ignore_eos = j->ignore_eos,
                      .on_round = on_round,
                      .on_round_ud = j,
                      .on_round_no_draft = 1};
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
        if (j->temperature <= 0 && !j->echo) /* greedy: the forwards send each row's top tokens back */
            o.on_top = on_top, o.on_top_ud = j, o.on_top_k = (int)k;
        else o.on_logits = on_logits, o.on_logits_ud = j, o.prompt_logits = j->echo;
    }
    int32_t *out = malloc((size_t)(j->max_new ? j->max_new : 1) * sizeof *out);
    run_ctx rc = {.srv = srv, .j = j, .owner = owner};
    if (j->stream) stream_put_locked(srv, j, api_stream_start(&srv->api, j));
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
    if (j->stream) stream_put_locked(srv, j, api_stream_end(&srv->api, j, j->stream_ids, j->stream_text));
}

void *worker_main(void *arg) {
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
        srv->cur = j;
        pthread_mutex_unlock(&srv->mu);
        if (!j->n_sub) {
            run_job(srv, j, j);
            pthread_mutex_lock(&srv->mu);
            metrics_account(srv, j);
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
                if (!j->cancelled) metrics_account(srv, c); /* a prompt cut short by a cancel is not a finished one */
            }
            j->t_done = dfl_now();
        }
        srv->running = 0;
        srv->cur = NULL;
        j->state = JOB_DONE;
        pthread_cond_broadcast(&j->cv);
        server_wake(j);
        job_unref(j);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int job_enqueue(dfl_server *srv, job *j, api_err *e) {
    if (!j->seed_given) j->seed = splitmix(&srv->seed_ctr) >> 11; /* fits a JSON number exactly */
    /* a list of prompts with a seed: each prompt gets it (the choices equal one request per
     * prompt, as vLLM does); without one, each draws its own */
    for (int i = 0; i < j->n_sub; i++) j->sub[i]->seed = j->seed_given ? j->seed : splitmix(&srv->seed_ctr) >> 11;
    snprintf(j->id, sizeof j->id, "%s%lx%06lu",
             j->ep == EP_COMPLETIONS ? "cmpl-"
             : j->ep == EP_CHAT      ? "chatcmpl-"
                                     : "",
             (unsigned long)j->created, ++srv->next_id);
    if (srv->stopping) api_seterr(e, 503, NULL, "the server is shutting down");
    else if (srv->n_waiting + srv->running > srv->max_queue) /* it would wait behind max_queue others */
        api_seterr(e, 503, NULL, "the queue is full (%d requests waiting, %d running, --max-queue %d); retry later",
                   srv->n_waiting, srv->running, srv->max_queue);
    if (e->status) return DFL_ERR;
    j->refs = 2; /* the connection + the queue */
    j->state = JOB_QUEUED;
    if (srv->tail) srv->tail->next = j;
    else srv->head = j;
    srv->tail = j;
    srv->n_waiting++;
    pthread_cond_signal(&srv->cv);
    return DFL_OK;
}

void server_hold(dfl_server *srv, int on) {
    pthread_mutex_lock(&srv->mu);
    srv->held = on;
    pthread_cond_signal(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
}

void server_queue_depth(dfl_server *srv, int *waiting, int *running) {
    pthread_mutex_lock(&srv->mu);
    *waiting = srv->n_waiting, *running = srv->running;
    pthread_mutex_unlock(&srv->mu);
}
