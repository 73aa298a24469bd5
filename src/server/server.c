/* dfl serve: the HTTP front end and the server's lifecycle.
 *
 * libmicrohttpd runs a small pool of threads, each with an epoll loop over its connections, so
 * that thousands of idle connections cost memory, not threads. No handler blocks: a generation
 * request is parsed and tokenized on its HTTP thread, queued (jobs.c), and its connection is
 * suspended until the worker has news for it (server_wake): the end of the job, or stream bytes.
 * A suspended connection does not time out; the reaper thread cancels the job of one whose client
 * went away, and cuts connections whose request does not arrive whole in time. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/kernels.h"
#include "server/server_internal.h"

const int server_statuses[N_STATUS] = {200, 400, 404, 405, 413, 499, 500, 503, 0};

const char *const server_ep_paths[EP_COUNT] = {
    "/v1/completions", "/v1/chat/completions", "/generate", "/tokenize", "/detokenize", "/health",
    "/metrics",        "/v1/models",           "other",
};

/* HTTP threads (each an epoll loop): a request being tokenized holds up only the connections of
 * its thread. */
#define HTTP_THREADS 4

static int ep_is_post(endpoint ep) { return ep <= EP_DETOKENIZE; }

static endpoint route(const char *url) {
    for (int i = 0; i < EP_OTHER; i++)
        if (strcmp(url, server_ep_paths[i]) == 0) return (endpoint)i;
    return EP_OTHER;
}

/* Per-request context (MHD's con_cls): the body as it arrives, then the job of a non-streamed
 * generation while its connection is suspended. */
typedef struct req {
    endpoint ep;
    char *body;
    size_t len, cap, seen;
    int too_big;
    double t0;
    job *j;
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

/* 1 when the peer of fd has closed its side (checked while a request waits, so that a vanished
 * client does not keep the engine busy). */
static int client_gone(int fd) {
    struct pollfd pf = {.fd = fd, .events = POLLRDHUP};
    return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

void server_wake(job *j) {
    if (j->suspended && j->conn) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
}

/* Suspend c until j has news (server_wake). Called on c's HTTP thread, srv->mu held. */
static void conn_suspend(job *j, struct MHD_Connection *c) {
    j->suspended = 1;
    MHD_suspend_connection(c);
}

/* ---- connections: per-address caps with a reserve, the request deadline ---- */

/* A request must arrive whole within --timeout seconds of its start (the connection's, or the
 * previous answer's end on a keep-alive connection), plus one second per REQUEST_MIN_RATE bytes
 * of body received: a client trickling bytes just often enough to beat the inactivity timeout is
 * cut all the same. */
#define REQUEST_MIN_RATE 65536.0

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

static int same_addr(const conn_rec *r, int family, const unsigned char *key, int n) {
    return r->family == family && r->alen == n && memcmp(r->addr, key, (size_t)n) == 0;
}

/* MHD's accept policy: at most --max-connections-per-client from one address, at most
 * --max-connections in all, and the last `reserve` of those only for an address that holds no
 * connection yet: however many addresses fill the rest, a new client (a health check) still gets
 * in. The connection is recorded here, under srv->mu, so that the HTTP threads accepting at once
 * all see it; MHD's STARTED notification claims the record. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *sa, socklen_t len) {
    (void)len;
    dfl_server *srv = cls;
    conn_rec *r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->fd = -1;
    r->alen = addr_key(sa, r->addr, &r->family);
    r->receiving = 1;
    r->t_begin = dfl_now();
    pthread_mutex_lock(&srv->mu);
    int same = 0;
    for (const conn_rec *q = srv->conns; q; q = q->next) same += same_addr(q, r->family, r->addr, r->alen);
    const int total = srv->n_conns;
    const int ok =
        same < srv->per_client && total < srv->max_conns && (same == 0 || total < srv->max_conns - srv->reserve);
    if (ok) {
        r->next = srv->conns;
        if (srv->conns) srv->conns->prev = r;
        srv->conns = r;
        srv->n_conns++;
    }
    pthread_mutex_unlock(&srv->mu);
    if (!ok) free(r);
    return ok ? MHD_YES : MHD_NO;
}

static void conn_unlink(dfl_server *srv, conn_rec *r) {
    if (r->prev) r->prev->next = r->next;
    else srv->conns = r->next;
    if (r->next) r->next->prev = r->prev;
    srv->n_conns--;
}

/* MHD's connection notifications: STARTED claims the record on_accept made for this address,
 * CLOSED comes before the socket is closed (the reaper never shuts down a descriptor that was
 * reused). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    dfl_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        unsigned char key[16];
        int family = 0, n = 0;
        if (ai && ai->client_addr) n = addr_key(ai->client_addr, key, &family);
        pthread_mutex_lock(&srv->mu);
        conn_rec *r = srv->conns;
        while (r && !(r->fd < 0 && same_addr(r, family, key, n))) r = r->next;
        if (r) {
            r->fd = fi ? fi->connect_fd : -1;
            r->t_begin = dfl_now();
            *socket_context = r;
        }
        pthread_mutex_unlock(&srv->mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_rec *r = *socket_context;
        if (!r) return;
        pthread_mutex_lock(&srv->mu);
        conn_unlink(srv, r);
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

/* Cut (shutdown: MHD then sees the end and closes it) every connection whose request has not
 * arrived whole by its deadline; drop the records of admitted connections that MHD never started
 * (it failed to set them up). srv->mu held. */
static void reap_connections(dfl_server *srv, double now) {
    for (conn_rec *r = srv->conns, *next; r; r = next) {
        next = r->next;
        if (r->fd < 0) {
            if (now > r->t_begin + 10) conn_unlink(srv, r), free(r);
        } else if (srv->timeout_s && r->receiving && !r->reaped &&
                   now > r->t_begin + srv->timeout_s + (double)r->got / REQUEST_MIN_RATE) {
            shutdown(r->fd, SHUT_RDWR);
            r->reaped = 1;
            srv->reaped++;
        }
    }
}

/* A suspended connection is not watched by MHD: cancel the job of one whose client went away
 * (queued, or running: its stream waiting for tokens). srv->mu held. */
static void reap_gone_clients(dfl_server *srv) {
    for (job *j = srv->head, *next; j; j = next) {
        next = j->next;
        if (j->suspended && j->fd >= 0 && client_gone(j->fd)) job_cancel(srv, j);
    }
    if (srv->cur && srv->cur->suspended && srv->cur->fd >= 0 && client_gone(srv->cur->fd)) job_cancel(srv, srv->cur);
}

static void *reaper_main(void *arg) {
    dfl_server *srv = arg;
    pthread_mutex_lock(&srv->mu);
    while (!srv->reaper_quit) {
        reap_connections(srv, dfl_now());
        reap_gone_clients(srv);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&srv->idle, &srv->mu, &ts);
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

/* MHD asks for stream bytes: hand over what the worker appended, or end the stream; with nothing
 * yet, suspend the connection until the worker appends more or ends the job (server_wake). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    dfl_server *srv = j->srv;
    ssize_t n = 0;
    pthread_mutex_lock(&srv->mu);
    if (j->sb_off < j->sb_len) {
        n = (ssize_t)(j->sb_len - j->sb_off < max ? j->sb_len - j->sb_off : max);
        memcpy(buf, j->sb + j->sb_off, (size_t)n);
        j->sb_off += (size_t)n;
        pthread_cond_broadcast(&j->cv); /* the worker may wait for the backlog to shrink */
    } else if (j->cancelled) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (j->state == JOB_DONE) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        conn_suspend(j, j->conn);
    }
    pthread_mutex_unlock(&srv->mu);
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

/* A new job for the request, parsed from body (taken); NULL with e filled. */
static job *job_new(dfl_server *srv, const req *r, cJSON *body, api_err *e) {
    job *j = calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(body);
        api_seterr(e, 500, NULL, "out of memory");
        return NULL;
    }
    pthread_cond_init(&j->cv, NULL);
    j->srv = srv;
    j->refs = 1;
    j->fd = -1;
    j->t_start = r->t0;
    j->created = (long)time(NULL);
    const int bad = api_parse_generation(&srv->api, r->ep, body, j, e);
    cJSON_Delete(body);
    if (bad) {
        job_free(j);
        return NULL;
    }
    textout_init(&j->out, srv->tok, j->stops, j->n_stops);
    for (int i = 0; i < j->n_sub; i++) {
        job *c = j->sub[i];
        textout_init(&c->out, srv->tok, c->stops, c->n_stops);
        c->srv = srv, c->t_start = j->t_start, c->created = j->created;
    }
    return j;
}

static enum MHD_Result stream_response(dfl_server *srv, struct MHD_Connection *c, const req *r, const char *method,
                                       const char *url, job *j) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
    if (!resp) {
        pthread_mutex_lock(&srv->mu);
        job_cancel(srv, j);
        j->conn = NULL;
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

/* Parse and queue a generation request. A streamed one is answered at once with a stream that
 * the worker feeds; a non-streamed one's connection is suspended until its job is done, and then
 * answered by finish_generation. */
static enum MHD_Result handle_generation(dfl_server *srv, struct MHD_Connection *c, req *r, const char *method,
                                         const char *url, cJSON *body) {
    api_err e = {0};
    job *j = job_new(srv, r, body, &e);
    if (!j) return send_error(srv, c, r, method, url, &e);
    const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&srv->mu);
    if (job_enqueue(srv, j, &e) != DFL_OK) {
        pthread_mutex_unlock(&srv->mu);
        job_free(j);
        return send_error(srv, c, r, method, url, &e);
    }
    j->conn = c;
    j->fd = fi ? fi->connect_fd : -1;
    if (j->stream) {
        pthread_mutex_unlock(&srv->mu);
        return stream_response(srv, c, r, method, url, j);
    }
    r->j = j;
    conn_suspend(j, c);
    pthread_mutex_unlock(&srv->mu);
    return MHD_YES;
}

/* The connection of a non-streamed generation is resumed: answer it once its job is done. */
static enum MHD_Result finish_generation(dfl_server *srv, struct MHD_Connection *c, req *r, const char *method,
                                         const char *url) {
    job *j = r->j;
    pthread_mutex_lock(&srv->mu);
    if (j->state != JOB_DONE) { /* not yet: wait on */
        conn_suspend(j, c);
        pthread_mutex_unlock(&srv->mu);
        return MHD_YES;
    }
    const int cancelled = j->cancelled;
    pthread_mutex_unlock(&srv->mu);
    api_err e = {0};
    enum MHD_Result ret;
    if (cancelled) {
        record(srv, r, method, url, 499);
        ret = MHD_NO;
    } else if (j->err_status) {
        api_seterr(&e, j->err_status, NULL, "%s", j->err_msg);
        ret = send_error(srv, c, r, method, url, &e);
    } else {
        cJSON *resp = api_response(&srv->api, j);
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
    r->j = NULL;
    pthread_mutex_unlock(&srv->mu);
    return ret;
}

int server_connections(dfl_server *srv) {
    pthread_mutex_lock(&srv->mu);
    const int n = srv->n_conns;
    pthread_mutex_unlock(&srv->mu);
    return n;
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
    if (r->j) return finish_generation(srv, c, r, method, url);
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
        cJSON *o = r->ep == EP_TOKENIZE ? api_tokenize(&srv->api, body, &e) : api_detokenize(&srv->api, body, &e);
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
    if (r->j) { /* closed before its answer */
        job_cancel(srv, r->j);
        r->j->conn = NULL;
        job_unref(r->j);
    }
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
    while (srv->conns) { /* admitted, never started */
        conn_rec *r = srv->conns;
        conn_unlink(srv, r);
        free(r);
    }
    if (srv->have_s) target_state_free(&srv->s);
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
    if (model_open(&srv->m, o->target, o->check_weights | (o->device != DFL_DEVICE_CPU ? DFL_OPEN_FOR_DEVICE : 0)) !=
        DFL_OK)
        return DFL_ERR;
    if (o->device != DFL_DEVICE_CPU) { /* the target's forwards run there (the drafter stays on the CPU) */
        const double t0 = dfl_now();
        if (model_use_device(&srv->m, (dfl_device)o->device) != DFL_OK) return DFL_ERR;
        fprintf(stderr, "dfl serve: target on %s (%.2f GB of weights uploaded in %.1f s)\n",
                dfl_device_name((dfl_device)o->device), srv->m.weight_bytes / 1e9, dfl_now() - t0);
    }
    if (o->drafter) {
        if (anydrafter_open(&srv->ad, o->drafter, &srv->m, o->target, o->block, o->check_weights, srv->drafter_warning,
                            sizeof srv->drafter_warning) != DFL_OK)
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
    if (target_state_init(&srv->s, &srv->m, srv->max_ctx + srv->tree_budget, max_batch, srv->have_ad) != DFL_OK)
        return DFL_ERR;
    srv->have_s = 1;
    if (srv->tree_budget && target_state_enable_tree(&srv->s, srv->tree_budget + 1) != DFL_OK) return DFL_ERR;
    if (srv->have_ad) {
        if (anydrafter_state_init(&srv->ad, &srv->m, srv->max_ctx, &srv->dif) != DFL_OK) return DFL_ERR;
        srv->drafting = 1;
    }
    srv->model_name = o->model_name ? strdup(o->model_name) : default_name(o->target);
    if (!srv->model_name) return dfl_seterr("out of memory");
    srv->api = (api_ctx){.tok = srv->tok,
                         .vocab = srv->m.cfg.vocab,
                         .max_ctx = srv->max_ctx,
                         .tree_budget = srv->tree_budget,
                         .model_name = srv->model_name};
    return DFL_OK;
}

static int listen_start(dfl_server *srv, const dfl_server_opts *o) {
    const char *host = o->host ? o->host : "127.0.0.1";
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    const int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai) return dfl_seterr("cannot resolve host '%s': %s", host, gai_strerror(gai));
    /* Connections are capped in all and per client address, with a reserve for new addresses
     * (on_accept): clients holding idle connections cannot lock others out. Silent connections
     * time out (slow or stalled requests, unread answers); a request waiting for the engine is
     * exempt (its connection is suspended); a request has a deadline to arrive whole (reaper). */
    /* The listening socket is ours, so that a port in use or an address not on this host is
     * reported with the host:port and the reason (libmicrohttpd's own log line names neither). */
    const int v6 = ai->ai_family == AF_INET6;
    char where[320];
    snprintf(where, sizeof where, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", o->port);
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        const int e = errno;
        freeaddrinfo(ai);
        return dfl_seterr("cannot listen on %s: socket: %s", where, strerror(e));
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
        const int e = errno;
        close(fd);
        freeaddrinfo(ai);
        if (e == EADDRINUSE)
            return dfl_seterr("cannot listen on %s: the port is in use (another dfl serve or server? pick another with "
                              "--port, or --port 0 for a free one)",
                              where);
        if (e == EADDRNOTAVAIL)
            return dfl_seterr("cannot listen on %s: %s is not an address of this host", where, host);
        if (e == EACCES)
            return dfl_seterr("cannot listen on %s: permission denied (ports below 1024 need privileges)", where);
        return dfl_seterr("cannot listen on %s: %s", where, strerror(e));
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    freeaddrinfo(ai);
    /* MHD splits its connection limit among the threads, unevenly filled: give each thread the
     * whole of ours, which on_accept enforces exactly */
    srv->mhd = MHD_start_daemon(flags, 0, on_accept, srv, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv,
                                MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_THREAD_POOL_SIZE,
                                (unsigned)HTTP_THREADS, MHD_OPTION_CONNECTION_TIMEOUT, srv->timeout_s,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->max_conns * HTTP_THREADS, MHD_OPTION_END);
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

/* Descriptors beyond the connections: the weights, the tokenizer, logs, MHD's epoll and signal
 * descriptors. */
#define SPARE_FDS 64

/* Raise the open-file limit to what --max-connections needs (up to the hard limit); where the hard
 * limit is lower, lower the caps to fit and say so. */
static void fit_fd_limit(dfl_server *srv) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    const rlim_t need = (rlim_t)srv->max_conns + SPARE_FDS;
    if (rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur >= need || rl.rlim_cur <= 2 * SPARE_FDS) return;
    const int fit = (int)(rl.rlim_cur - SPARE_FDS);
    fprintf(stderr, "dfl serve: --max-connections %d lowered to %d: the open-file limit is %llu (ulimit -n)\n",
            srv->max_conns, fit, (unsigned long long)rl.rlim_cur);
    srv->max_conns = fit;
    srv->reserve = fit / 8;
    if (srv->per_client > fit) srv->per_client = fit;
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

/* A start that failed once the worker runs: the worker stopped (no job was queued yet), then
 * everything freed. */
static void start_failed(dfl_server *srv) {
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    pthread_cond_signal(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    pthread_join(srv->worker, NULL);
    server_free(srv);
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
    metrics_init(srv);
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
    if (pthread_create(&srv->reaper, NULL, reaper_main, srv) != 0) {
        dfl_seterr("cannot start the connection reaper thread: %s", strerror(errno));
        start_failed(srv);
        return NULL;
    }
    srv->have_reaper = 1;
    fit_fd_limit(srv);
    if (listen_start(srv, o) != DFL_OK) {
        reaper_stop(srv);
        start_failed(srv);
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
