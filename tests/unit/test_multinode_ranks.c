/*
 * Several tensor-parallel ranks per node (src/parallel/multinode.h, issue 7
 * "Parallelism": -tp is the total over --nnodes, tp / nnodes ranks on each).
 * Two nodes are two threads of this process talking over 127.0.0.1, as two
 * `dsv4 run --nnodes 2 -tp 4` processes would (tests/py/test_multinode_ranks.py
 * runs those):
 *   - dsv4_comm_tcp_create_ranks: 2 nodes x 2 ranks make one TCP group of 4;
 *     every rank's all_reduce_sum is bit-identical to the rank-order sum
 *     ((p0 + p1) + p2) + p3 (comm_test_util.h; the local communicator's order), and
 *     a rank whose handle closes is named with its node (rank 3 is on node 1);
 *   - dsv4_multinode_join / open_leader / follow with -tp 4 over 2 nodes on a
 *     dummy-weight model that TP = 4 divides (the tiny checkpoints have
 *     o_groups 2, so TP = 4 is refused there): greedy tokens equal one process
 *     with -tp 4 (local communicator) and TP = 1, speculation off and DSpark
 *     k = 3 (drafter on global rank 0, reached through dsv4_multinode_drafter);
 *   - dsv4_comm_nccl_create_ranks up to its checks (no GPU here): bad range, NCCL
 *     not loadable; the NCCL path itself is compiled, not run;
 *   - refusals: -tp 3 over 2 nodes (not a multiple) on both nodes, -tp 4 on
 *     node 0 and 2 on node 1 (the rendezvous names the field), and a follower
 *     whose KV pool differs (node 0 names it at the pool check).
 */
#include <pthread.h>
#include <stdlib.h>

#include "comm_test_util.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "parallel/comm.h"
#include "parallel/multinode.h"
#include "parallel/tp_runner.h"
#include "proc_test_util.h"
#include "test.h"
#include "test_engine_util.h"

#define DIR "configs/deepseek-v4-flash-0731"
/* small enough for CI, divisible by 4 (heads, o_groups, expert widths, vocabulary), DSpark stages kept */
#define OV                                                                                                           \
    "{\"num_hidden_layers\": 4, \"hidden_size\": 256, \"num_attention_heads\": 4, \"head_dim\": 128, "              \
    "\"q_lora_rank\": 128, \"o_groups\": 4, \"o_lora_rank\": 128, \"moe_intermediate_size\": 256, "                 \
    "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 16, \"index_n_heads\": 4, "           \
    "\"index_topk\": 4, \"vocab_size\": 1024, \"num_hash_layers\": 2, \"dspark_noise_token_id\": 1000, "            \
    "\"dspark_markov_rank\": 32}"
#define MAXT 10
#define LEN 600

/* ---------- the TCP group of 2 nodes x 2 ranks ---------- */

typedef struct {
    int node, port, rc;
    dsv4_comm *c[2];
    char msg[DSV4_ERR_MSG_MAX];
} tcp_node;

static void *tcp_node_run(void *arg) {
    tcp_node *n = arg;
    dsv4_err err = {0};
    n->rc = dsv4_comm_tcp_create_ranks("127.0.0.1", n->port, n->node * 2, 2, 4, 10.0, n->c, &err);
    snprintf(n->msg, sizeof n->msg, "%s", err.msg);
    return NULL;
}

typedef struct {
    dsv4_comm *c;
    int rc;
    float out[LEN];
} tcp_rank_job;

static void *tcp_rank_run(void *arg) {
    tcp_rank_job *j = arg;
    dsv4_err err = {0};
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
    j->rc = ct_reduce_partials(j->c, be, 6, LEN, j->out, &err);
    be->free(be);
    return NULL;
}

static void test_tcp_ranks(void) {
    int port = pt_free_port();
    tcp_node nd[2] = {{0, port, -1, {0}, ""}, {1, port, -1, {0}, ""}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, tcp_node_run, &nd[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK_MSG(nd[0].rc == 0 && nd[1].rc == 0, "create_ranks: %s / %s", nd[0].msg, nd[1].msg);
    if (nd[0].rc || nd[1].rc) return;
    static tcp_rank_job j[4];
    pthread_t rt[4];
    for (int r = 0; r < 4; r++) {
        j[r].c = nd[r / 2].c[r % 2];
        CHECK_EQ_INT(j[r].c->rank, r);
        CHECK_EQ_INT(j[r].c->size, 4);
        pthread_create(&rt[r], NULL, tcp_rank_run, &j[r]);
    }
    for (int r = 0; r < 4; r++) pthread_join(rt[r], NULL);
    int bad = 0;
    for (int i = 0; i < LEN; i++) {
        float want = ct_rank_order_sum(4, i);
        for (int r = 0; r < 4; r++) bad += memcmp(&j[r].out[i], &want, sizeof want) != 0;
    }
    for (int r = 0; r < 4; r++) CHECK_EQ_INT(j[r].rc, 0);
    CHECK_MSG(bad == 0, "%d sums differ from the rank-order sum", bad);
    /* rank 3 (node 1's second rank) goes away: rank 0 names it and its node */
    nd[1].c[1]->free(nd[1].c[1]);
    nd[1].c[1] = NULL;
    dsv4_err err = {0};
    int rc = 0;
    for (int t = 0; t < 200 && !(rc = dsv4_comm_tcp_check(nd[0].c[0], &err)); t++) usleep(10000);
    CHECK_EQ_INT(rc, DSV4_EBACKEND);
    CHECK_CONTAINS(err.msg, "rank 3 (node 1 at 127.0.0.1:");
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            if (nd[i].c[k]) nd[i].c[k]->free(nd[i].c[k]);
    /* a range outside the group is refused before any connection */
    dsv4_comm *c3[2];
    CHECK_EQ_INT(dsv4_comm_tcp_create_ranks("127.0.0.1", port, 3, 2, 4, 1.0, c3, &err), DSV4_EINVAL);
}

/* ---------- whole model: 2 nodes x 2 ranks vs one process ---------- */

static dsv4_model_runner_opts runner_opts(int k, int max_len) {
    return (dsv4_model_runner_opts){.n_slots = 4, .max_len = max_len, .max_spec = k,
                                    .numerics = DSV4_NUMERICS_REFERENCE, .n_pages = -1, .device = DSV4_DEVICE_CPU};
}
static const dsv4_load_opts LO = {.dummy = 1, .hf_overrides = OV};

/* Greedy tokens of 2 prompts (the second reusing the slot) through `run`. */
static void gen_run(dsv4_runner *run, const dsv4_drafter *dr, int k, int32_t out[2][MAXT]) {
    dsv4_engine_opts eo = {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 128, .spec_k = k,
                           .eos_id = 1};
    dsv4_engine *e = NULL;
    dsv4_err err = {0};
    CHECK_MSG(dsv4_engine_create(&eo, run, dr, &e, &err) == 0, "engine: %s", err.msg);
    if (!e) return;
    int lens[2] = {7, 21};
    for (int i = 0; i < 2; i++) {
        int32_t p[32];
        for (int t = 0; t < lens[i]; t++) p[t] = 2 + (int32_t)((i * 131 + t * 17 + t * t) % 990);
        CHECK_EQ_INT(tu_generate_greedy(e, p, lens[i], MAXT, out[i], MAXT, NULL), MAXT);
    }
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    if (k > 0) CHECK(st.spec_drafts > 0);
    dsv4_engine_free(e);
}

static void gen_one_process(int tp, int k, int32_t out[2][MAXT]) {
    dsv4_model_runner_opts mo = runner_opts(k, 128);
    dsv4_err err = {0};
    dsv4_model_runner *mr = NULL;
    dsv4_tp_runner *t = NULL;
    dsv4_drafter dr;
    int has, rc;
    dsv4_runner run;
    if (tp == 1) {
        rc = dsv4_model_runner_open_ex(DIR, &mo, &LO, &mr, &err);
        if (!rc) {
            run = dsv4_model_runner_iface(mr);
            has = dsv4_model_runner_drafter(mr, &dr);
        }
    } else {
        dsv4_tp_runner_opts to = {.tp_size = tp, .check_ranks = 1};
        rc = dsv4_tp_runner_open(DIR, &mo, &LO, &to, &t, &err);
        if (!rc) {
            run = dsv4_tp_runner_iface(t);
            has = dsv4_tp_runner_drafter(t, &dr);
        }
    }
    CHECK_MSG(rc == 0, "TP=%d: %s", tp, err.msg);
    if (!rc) {
        CHECK_EQ_INT(has, k > 0);
        gen_run(&run, has ? &dr : NULL, k, out);
    }
    dsv4_model_runner_free(mr);
    dsv4_tp_runner_free(t);
}

typedef struct {
    int node, tp, port, k, max_len, rc_join, rc;
    char msg[DSV4_ERR_MSG_MAX];
    int32_t out[2][MAXT]; /* node 0's tokens */
} node_job;

static void *node_run(void *arg) {
    node_job *j = arg;
    dsv4_err err = {0};
    dsv4_multinode_opts o = {.master_addr = "127.0.0.1", .master_port = j->port, .nnodes = 2, .node_rank = j->node,
                             .tp_size = j->tp, .model_dir = DIR, .hf_overrides = OV, .timeout_s = 20};
    dsv4_multinode *m = NULL;
    j->rc = j->rc_join = dsv4_multinode_join(&o, &m, &err);
    dsv4_model_runner_opts mo = runner_opts(j->k, j->max_len);
    if (!j->rc && j->node > 0) j->rc = dsv4_multinode_follow(m, DIR, &mo, &LO, &err);
    if (!j->rc && j->node == 0) {
        dsv4_model_runner *mr = NULL;
        dsv4_runner run;
        j->rc = dsv4_multinode_open_leader(m, DIR, &mo, &LO, &mr, &run, &err);
        if (!j->rc) {
            CHECK(mr == NULL); /* several ranks per node: the node's TP runner is m's */
            CHECK(dsv4_multinode_config(m) != NULL && dsv4_multinode_config(m)->vocab_size == 1024);
            dsv4_drafter dr;
            int has = dsv4_multinode_drafter(m, &dr);
            CHECK_EQ_INT(has, j->k > 0);
            gen_run(&run, has ? &dr : NULL, j->k, j->out);
        }
        dsv4_multinode_stop(m);
    }
    snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    dsv4_multinode_free(m);
    return NULL;
}

/* Node 0 and node 1 as threads; tp / max_len per node. */
static void two_nodes(int tp0, int tp1, int k, int len1, node_job j[2]) {
    int port = pt_free_port();
    while (port >= 65533) port = pt_free_port();
    j[0] = (node_job){0, tp0, port, k, 128, -1, -1, "", {{0}}};
    j[1] = (node_job){1, tp1, port, k, len1, -1, -1, "", {{0}}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, node_run, &j[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

static void test_tokens(int k) {
    static int32_t one[2][MAXT], four[2][MAXT];
    memset(one, 0, sizeof one);
    memset(four, 0, sizeof four);
    gen_one_process(1, k, one);
    gen_one_process(4, k, four);
    node_job j[2];
    two_nodes(4, 4, k, 128, j);
    CHECK_MSG(j[0].rc == 0, "node 0: %s", j[0].msg);
    CHECK_MSG(j[1].rc == 0, "node 1: %s", j[1].msg);
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(!memcmp(one[i], four[i], sizeof one[i]), "k=%d prompt %d: one-process TP=4 tokens != TP=1", k, i);
        CHECK_MSG(!memcmp(j[0].out[i], four[i], sizeof four[i]), "k=%d prompt %d: 2 nodes x 2 ranks != one process TP=4",
                  k, i);
    }
    printf("k=%d: TP=1, TP=4 and 2 nodes x 2 ranks: first tokens %d %d %d\n", k, j[0].out[0][0], j[0].out[0][1],
           j[0].out[1][0]);
}

static void test_refusals(void) {
    node_job j[2];
    two_nodes(3, 3, 0, 128, j); /* not a multiple of --nnodes: both nodes, after the rendezvous */
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(j[i].rc_join, DSV4_EINVAL);
        CHECK_CONTAINS(j[i].msg, "--tensor-parallel-size 3 with --nnodes 2");
        CHECK_CONTAINS(j[i].msg, "must be a multiple of --nnodes");
    }
    two_nodes(4, 2, 0, 128, j); /* the nodes disagree about -tp: named by the rendezvous on both */
    CHECK_EQ_INT(j[0].rc_join, DSV4_EINVAL);
    CHECK_CONTAINS(j[0].msg, "node 1 has --tensor-parallel-size 2, node 0 has 4");
    CHECK(j[1].rc_join != 0);
    CHECK_CONTAINS(j[1].msg, "node 1 has --tensor-parallel-size 2, node 0 has 4");
    two_nodes(4, 4, 0, 96, j); /* node 1 sized its pool for another max length */
    CHECK_EQ_INT(j[0].rc_join, 0);
    CHECK_EQ_INT(j[0].rc, DSV4_EINVAL);
    CHECK_CONTAINS(j[0].msg, "node 1 has 96 --max-model-len, node 0 has 128");
    CHECK(j[1].rc != 0);
    CHECK_CONTAINS(j[1].msg, "node 1 has 96 --max-model-len, node 0 has 128");
}

/* The NCCL side can only be reached up to its checks here (no GPU in CI): a bad range, and a library
 * that does not load, are errors with every handle left NULL. */
static void test_nccl_ranks_checks(void) {
    uint8_t id[DSV4_NCCL_ID_BYTES] = {0};
    dsv4_comm *c[2] = {(dsv4_comm *)1, (dsv4_comm *)1};
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_comm_nccl_create_ranks(3, 2, 4, id, c, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "ranks 3..4 of 4");
    CHECK(c[0] == NULL && c[1] == NULL);
    setenv("DSV4_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    c[0] = c[1] = (dsv4_comm *)1;
    CHECK_EQ_INT(dsv4_comm_nccl_create_ranks(2, 2, 4, id, c, &err), DSV4_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "DSV4_NCCL_LIB");
    CHECK(c[0] == NULL && c[1] == NULL);
    unsetenv("DSV4_NCCL_LIB");
}

int main(void) {
    test_nccl_ranks_checks();
    test_tcp_ranks();
    test_refusals();
    test_tokens(0);
    test_tokens(3); /* DSpark drafter on global rank 0 */
    return TEST_REPORT();
}
