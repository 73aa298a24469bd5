/* dfl serve: an HTTP server for speculative decoding speaking the APIs evaluation harnesses
 * call — OpenAI /v1/completions and /v1/chat/completions, SGLang /generate, /tokenize,
 * /detokenize, /health, Prometheus /metrics (docs/serve.md).
 *
 * The engine runs one sequence at a time: requests are queued and served in arrival order by a
 * single worker thread that owns the model state (no batching). HTTP connections are handled
 * by libmicrohttpd's epoll loops on a small pool of threads; a connection waiting for the engine
 * is suspended, not a blocked thread. */
#ifndef DFL_SERVER_H
#define DFL_SERVER_H

#include <stddef.h>

typedef struct dfl_server_opts {
    const char *target;       /* target checkpoint directory */
    const char *drafter;      /* DFlash drafter directory, "mtp" or "DIR:mtp" (an MTP head); NULL = autoregressive */
    const char *tokenizer;    /* tokenizer.json or a directory holding one; NULL = the target's */
    const char *model_name;   /* the "model" of responses and metrics; NULL = target dir basename */
    int block;                /* verification block; 0 = the drafter's block_size */
    int tree_budget;          /* 0 = chain verification; N = DDTree with N draft nodes (greedy requests only) */
    const char *block_attn;   /* a DFlash drafter's block attention (drafter_causal_parse: "sliding-causal",
                               * "bidirectional", "causal"); NULL or "auto" = the checkpoint's config */
    const char *host;         /* address to bind (numeric or a name); NULL = 127.0.0.1 */
    int port;                 /* 0 = a free port chosen by the system (see server_port) */
    int max_queue;            /* generation requests that may wait behind the running one */
    int max_context;          /* positions per sequence (prompt + output); 0 = default */
    size_t max_body;          /* request body limit in bytes */
    int timeout_s;            /* seconds a connection may stay silent (sending its request or reading the
                               * answer; not while its request waits or runs), a request has to arrive
                               * whole (plus 1 s per 64 KiB of body), and a stream's backlog may stay
                               * unread; 0 = never time out */
    int max_conns;            /* open connections in all (each holds a descriptor: the open-file limit is
                               * raised to fit, or this lowered with a warning); more are closed at accept;
                               * the last max_conns / 8 only for addresses that hold none */
    int max_conns_per_client; /* open connections from one client address */
    int check_weights;        /* scan the weights for NaN/Inf at load */
    int device;               /* dfl_device (dfl/backend.h) the target's forwards run on; 0 = the CPU */
    int log_requests;         /* one line per request on stderr */
} dfl_server_opts;

#define DFL_SERVE_DEFAULT_QUEUE 64
#define DFL_SERVE_DEFAULT_CONTEXT 4096 /* capped by the model's max_position_embeddings */
#define DFL_SERVE_DEFAULT_BODY (8u << 20)
#define DFL_SERVE_DEFAULT_TIMEOUT 60
#define DFL_SERVE_DEFAULT_CONNS 4096
#define DFL_SERVE_DEFAULT_CONNS_PER_CLIENT 64

typedef struct dfl_server dfl_server;

/* Defaults: loopback, port 0, the DFL_SERVE_DEFAULT_* limits, everything else unset. */
void server_opts_default(dfl_server_opts *o);

/* Load the models, allocate the run state, bind and start serving. NULL + dfl_errmsg() on
 * error (bad checkpoint, drafter/target mismatch, address in use, ...). */
dfl_server *server_start(const dfl_server_opts *o);

/* The bound TCP port (the chosen one when opts.port was 0). */
int server_port(const dfl_server *s);
/* The context size in effect (positions per sequence). */
int server_max_context(const dfl_server *s);
/* What the user should know about the drafter/target pair that still runs (its num_target_layers
 * differs from the target's layer count); "" when nothing. */
const char *server_drafter_warning(const dfl_server *s);
/* The drafter's block attention (drafter_attn_semantics); "" without a DFlash / DFlash2 drafter. */
const char *server_drafter_attn(const dfl_server *s);

/* Drain and free: new requests get 503, queued ones are answered 503 ("shutting down"), the
 * one being generated runs to its end and is delivered; then the daemon stops and every
 * connection is closed. */
void server_stop(dfl_server *s);

#endif
