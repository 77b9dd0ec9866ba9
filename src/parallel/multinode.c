/*
 * Multi-node serving (multinode.h): rendezvous, communicator, per-node rank
 * open with a cross-node KV pool check, then leader / follower.
 *
 * Why the pool check: node 0's engine maps page ids once and the step plans
 * carry them to every node (tp_plan.h); a follower started with another
 * --max-model-len, --max-num-seqs, --block-size or KV budget would hold a
 * differently sized pool and write other pages — wrong tokens, not an error.
 * The rendezvous cannot see those options (its wire format carries the model
 * and the build), so the nodes compare the pools they actually built.
 */
#include "parallel/multinode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h" /* DSV4_MAX_GRAPH_SIZES */
#include "parallel/rendezvous.h"
#include "parallel/tp_plan.h"
#include "parallel/tp_runner.h"

struct dsv4_multinode {
    dsv4_multinode_opts o;
    dsv4_comm *c;          /* the plans' communicator, rank = node rank (per_node 1: also the model's) */
    int per_node;          /* tensor-parallel ranks on each node (tp_size / nnodes) */
    dsv4_comm **ranks;     /* per_node > 1: this node's model communicators until the TP runner takes them */
    dsv4_tp_runner *tp;    /* per_node > 1: this node's ranks as threads */
    dsv4_model_runner *mr; /* per_node 1, node 0: the caller's runner (not ours), for config / drafter */
    dsv4_plan_leader *leader;
};

/* What must agree across nodes, as one rank built it. */
/* causes before consequences: a different --max-model-len also changes the page count. The last four
 * shape the start-up warm-up (tp_plan.c lead_warmup), whose forwards every node runs in lock step: nodes
 * that would run different steps must be refused here, before their all-reduces diverge. */
enum { P_MAX_LEN, P_SLOTS, P_MAX_SPEC, P_VOCAB, P_PAGE_TOKENS, P_PAGES, P_WARM_MODE, P_GRAPH_SHAPES, P_WARM_ROWS,
       P_WARM_PREFILL, P_N };
static const char *const P_NAME[P_N] = {"--max-model-len", "request slots (--max-num-seqs + prefix-cache slots)",
                                        "speculative tokens (--speculative-config)", "vocabulary",
                                        "tokens per KV page (--block-size)",
                                        "KV pages (--kv-cache-memory-bytes / --num-gpu-blocks-override)",
                                        "warm-up mode (CUDA graphs 2 + eager warm-up 1: --enforce-eager, DSV4_WARMUP)",
                                        "CUDA graph shapes (--cuda-graph-sizes / --compilation-config)",
                                        "rows of the largest step (--max-num-batched-tokens)",
                                        "warm-up prefill steps (DSV4_WARMUP_PREFILL)"};
/* fields compared as digests (dsv4_rdv_hash): the message names them without printing the numbers */
static int p_digest(int f) { return f == P_GRAPH_SHAPES || f == P_WARM_PREFILL; }

static void pool_of(const dsv4_runner *it, const dsv4_model_runner_opts *o, int64_t *p) {
    p[P_SLOTS] = it->n_slots;
    p[P_VOCAB] = it->vocab;
    p[P_PAGE_TOKENS] = it->set_pages ? it->page_tokens : 0;
    p[P_PAGES] = it->set_pages ? it->n_pages : 0;
    p[P_MAX_LEN] = o->max_len;
    p[P_MAX_SPEC] = o->max_spec;
    p[P_WARM_MODE] = 2 * o->cuda_graphs + (o->warm_eager != 0);
    /* the capture sizes, rows per sequence and their size limits, as one list of counts and values */
    int shapes[2 + DSV4_MAX_GRAPH_SIZES + 2 * 16] = {0}, n = 0;
    const int ns = o->graph_sizes && o->n_graph_sizes > 0 ? o->n_graph_sizes : 0;
    const int nr = o->graph_rows && o->n_graph_rows > 0 ? o->n_graph_rows : 0;
    shapes[n++] = ns;
    for (int i = 0; i < ns && n < 1 + DSV4_MAX_GRAPH_SIZES; i++) shapes[n++] = o->graph_sizes[i];
    shapes[n++] = nr;
    for (int i = 0; i < nr && i < 16; i++) {
        shapes[n++] = o->graph_rows[i];
        shapes[n++] = o->graph_rows_max_seqs ? o->graph_rows_max_seqs[i] : 0;
    }
    p[P_GRAPH_SHAPES] = (int64_t)(dsv4_rdv_hash(shapes, sizeof(int) * (size_t)n) >> 1);
    p[P_WARM_ROWS] = o->warm_rows;
    const char *wp = getenv("DSV4_WARMUP_PREFILL");
    p[P_WARM_PREFILL] = (int64_t)(dsv4_rdv_hash(wp ? wp : "", wp ? strlen(wp) : 0) >> 1);
}

/*
 * Every rank: ranks 1..N-1 each broadcast their pool (node 0 compares), then
 * node 0 broadcasts the verdict. The same sequence of collectives on every
 * rank, so a mismatch fails everywhere with node 0's message.
 */
static int check_pools(dsv4_comm *c, const int64_t *mine, dsv4_err *err) {
    char verdict[256] = "";
    for (int r = 1; r < c->size; r++) {
        int64_t p[P_N];
        memcpy(p, mine, sizeof p);
        int rc = c->broadcast(c, p, sizeof p, r, err);
        if (rc) return rc;
        if (c->rank != 0 || verdict[0]) continue;
        for (int f = 0; f < P_N; f++)
            if (p[f] != mine[f] && p_digest(f)) {
                snprintf(verdict, sizeof verdict, "node %d and node 0 differ in %s: start every node with the same "
                         "serving flags and environment", r, P_NAME[f]);
                break;
            } else if (p[f] != mine[f]) {
                snprintf(verdict, sizeof verdict,
                         "node %d has %lld %s, node 0 has %lld: start every node with the same serving flags%s", r,
                         (long long)p[f], P_NAME[f], (long long)mine[f],
                         /* dsv4 run has no --max-model-len: its prompt and flags size it */
                         f == P_MAX_LEN ? " (dsv4 run: the same --prompt, --max-tokens and --spec, which size it)"
                                        : "");
                break;
            }
    }
    int rc = c->broadcast(c, verdict, sizeof verdict, 0, err);
    if (rc) return rc;
    verdict[sizeof verdict - 1] = 0;
    if (verdict[0]) return dsv4_err_set(err, DSV4_EINVAL, "multi-node: %s", verdict);
    return 0;
}

static int config_hash(const dsv4_multinode_opts *o, uint64_t *h, dsv4_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_err_set(err, DSV4_EIO, "%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t extra = o->hf_overrides ? strlen(o->hf_overrides) + 1 : 0;
    char *buf = malloc((size_t)(n > 0 ? n : 0) + extra + 1);
    if (!buf) {
        fclose(f);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (extra) { /* --hf-overrides change the model as much as config.json does */
        buf[got] = 0;
        memcpy(buf + got + 1, o->hf_overrides, extra - 1);
    }
    *h = dsv4_rdv_hash(buf, got + extra);
    free(buf);
    return 0;
}

/*
 * Several ranks per node (per_node k > 1): two groups.
 *   - the plans: one TCP rank per node on --master-port + 1 (rank = node), as
 *     with one rank per node — node 0's engine thread broadcasts each step
 *     plan to the other nodes' main threads, which hand it to their local
 *     ranks (tp_runner.h job board);
 *   - the model: ranks node·k + i, i = 0..k-1 (GPU i with --device cuda),
 *     NCCL over the rendezvous id, or TCP on --master-port + 2.
 * Why the TCP model group gives every rank its own connection to rank 0
 * rather than one connection per node with an in-process group in front: the
 * star then sums the partials of all tp_size ranks in rank order, the exact
 * order (and so the exact bits) of the one-process local communicator and of
 * one rank per node — no second summation order to keep bit-identical — and
 * comm_tcp.c needs no new code path. The cost is k - 1 loopback hops on node
 * 0 and k connections per node, immaterial at the row sizes CPU ranks reduce
 * (GPUs use NCCL). Why a separate plan group: a plan is for the node, not for
 * a rank; broadcasting it over the model group would make every local rank
 * enter each plan broadcast, i.e. a second job board inside the first.
 */
static int join_ranks(dsv4_multinode *m, const uint8_t *id, dsv4_err *err) {
    const dsv4_multinode_opts *o = &m->o;
    int k = m->per_node, first = o->node_rank * k;
    double to = o->timeout_s > 0 ? o->timeout_s : DSV4_RDV_DEFAULT_TIMEOUT_S;
    int rc = dsv4_comm_tcp_create(o->master_addr, o->master_port + 1, o->node_rank, o->nnodes, to, &m->c, err);
    if (rc) return dsv4_err_prefix(err, "step plans: "), rc;
    if (!(m->ranks = calloc((size_t)k, sizeof *m->ranks))) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    } else if (o->use_nccl) {
        rc = dsv4_comm_nccl_create_ranks(first, k, o->tp_size, id, m->ranks, err);
    } else {
        rc = dsv4_comm_tcp_create_ranks(o->master_addr, o->master_port + 2, first, k, o->tp_size, to, m->ranks, err);
    }
    if (rc) {
        m->c->abort(m->c); /* the other nodes may be waiting in their model group's setup: fail them */
        m->c->free(m->c);
        free(m->ranks);
        return rc;
    }
    dsv4_log(DSV4_LOG_INFO,
             "node %d of %d: %s communicator up (%d ranks, %d per node: ranks %d..%d here), step plans over tcp",
             o->node_rank, o->nnodes, m->ranks[0]->name, o->tp_size, k, first, first + k - 1);
    return 0;
}

int dsv4_multinode_join(const dsv4_multinode_opts *o, dsv4_multinode **out, dsv4_err *err) {
    *out = NULL;
    if (o->nnodes < 2) return dsv4_err_set(err, DSV4_EINVAL, "multi-node: --nnodes %d (need 2 or more)", o->nnodes);
    if (!o->use_nccl && o->master_port >= 65535)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "multi-node: --master-port %d: the TCP communicator listens on --master-port + 1",
                            o->master_port);
    uint64_t h;
    int rc = config_hash(o, &h, err);
    if (rc) return rc;
    uint8_t id[DSV4_RDV_ID_BYTES] = {0};
    if (o->use_nccl && o->node_rank == 0 && (rc = dsv4_nccl_unique_id(id, err))) return rc;
    /* the build id: what step plans and collectives put on the wire in host order must read the same on
     * every node (tp_plan.h, comm_tcp.c) — the plan format version and the byte order. Nodes built from
     * different commits with the same formats may join (DGX Spark pairs are often built one by one). */
    const uint16_t one = 1;
    char build[64];
    snprintf(build, sizeof build, "dsv4 plan-v1 tcp-v1 %s-endian, %zu-byte size_t",
             *(const uint8_t *)&one ? "little" : "big", sizeof(size_t));
    dsv4_rdv_opts ro = {o->master_addr, o->master_port, o->nnodes, o->node_rank, o->tp_size, h, build, o->timeout_s};
    dsv4_log(DSV4_LOG_INFO, "node %d of %d: rendezvous at %s:%d", o->node_rank, o->nnodes, o->master_addr,
             o->master_port);
    if ((rc = dsv4_rendezvous(&ro, id, err))) return rc;
    /* after the rendezvous, so that nodes launched with different sizes hear that (naming the node) first */
    if (o->tp_size < o->nnodes || o->tp_size % o->nnodes)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "multi-node: --tensor-parallel-size %d with --nnodes %d: the ranks are spread evenly over "
                            "the nodes (--tensor-parallel-size / --nnodes on each), so --tensor-parallel-size must be "
                            "a multiple of --nnodes",
                            o->tp_size, o->nnodes);
    int k = o->tp_size / o->nnodes;
    if (k > 64) return dsv4_err_set(err, DSV4_EINVAL, "multi-node: %d ranks per node (at most 64)", k);
    if (k > 1 && o->master_port >= 65535 - (o->use_nccl ? 0 : 1))
        return dsv4_err_set(err, DSV4_EINVAL,
                            "multi-node: --master-port %d: with several ranks per node the communicators listen on "
                            "--master-port + 1%s",
                            o->master_port, o->use_nccl ? "" : " and + 2");
    dsv4_multinode *m = calloc(1, sizeof *m);
    if (!m) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    m->o = *o;
    m->per_node = k;
    if (k > 1) {
        if ((rc = join_ranks(m, id, err))) {
            free(m);
            return rc;
        }
        *out = m;
        return 0;
    }
    if (o->use_nccl)
        rc = dsv4_comm_nccl_create(o->node_rank, o->nnodes, id, &m->c, err);
    else
        rc = dsv4_comm_tcp_create(o->master_addr, o->master_port + 1, o->node_rank, o->nnodes,
                                  o->timeout_s > 0 ? o->timeout_s : DSV4_RDV_DEFAULT_TIMEOUT_S, &m->c, err);
    if (rc) {
        free(m);
        return rc;
    }
    dsv4_log(DSV4_LOG_INFO, "node %d of %d: %s communicator up (%d ranks, one per node)", o->node_rank, o->nnodes,
             m->c->name, m->c->size);
    *out = m;
    return 0;
}

dsv4_comm *dsv4_multinode_comm(dsv4_multinode *m) { return m->c; }

/*
 * per_node > 1: this node's ranks as a TP runner over the model communicators
 * (taken over by it). TCP ranks run on the CPU (--device auto included: k
 * ranks would otherwise all pick GPU 0); NCCL ranks on GPUs 0..k-1.
 */
static int open_ranks(dsv4_multinode *m, const char *dir, const dsv4_model_runner_opts *o, const dsv4_load_opts *lo,
                      dsv4_runner *it, dsv4_err *err) {
    dsv4_model_runner_opts mo = *o;
    if (!m->o.use_nccl) mo.device = DSV4_DEVICE_CPU;
    dsv4_tp_runner_opts to = {.tp_size = m->per_node, .comms = m->ranks, .first_rank = m->o.node_rank * m->per_node,
                              .world_size = m->o.tp_size, .comms_on_gpus = m->o.use_nccl};
    int rc = dsv4_tp_runner_open(dir, &mo, lo, &to, &m->tp, err);
    free(m->ranks); /* the handles are the runner's now, whatever happened */
    m->ranks = NULL;
    if (!rc) *it = dsv4_tp_runner_iface(m->tp);
    return rc;
}

int dsv4_multinode_open_leader(dsv4_multinode *m, const char *dir, const dsv4_model_runner_opts *o,
                               const dsv4_load_opts *lo, dsv4_model_runner **mr, dsv4_runner *run, dsv4_err *err) {
    *mr = NULL;
    if (m->per_node > 1) {
        dsv4_runner it;
        int rc = open_ranks(m, dir, o, lo, &it, err);
        if (rc) {
            m->c->abort(m->c); /* the followers are waiting for our pool: let them go */
            return rc;
        }
        int64_t pool[P_N];
        pool_of(&it, o, pool);
        if (!(rc = check_pools(m->c, pool, err))) rc = dsv4_plan_leader_create(m->c, &it, o->max_len, &m->leader, run, err);
        if (rc) {
            m->c->abort(m->c);
            dsv4_tp_runner_free(m->tp);
            m->tp = NULL;
            return rc;
        }
        dsv4_log(DSV4_LOG_INFO, "node 0: %d node(s) following at %s:%d (%d ranks per node)", m->c->size - 1,
                 m->o.master_addr, m->o.master_port, m->per_node);
        return 0;
    }
    dsv4_model_runner_opts o1 = *o;
    o1.host_ranks = 1; /* one rank per node: the host's memory is its own */
    int rc = dsv4_model_runner_open_tp(dir, &o1, lo, 0, m->c->size, m->c, mr, err);
    if (rc) {
        m->c->abort(m->c); /* the followers are waiting for our pool: let them go */
        return rc;
    }
    dsv4_runner it = dsv4_model_runner_iface(*mr);
    int64_t pool[P_N];
    pool_of(&it, o, pool);
    if (!(rc = check_pools(m->c, pool, err)))
        rc = dsv4_plan_leader_create(m->c, &it, o->max_len, &m->leader, run, err);
    if (rc) {
        m->c->abort(m->c);
        dsv4_model_runner_free(*mr);
        *mr = NULL;
        return rc;
    }
    m->mr = *mr;
    dsv4_log(DSV4_LOG_INFO, "node 0: %d node(s) following at %s:%d", m->c->size - 1, m->o.master_addr,
             m->o.master_port);
    return 0;
}

const dsv4_config *dsv4_multinode_config(dsv4_multinode *m) {
    return m->tp ? dsv4_tp_runner_config(m->tp) : m->mr ? dsv4_model_runner_config(m->mr) : NULL;
}

dsv4_backend *dsv4_multinode_backend(dsv4_multinode *m) {
    if (!m) return NULL;
    return m->tp ? dsv4_tp_runner_backend(m->tp, 0) : m->mr ? dsv4_model_runner_backend(m->mr) : NULL;
}

int dsv4_multinode_drafter(dsv4_multinode *m, dsv4_drafter *out) {
    return m->tp ? dsv4_tp_runner_drafter(m->tp, out) : m->mr ? dsv4_model_runner_drafter(m->mr, out) : 0;
}

void dsv4_multinode_stop(dsv4_multinode *m) {
    if (!m) return;
    if (m->leader) dsv4_plan_leader_free(m->leader); /* sends quit */
    m->leader = NULL;
    m->mr = NULL; /* the caller frees it next */
    dsv4_tp_runner_free(m->tp);
    m->tp = NULL;
}

int dsv4_multinode_check(dsv4_multinode *m, dsv4_err *err) {
    if (!m) return 0;
    int rc = dsv4_comm_tcp_check(m->c, err); /* NCCL: no cheap probe; a failing step shows it */
    if (rc) dsv4_err_prefix(err, "multi-node: ");
    return rc;
}

int dsv4_multinode_follow(dsv4_multinode *m, const char *dir, const dsv4_model_runner_opts *o,
                          const dsv4_load_opts *lo, dsv4_err *err) {
    if (m->per_node > 1) {
        dsv4_runner it;
        int rc = open_ranks(m, dir, o, lo, &it, err);
        if (rc) {
            m->c->abort(m->c); /* node 0 fails at its pool check, naming this node */
            dsv4_err_prefix(err, "node %d: ", m->o.node_rank);
            return rc;
        }
        int64_t pool[P_N];
        pool_of(&it, o, pool);
        if (!(rc = check_pools(m->c, pool, err))) {
            dsv4_log(DSV4_LOG_INFO, "node %d following node 0 at %s:%d (ranks %d..%d here)", m->o.node_rank,
                     m->o.master_addr, m->o.master_port, m->o.node_rank * m->per_node,
                     m->o.node_rank * m->per_node + m->per_node - 1);
            rc = dsv4_plan_follow(m->c, &it, err);
            /* dsv4_plan_follow names its communicator's rank, here the node ("rank 1: "), before the failing
             * rank's own prefix (the global rank, from the TP runner): drop it, the caller names the node */
            char pre[32];
            int np = snprintf(pre, sizeof pre, "rank %d: ", m->o.node_rank);
            if (rc && err && !strncmp(err->msg, pre, (size_t)np))
                memmove(err->msg, err->msg + np, strlen(err->msg + np) + 1);
        } else {
            m->c->abort(m->c);
        }
        dsv4_tp_runner_free(m->tp);
        m->tp = NULL;
        if (!rc) dsv4_log(DSV4_LOG_INFO, "node %d: node 0 quit; exiting", m->o.node_rank);
        return rc;
    }
    dsv4_model_runner *mr = NULL;
    dsv4_model_runner_opts o1 = *o;
    o1.host_ranks = 1; /* one rank per node: the host's memory is its own */
    int rc = dsv4_model_runner_open_tp(dir, &o1, lo, m->c->rank, m->c->size, m->c, &mr, err);
    if (rc) {
        m->c->abort(m->c); /* node 0 fails at its pool check, naming this node */
        dsv4_err_prefix(err, "node %d: ", m->o.node_rank);
        return rc;
    }
    dsv4_runner it = dsv4_model_runner_iface(mr);
    int64_t pool[P_N];
    pool_of(&it, o, pool);
    if ((rc = check_pools(m->c, pool, err))) {
        m->c->abort(m->c);
        dsv4_model_runner_free(mr);
        return rc;
    }
    dsv4_log(DSV4_LOG_INFO, "node %d following node 0 at %s:%d", m->o.node_rank, m->o.master_addr,
             m->o.master_port);
    rc = dsv4_plan_follow(m->c, &it, err);
    dsv4_model_runner_free(mr);
    if (!rc) dsv4_log(DSV4_LOG_INFO, "node %d: node 0 quit; exiting", m->o.node_rank);
    return rc;
}

void dsv4_multinode_free(dsv4_multinode *m) {
    if (!m) return;
    dsv4_multinode_stop(m);
    if (m->c) m->c->free(m->c);
    for (int i = 0; m->ranks && i < m->per_node; i++)
        if (m->ranks[i]) m->ranks[i]->free(m->ranks[i]);
    free(m->ranks);
    free(m);
}
