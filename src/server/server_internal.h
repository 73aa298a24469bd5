/* Internals of dfl serve shared by server.c (HTTP and lifecycle), jobs.c (the queue and the
 * worker), metrics.c (Prometheus text), api.c (request parsing, response and stream formatting)
 * and textout.c (incremental detokenization with stop strings). */
#ifndef DFL_SERVER_INTERNAL_H
#define DFL_SERVER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dfl/any_drafter.h"
#include "dfl/model.h"
#include "dfl/server.h"
#include "dfl/spec.h"
#include "dfl/tokenizer.h"

struct MHD_Connection;
struct MHD_Daemon;

/* Routed endpoints; EP_OTHER is any unknown path. */
typedef enum endpoint {
    EP_COMPLETIONS,
    EP_CHAT,
    EP_GENERATE,
    EP_TOKENIZE,
    EP_DETOKENIZE,
    EP_HEALTH,
    EP_METRICS,
    EP_MODELS,
    EP_OTHER,
    EP_COUNT
} endpoint;

/* HTTP statuses the server answers with (metrics rows); 499 = the client went away first. */
#define N_STATUS 9
extern const int server_statuses[N_STATUS];
/* The endpoints' paths, by endpoint ("other" for EP_OTHER). */
extern const char *const server_ep_paths[EP_COUNT];

/* What api.c needs of the server: the tokenizer and the limits requests are checked against. */
typedef struct api_ctx {
    const dfl_tokenizer *tok;
    int vocab;
    int max_ctx;
    int tree_budget; /* 0 = chain verification; > 0: greedy requests only */
    const char *model_name;
} api_ctx;

/* An error answer: status, OpenAI-style type, message, and the offending field if any. */
typedef struct api_err {
    int status;
    const char *type;
    char param[64]; /* "" when no single field is at fault */
    char msg[320];
} api_err;

/* Decoded output of a request: the text of ids[0..clean) is final (it does not end inside a
 * UTF-8 character); stop strings are searched in it as tokens arrive. */
typedef struct textout {
    const dfl_tokenizer *tok;
    int32_t *ids;
    int n, cap;
    char *text;
    size_t len, tcap;
    int clean;
    char **stops;
    int n_stops;
    long stop_at; /* byte offset where the earliest stop string starts; -1 = none */
    int stop_idx; /* which stop string */
} textout;

void textout_init(textout *t, const dfl_tokenizer *tok, char **stops, int n_stops);
void textout_free(textout *t);
/* Append one generated token. Returns 1 when a stop string is now complete, 0 otherwise,
 * DFL_ERR when out of memory. */
int textout_push(textout *t, int32_t id);
/* Bytes of text that may be sent while streaming: final text that cannot be the start of a
 * stop string (text before a found stop string once there is one). */
size_t textout_safe(const textout *t);
/* The whole output text (up to the stop string when one was found); malloc'd. */
char *textout_final(const textout *t);

typedef enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state;

/* One generation request. Shared by its connection (an HTTP thread) and the worker; every field
 * after "progress" is guarded by the server mutex, the outputs belong to the worker until JOB_DONE. */
typedef struct job {
    struct job *next;
    struct dfl_server *srv;
    endpoint ep;
    /* request */
    int32_t *prompt;
    int n_prompt;
    int max_new;
    float temperature;
    float top_p; /* 1 = off */
    int top_k;   /* 0 = off */
    uint64_t seed;
    int seed_given; /* 0: the server draws one */
    int ignore_eos;
    char **stops;
    int n_stops;
    int stream, include_usage;
    int logprobs;    /* completions: top alternatives per token (0..20); -1 = no logprobs */
    int echo;        /* completions: the prompt is prepended to the text (and scored) */
    char *echo_text; /* the prompt as echoed: the request's string, or its ids decoded */
    /* /v1/completions with a list of prompts: one sub-job per prompt (choice `index`), run in
     * order by the worker as part of this job, which is queued, cancelled and answered as one
     * request and has no prompt of its own (n_prompt: the longest prompt's, for the checks) */
    struct job **sub;
    int n_sub;
    int index;
    char id[48];
    long created;
    double t_start;
    /* progress */
    int refs;
    job_state state;
    int cancelled;     /* the client went away (or the server stops): stop generating */
    pthread_cond_t cv; /* signalled on state changes and new stream data */
    struct MHD_Connection *conn;
    int suspended; /* conn is suspended until this job has news for it (server_wake) */
    int fd;        /* the connection's socket (streams: how much the client has not read) */
    /* stream buffer: SSE bytes not yet handed to the connection */
    char *sb;
    size_t sb_len, sb_off, sb_cap;
    /* outputs */
    textout out;
    int stream_ids;     /* tokens already sent in chunks */
    size_t stream_text; /* text bytes already sent */
    dfl_gen_stats st;
    int *acc_len; /* committed tokens per round */
    int n_rounds, cap_rounds;
    const char *finish; /* "stop" or "length" */
    int err_status;     /* 0, or the status of a failed generation */
    char err_msg[320];
    double t_done;
    double t_last_tokens; /* when on_tokens last ran (0: no token yet), worker only */
    /* logprobs (log_softmax of the target's logits at temperature 1), logprobs >= 0 only:
     * entry p < n_prompt is prompt token p (p >= 1, with echo), n_prompt + i output token i */
    float *lp;       /* [n_prompt + max_new] the token's logprob; NAN = none */
    int32_t *top_id; /* [(n_prompt + max_new) * logprobs] most probable first */
    float *top_lp;
} job;

/* log_softmax of row [V] at `token`, and the k most probable ids (most probable first, ties by
 * lower id) with their logprobs; k <= 20. */
float api_logprobs_row(const float *row, int V, int32_t token, int k, int32_t *top_id, float *top_lp);

/* A Prometheus histogram with fixed upper bounds (+Inf implied). */
#define SERVER_HIST_MAX 24
typedef struct server_hist {
    const double *bounds;
    int n_bounds;
    long count, buckets[SERVER_HIST_MAX]; /* buckets[i]: observations <= bounds[i] (not cumulative) */
    double sum;
} server_hist;

/* One open HTTP connection (MHD's socket context), in the server's list under srv->mu: its client
 * address (the per-address caps) and the deadline of the request it is receiving. Recorded when
 * the accept policy admits it (fd -1), claimed by MHD's STARTED notification (fd set). */
typedef struct conn_rec {
    struct conn_rec *next, *prev;
    int fd;
    int family, alen;
    unsigned char addr[16];
    int receiving;  /* 1 from the connection's start (or its previous answer's end) until a
                     * whole request is in */
    double t_begin; /* when the request began (connection start, or the previous answer's end) */
    size_t got;     /* body bytes received of the current request */
    int reaped;     /* shut down for missing its deadline */
} conn_rec;

struct dfl_server {
    dfl_model m;
    dfl_target_state s;
    int have_s;
    dfl_any_drafter ad;        /* the drafter (DFlash, DFlash2 or an MTP head) and its run state */
    char drafter_warning[512]; /* what the user should know about the drafter/target pair, "" if nothing */
    int have_ad;
    dfl_draft_if dif; /* the drafter the jobs use (ad's run state) */
    int drafting;     /* a drafter state exists */
    dfl_tokenizer *tok;
    char *model_name;
    int block, max_ctx, max_queue, log;
    api_ctx api;        /* what api.c reads */
    unsigned timeout_s; /* the connections' inactivity timeout (0 = none) */
    int held;           /* server_hold: the worker starts no job */
    int tree_budget;    /* 0 = chain verification, N = DDTree-N */
    size_t max_body;
    struct MHD_Daemon *mhd;
    int port;
    pthread_t worker;
    int have_worker;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the worker waits here for work */
    job *head, *tail;
    job *cur; /* the request being generated, NULL when idle */
    int n_waiting, running, stopping;
    conn_rec *conns; /* open connections (NOTIFY_CONNECTION STARTED .. CLOSED) */
    int n_conns, max_conns, per_client, reserve;
    pthread_t reaper; /* closes connections past their request deadline, cancels jobs whose
                       * suspended connection's client went away */
    int have_reaper, reaper_quit;
    long reaped, stalled; /* metrics: connections cut at the request deadline; streams stopped unread */
    int active;           /* HTTP requests between their first byte and their completion */
    pthread_cond_t idle;  /* signalled when active drops to 0 */
    uint64_t seed_ctr;    /* seeds for requests that give none */
    unsigned long next_id;
    /* metrics */
    long http[EP_COUNT][N_STATUS];
    long cancelled;
    long prompt_tokens, gen_tokens, requests_ok;
    long rounds, drafts, draft_tokens, accepted_tokens;
    long acc_pos[DFL_MAX_BLOCK];
    server_hist ttft, itl, e2e; /* vLLM's latency histograms, seconds */
};

/* api.c — parse a generation request body into j (prompt, options); fills e on error.
 * Runs on an HTTP thread; the tokenizer is thread-safe. */
int api_parse_generation(const api_ctx *cx, endpoint ep, cJSON *body, job *j, api_err *e);
/* /tokenize and /detokenize: the response object, or NULL with e filled. */
cJSON *api_tokenize(const api_ctx *cx, cJSON *body, api_err *e);
cJSON *api_detokenize(const api_ctx *cx, cJSON *body, api_err *e);
/* The final response of a finished, non-streamed job. */
cJSON *api_response(const api_ctx *cx, const job *j);
/* SSE bytes for a streamed job: the first event (chat: the assistant role), a chunk with the new
 * tokens and text, the closing events (last chunk with finish_reason, usage, [DONE]), or an
 * error event. malloc'd "data: ...\n\n" strings; NULL when there is nothing to send. */
char *api_stream_start(const api_ctx *cx, const job *j);
char *api_stream_chunk(const api_ctx *cx, const job *j, int ids_from, size_t text_from, size_t text_to);
char *api_stream_end(const api_ctx *cx, const job *j, int ids_from, size_t text_from);
char *api_stream_error(const job *j);
/* {"error": {"message", "type", "param", "code"}} */
char *api_error_body(const api_err *e);
void api_seterr(api_err *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* jobs.c — the queue and the worker. srv->mu held where noted. */
void job_free(job *j);
void job_unref(job *j); /* srv->mu held */
/* Admit j to the queue (its seed and id drawn), or fill e (503: full, or shutting down). srv->mu held. */
int job_enqueue(struct dfl_server *srv, job *j, api_err *e);
/* A job that will never run: answer it with an error, drop the queue's ref. srv->mu held. */
void job_abandon(struct dfl_server *srv, job *j, int status, const char *msg);
/* The client went away: a queued job leaves the queue, a running one stops. srv->mu held. */
void job_cancel(struct dfl_server *srv, job *j);
void *worker_main(void *arg);
/* Wait on cv for at most 100 ms. */
void wait_a_bit(pthread_cond_t *cv, pthread_mutex_t *mu);

/* server.c — j has news (state, stream bytes): resume its suspended connection. srv->mu held. */
void server_wake(job *j);

/* metrics.c */
void metrics_init(struct dfl_server *srv);
void metrics_observe(server_hist *h, double v); /* srv->mu held */
/* Count a finished generation (a request, or one prompt of a list). srv->mu held. */
void metrics_account(struct dfl_server *srv, const job *j);
/* The /metrics page; malloc'd. */
char *metrics_text(struct dfl_server *srv);

/* Hold the worker (on = 1: it starts no new job; queued requests wait) or release it: lets a
 * caller bring the queue into a known state (tests of admission and overflow). */
void server_hold(struct dfl_server *srv, int on);
/* Requests waiting in the queue and running (0 or 1) now. */
void server_queue_depth(struct dfl_server *srv, int *waiting, int *running);
/* Connections the HTTP daemon holds open now (a closed client is counted until MHD sees it). */
int server_connections(struct dfl_server *srv);

#endif
