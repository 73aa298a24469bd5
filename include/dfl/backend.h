/* Compute backends behind the target model API (docs/backends.md).
 *
 * A backend runs the target's forward where its weights live: the CPU backend is the code of
 * src/models/forward.c (weights read in place from the mmap), the CUDA backend
 * (src/backend/cuda/, built with -DDFL_CUDA=ON) uploads the weights to one GPU once and keeps
 * caches, recurrent states and scratch there. Callers never see the difference: model_forward,
 * model_forward_tree, target_state_rollback, target_state_tree_commit and the state_* calls of dfl/model.h
 * dispatch on the device the model was put on (model_use_device). A second backend fills one
 * dfl_backend table and registers it in src/backend/backend.c. */
#ifndef DFL_BACKEND_H
#define DFL_BACKEND_H

#include <stdint.h>

typedef enum dfl_device { DFL_DEVICE_CPU = 0, DFL_DEVICE_CUDA = 1, DFL_DEVICE_COUNT } dfl_device;

struct dfl_model;
struct dfl_target_state;
struct dfl_capture;

/* Captured features where the target's backend keeps them: up to `rows` rows of `width` floats,
 * one a token (the capture layers' outputs side by side, as dfl_capture.out). A forward whose
 * dfl_capture names a dfl_feat (.to) writes token t's row to row t there. On the CPU the rows are
 * host memory; a device backend keeps them in its memory, gathers an accepted path there and sends
 * rows to the host only when someone reads them (dfl_feat_read): of a tree round only the accepted
 * path crosses the bus, and nothing does for a drafter on the same device. */
typedef struct dfl_feat {
    dfl_device device; /* whose memory */
    int rows, width;
    float *host; /* [rows, width] on the host (the CPU's), else NULL */
    void *dev;   /* [rows, width] in a device backend's memory, else NULL */
    int owned;   /* allocated by dfl_feat_alloc (dfl_feat_free frees it), else a view of host rows */
} dfl_feat;

/* What one forward gives back. logits: [rows, V] on the host, or NULL; last_only: only the last
 * token's row (rows = 1). argmax: [rows] ids on the host, or NULL: the greedy token of each row
 * (the first index of its largest value, as kn_argmax). logits_scratch: the caller reads argmax
 * only, logits is scratch that a device backend may leave unwritten (only the ids cross the
 * bus). cap: hidden-state capture (rows per token). */
typedef struct dfl_fwd_out {
    float *logits;
    int32_t *argmax;
    int last_only;
    int logits_scratch;
    const struct dfl_capture *cap;
    /* top_k > 0: each row's top_k most probable tokens, most probable first (ties: the lower id),
     * into top_ids [rows, top_k], and their log-probabilities into top_lp [rows, top_k]
     * (kn_logsoftmax_top). With logits_scratch only these and the ids need leave the device; the
     * CUDA backend still sends the logits and they are summarized on the host. */
    int top_k;
    int32_t *top_ids;
    float *top_lp;
} dfl_fwd_out;

/* The forward-level interface. parent: NULL for a chain of n tokens, else a tree of n nodes
 * (node 0 the root with parent -1, parent[i] < i). Every function returns DFL_OK or DFL_ERR
 * with the message set. */
typedef struct dfl_backend {
    const char *name;
    /* Put the model's weights where the backend computes (once per model); release them. */
    int (*model_upload)(struct dfl_model *m);
    void (*model_release)(struct dfl_model *m);
    int (*target_state_init)(struct dfl_target_state *s, const struct dfl_model *m, int max_ctx, int max_batch,
                             int record);
    void (*target_state_free)(struct dfl_target_state *s);
    void (*target_state_reset)(struct dfl_target_state *s);
    int (*forward)(struct dfl_target_state *s, const int32_t *tokens, const int *parent, int n, const dfl_fwd_out *out);
    int (*rollback)(struct dfl_target_state *s, int keep);
    int (*enable_tree)(struct dfl_target_state *s, int max_nodes);
    void (*disable_tree)(struct dfl_target_state *s);
    int (*tree_commit)(struct dfl_target_state *s, const int *path, int len);
    /* Optional (NULL on the CPU, whose probe is dfl bench's own): the device memory's read
     * bandwidth over a buffer of `bytes`, median and fastest of several passes, GB/s. */
    int (*probe)(uint64_t bytes, double *median_gbps, double *best_gbps);
    /* The device in words ("NVIDIA H200, 139.8 GiB, driver 13.0"), into buf. */
    void (*describe)(char *buf, int len);
    /* Feature rows in the device's memory (dfl_feat; NULL on the CPU, whose rows are host memory
     * handled by dfl_feat_*): allocate f->rows x f->width into f->dev, free it, move row idx[k] to
     * row k for k < n (checked: ascending, idx[k] >= k), copy rows row0.. row0+n-1 to the host. */
    int (*feat_alloc)(dfl_feat *f);
    void (*feat_free)(dfl_feat *f);
    int (*feat_gather)(dfl_feat *f, const int *idx, int n);
    int (*feat_read)(const dfl_feat *f, int row0, int n, float *dst);
} dfl_backend;

/* rows x width feature rows in device d's memory (zeroed on the host; a device's are undefined
 * until written). DFL_ERR naming the size on failure. */
int dfl_feat_alloc(dfl_feat *f, dfl_device d, int rows, int width);
/* A handle over host rows the caller owns ([rows, width]; dfl_feat_free leaves them alone). */
dfl_feat dfl_feat_view(float *host, int rows, int width);
void dfl_feat_free(dfl_feat *f);
/* Row idx[k] to row k, k < n: an accepted path's rows (idx ascending, idx[k] >= k, < rows) to the
 * front, where they stay (no copy for idx[k] == k). */
int dfl_feat_gather(dfl_feat *f, const int *idx, int n);
/* Rows row0 .. row0+n-1 to the host: dst [n, width]. */
int dfl_feat_read(const dfl_feat *f, int row0, int n, float *dst);
/* Rows row0 .. row0+n-1 as host memory: the rows themselves when f is on the host, else read into
 * stage [n, width] (which must hold them) and stage returned; NULL on error (message set). */
const float *dfl_feat_host_rows(const dfl_feat *f, int row0, int n, float *stage);

/* "cpu" / "cuda". */
const char *dfl_device_name(dfl_device d);
/* 1 if this build has the device's backend. */
int dfl_device_built(dfl_device d);
/* The devices this build has, space-separated ("cpu cuda"). */
const char *dfl_devices_built(void);
/* "cpu" | "cuda" -> device; DFL_ERR naming the devices this build has on other names or on a
 * device this build lacks. */
int dfl_device_parse(const char *name, dfl_device *out);
/* Whether the device can run now (CUDA: a GPU and driver answer); DFL_ERR with the reason. */
int dfl_device_check(dfl_device d);
/* The backend table of a device (NULL when not built). */
const dfl_backend *dfl_backend_of(dfl_device d);

#endif
