/*
 * CUDA-graph replay of the target forward (issue 7).
 *
 * Why: a decode step is hundreds of small launches; on the GPU the host's
 * launch cost (~0.3 ms per layer on the tiny model) dominates. A forward whose
 * launches depend only on the batch's shape (backend static_shapes: no launch
 * sized from host positions; MoE grids sized for the worst routing) can be
 * captured once per shape and replayed: batch_begin writes the step's rows
 * into the backend's fixed device mirror, then one graph launch runs the rest.
 *
 * Key: (rows, seqs, logit rows, taps, streams wanted, greedy ids or logits).
 * The first forward of a key runs eagerly (warm-up: workspaces grow, expert sets are assembled, none
 * of which may happen during capture); the second is captured, then every one
 * replays. Buffers allocated during capture keep their addresses on every
 * replay, so the key's X / logits / taps buffers are recorded with it and read
 * after each replay (then freed: the next replay allocates them again).
 *
 * Capture at start (m->graphs_fixed, set with capture sizes): new shapes are
 * only taken while m->graphs_warming (the runner's warm-up, before the server
 * is ready); afterwards a shape without a graph runs eagerly, so nothing is
 * captured at request time (mixed prefill + decode steps, uneven verify
 * steps, batches beyond the largest size). A graph made stale by a moved
 * batch mirror is still recaptured (the warm-up sizes the mirror for the
 * largest step first, so that does not happen in serving).
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"

#define FG_MAX 512    /* captured shapes kept; further shapes run eagerly */
#define FG_MAX_ROWS 512 /* decode / verify shapes only: prefills run eagerly */
#define FG_MAX_ROWS_PER_SEQ DSV4_GRAPH_MAX_ROWS_PER_SEQ /* a verify step is k+1 rows per sequence; longer chunks are prefills */

typedef struct fg_entry {
    int T, n_seqs, n_logits, n_taps, streams, ids, epoch, seen, failed;
    int32_t *key;     /* logit rows then tap layers */
    void *graph;
    dsv4_buf X, lg, taps; /* buffers the graph allocates (same address every replay) */
} fg_entry;

struct dsv4_fwd_graphs {
    fg_entry e[FG_MAX];
    int n;
};

int dsv4_forward_graphs_count(const dsv4_model *m) {
    int n = 0;
    for (int i = 0; m && m->graphs && i < m->graphs->n; i++) n += m->graphs->e[i].graph != NULL;
    return n;
}

void dsv4_forward_graphs_free(dsv4_model *m) {
    if (m && m->graphs_on && m->n_pad_sizes)
        dsv4_log(DSV4_LOG_INFO,
                 "forward: %llu graph replays, %llu eager forwards (prefill / mixed / uneven steps), %llu captures, "
                 "%llu padded",
                 m->n_path[DSV4_FWD_PATH_REPLAY], m->n_path[DSV4_FWD_PATH_EAGER] + m->n_path[DSV4_FWD_PATH_NOGRAPH] +
                 m->n_path[DSV4_FWD_PATH_WARM], m->n_path[DSV4_FWD_PATH_CAPTURE], m->n_padded);
    if (!m || !m->graphs) return;
    for (int i = 0; i < m->graphs->n; i++) {
        fg_entry *g = &m->graphs->e[i];
        if (g->graph && m->be->graph_free) m->be->graph_free(m->be, g->graph);
        free(g->key);
    }
    free(m->graphs);
    m->graphs = NULL;
}

static int fg_match(const fg_entry *g, const dsv4_batch *b, const dsv4_fwd_out *out, int n_logits, int n_taps) {
    if (g->T != b->n_rows || g->n_seqs != b->n_seqs || g->n_logits != n_logits || g->n_taps != n_taps ||
        g->streams != (out->streams != NULL) || g->ids != (out->ids != NULL))
        return 0;
    if (n_logits && memcmp(g->key, out->logit_rows, sizeof(int32_t) * (size_t)n_logits)) return 0;
    if (n_taps && memcmp(g->key + n_logits, out->tap_layers, sizeof(int32_t) * (size_t)n_taps)) return 0;
    return 1;
}

static void set_path(dsv4_model *m, int path) { __atomic_store_n(&m->last_path, path, __ATOMIC_RELAXED); }

/* Count the path a forward finally took (after dsv4_forward_graph decided). */
void dsv4_forward_path_count(dsv4_model *m) {
    int p = __atomic_load_n(&m->last_path, __ATOMIC_RELAXED);
    if (p >= 0 && p < 5 && !m->graphs_warming) m->n_path[p]++;
}

const char *dsv4_fwd_path_name(int path) {
    static const char *names[] = {"eager", "warm-up", "capture", "replay", "no-graph"};
    return path >= 0 && path < (int)(sizeof names / sizeof names[0]) ? names[path] : "?";
}

int dsv4_forward_graph_shaped(const dsv4_batch *b) {
    return b->n_rows <= FG_MAX_ROWS && b->n_rows <= FG_MAX_ROWS_PER_SEQ * b->n_seqs;
}

int dsv4_forward_graph(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                       dsv4_err *err) {
    dsv4_backend *be = m->be;
    int n_logits = dsv4_fwd_n_logits(out), n_taps = dsv4_fwd_n_taps(out);
    if (!be->graph_begin || !be->graph_end || !be->graph_launch || (m->head_comm && !m->head_comm->capturable) ||
        !dsv4_forward_graph_shaped(b) ||
        (n_taps && !be->hc_mean))
        return 1;
    if (!m->graphs && !(m->graphs = calloc(1, sizeof *m->graphs))) return 1;
    set_path(m, DSV4_FWD_PATH_NOGRAPH); /* until a graph runs or the shape's warm-up says otherwise */
    struct dsv4_fwd_graphs *G = m->graphs;
    fg_entry *g = NULL;
    for (int i = 0; i < G->n && !g; i++)
        if (fg_match(&G->e[i], b, out, n_logits, n_taps)) g = &G->e[i];
    if (!g) {
        if (G->n == FG_MAX || (m->graphs_fixed && !m->graphs_warming)) return 1;
        g = &G->e[G->n];
        memset(g, 0, sizeof *g);
        if (!(g->key = malloc(sizeof(int32_t) * (size_t)(n_logits + n_taps + 1)))) return 1;
        if (n_logits) memcpy(g->key, out->logit_rows, sizeof(int32_t) * (size_t)n_logits);
        if (n_taps) memcpy(g->key + n_logits, out->tap_layers, sizeof(int32_t) * (size_t)n_taps);
        g->T = b->n_rows;
        g->n_seqs = b->n_seqs;
        g->n_logits = n_logits;
        g->n_taps = n_taps;
        g->streams = out->streams != NULL;
        g->ids = out->ids != NULL;
        G->n++;
    }
    if (g->failed) return 1;
    if (g->graph && g->epoch != be->graph_epoch) { /* the batch mirror moved: recapture */
        be->graph_free(be, g->graph);
        g->graph = NULL;
        g->seen = 0;
    }
    if (!g->graph) {
        if (!g->seen++) { /* warm-up: this one runs eagerly */
            set_path(m, DSV4_FWD_PATH_WARM);
            return 1;
        }
        set_path(m, DSV4_FWD_PATH_CAPTURE);
        dsv4_err cerr = {0};
        g->epoch = be->graph_epoch;
        int rc = be->graph_begin(be, &cerr);
        if (rc) {
            g->failed = 1;
            set_path(m, DSV4_FWD_PATH_NOGRAPH);
            return 1;
        }
        g->taps = (dsv4_buf){0}; /* allocated in the capture (a recapture's old one went with its graph) */
        rc = dsv4_forward_launch(m, st, b, out, NULL, &g->X, &g->lg, &g->taps, &cerr);
        void *graph = NULL;
        int erc = be->graph_end(be, &graph, &cerr);
        if (rc || erc || !graph) { /* not capturable: this shape stays eager */
            if (graph) be->graph_free(be, graph);
            dsv4_log(DSV4_LOG_WARN, "forward: CUDA graph capture of %d rows / %d seqs failed (%s); eager",
                     b->n_rows, b->n_seqs, cerr.msg);
            g->failed = 1;
            set_path(m, DSV4_FWD_PATH_NOGRAPH);
            return 1;
        }
        g->graph = graph;
        if (!m->graphs_warming)
            dsv4_log(DSV4_LOG_INFO, "forward: CUDA graph for %d rows / %d seqs / %d logit rows captured", b->n_rows,
                 b->n_seqs, n_logits);
    } else {
        set_path(m, DSV4_FWD_PATH_REPLAY);
    }
    int rc = be->graph_launch(be, g->graph, err);
    dsv4_buf X = g->X, lg = g->lg, taps = g->taps;
    return dsv4_forward_finish(m, out, &X, &lg, &taps, rc, err);
}
