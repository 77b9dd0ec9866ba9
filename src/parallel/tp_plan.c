/*
 * Step-plan broadcast (tp_plan.h). Two broadcasts per call — a fixed header,
 * then the payload whose size the header gives — so followers never need to
 * guess a maximum batch size.
 */
#include "parallel/tp_plan.h"
#include "parallel/tp_runner.h"

#include <stdlib.h>
#include <string.h>

enum { PLAN_FORWARD = 1, PLAN_RELEASE, PLAN_RESUME, PLAN_COPY, PLAN_PAGES, PLAN_QUIT, PLAN_WARMUP };
enum { H_OP, H_ROWS, H_SEQS, H_LOGITS, H_A, H_B, H_C, H_BYTES, H_N };

struct dsv4_plan_leader {
    dsv4_comm *c;
    dsv4_runner inner;
    int max_len;
    int32_t *buf;
    size_t cap; /* int32 elements */
};

static size_t payload_ints(int64_t T, int64_t S, int64_t L) { return (size_t)(4 * T + (S + 1) + 2 * S + L); }

static int grow(int32_t **p, size_t *cap, size_t n, dsv4_err *err) {
    if (n <= *cap) return 0;
    int32_t *q = realloc(*p, n * sizeof(int32_t));
    if (!q) return dsv4_err_set(err, DSV4_ENOMEM, "step plan: out of memory");
    *p = q;
    *cap = n;
    return 0;
}

static int send_plan(dsv4_plan_leader *l, int64_t *h, dsv4_err *err) {
    int rc = l->c->broadcast(l->c, h, sizeof(int64_t) * H_N, 0, err);
    if (!rc && h[H_BYTES]) rc = l->c->broadcast(l->c, l->buf, (size_t)h[H_BYTES], 0, err);
    return rc;
}

static int lead_forward(void *ctx, const dsv4_batch *b, const int32_t *rows, int n_logits, float *logits,
                        dsv4_err *err) {
    dsv4_plan_leader *l = ctx;
    int64_t T = b->n_rows, S = b->n_seqs, L = n_logits;
    size_t n = payload_ints(T, S, L);
    int rc = dsv4_tp_check_batch(l->inner.n_slots, l->max_len, l->inner.vocab, b, rows, n_logits, err);
    if (!rc) rc = grow(&l->buf, &l->cap, n, err);
    if (rc) return rc;
    int32_t *p = l->buf;
    const int32_t *parts[7] = {b->token, b->pos, b->slot, b->seq_idx, b->cu_seqlens, b->seq_slot, b->seq_pos0};
    int64_t lens[7] = {T, T, T, T, S + 1, S, S};
    for (int i = 0; i < 7; i++) {
        memcpy(p, parts[i], sizeof(int32_t) * (size_t)lens[i]);
        p += lens[i];
    }
    if (L) memcpy(p, rows, sizeof(int32_t) * (size_t)L);
    int64_t h[H_N] = {PLAN_FORWARD, T, S, L, 0, 0, 0, (int64_t)(n * sizeof(int32_t))};
    if ((rc = send_plan(l, h, err))) return rc;
    rc = l->inner.forward(l->inner.ctx, b, rows, n_logits, logits, err);
    if (rc) l->c->abort(l->c); /* followers may be waiting in this forward's collectives */
    return rc;
}

static int lead_simple(dsv4_plan_leader *l, int op, int64_t a, int64_t b2, int64_t c2, dsv4_err *err) {
    int64_t h[H_N] = {op, 0, 0, 0, a, b2, c2, 0};
    return send_plan(l, h, err);
}

static void lead_release(void *ctx, int slot) {
    dsv4_plan_leader *l = ctx;
    dsv4_err err = {0};
    if (lead_simple(l, PLAN_RELEASE, slot, 0, 0, &err)) dsv4_log(DSV4_LOG_ERROR, "step plan: %s", err.msg);
    l->inner.release(l->inner.ctx, slot);
}

static int64_t lead_reusable(void *ctx, int slot, int64_t committed, int64_t want, int64_t n_new) {
    dsv4_plan_leader *l = ctx; /* a query: rank 0 answers */
    return l->inner.reusable(l->inner.ctx, slot, committed, want, n_new);
}

static int lead_resume(void *ctx, int slot, int64_t pos, dsv4_err *err) {
    dsv4_plan_leader *l = ctx;
    int rc = lead_simple(l, PLAN_RESUME, slot, pos, 0, err);
    return rc ? rc : l->inner.resume(l->inner.ctx, slot, pos, err);
}

static int lead_copy(void *ctx, int src, int dst, dsv4_err *err) {
    dsv4_plan_leader *l = ctx;
    int rc = lead_simple(l, PLAN_COPY, src, dst, 0, err);
    return rc ? rc : l->inner.copy_slot(l->inner.ctx, src, dst, err);
}

static int lead_set_pages(void *ctx, int slot, int n, const int32_t *ids, dsv4_err *err) {
    dsv4_plan_leader *l = ctx;
    if (n < 0) return dsv4_err_set(err, DSV4_EINVAL, "step plan: set_pages: %d page ids", n);
    int rc = grow(&l->buf, &l->cap, (size_t)n + 1, err);
    if (rc) return rc;
    if (n) memcpy(l->buf, ids, sizeof(int32_t) * (size_t)n);
    int64_t h[H_N] = {PLAN_PAGES, 0, 0, 0, slot, n, 0, (int64_t)n * (int64_t)sizeof(int32_t)};
    if ((rc = send_plan(l, h, err))) return rc;
    return l->inner.set_pages(l->inner.ctx, slot, n, ids, err);
}

/*
 * Every rank reports how many graphs its warm-up holds (one broadcast from
 * each follower, as check_pools in multinode.c), so a node that captured
 * other shapes — another --cuda-graph-sizes, another --speculative-config —
 * fails at start with both counts named rather than replaying different
 * graphs later. mine: this rank's count; on the leader, *bad gets the first
 * follower that differs (or -1) and its count in *theirs.
 */
static int warm_counts(dsv4_comm *c, int mine, int *bad, int *theirs, dsv4_err *err) {
    *bad = -1;
    for (int r = 1; r < c->size; r++) {
        int64_t v = mine;
        int rc = c->broadcast(c, &v, sizeof v, r, err);
        if (rc) return rc;
        if (c->rank == 0 && *bad < 0 && v != mine) {
            *bad = r;
            *theirs = (int)v;
        }
    }
    return 0;
}

/*
 * The start-up warm-up (runner.h warmup, issue 7: no first-request penalty)
 * as a plan: every node runs its own runner's warm-up at once, so the
 * forwards inside — and their all-reduces — pair up in the same order on
 * every rank, exactly as for a forward plan.
 */
static int lead_warmup(void *ctx, int *n_graphs, dsv4_err *err) {
    dsv4_plan_leader *l = ctx;
    int rc = lead_simple(l, PLAN_WARMUP, 0, 0, 0, err);
    if (rc) return rc;
    *n_graphs = 0;
    rc = l->inner.warmup(l->inner.ctx, n_graphs, err);
    if (rc) {
        l->c->abort(l->c); /* the followers may be waiting in a warm-up forward's collectives */
        return rc;
    }
    int bad, theirs = 0;
    if ((rc = warm_counts(l->c, *n_graphs, &bad, &theirs, err))) return rc;
    if (bad >= 0)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "start-up warm-up: node %d holds %d CUDA graphs, node 0 holds %d: start every node with "
                            "the same --cuda-graph-sizes / --max-num-seqs / --speculative-config / --enforce-eager",
                            bad, theirs, *n_graphs);
    return 0;
}

int dsv4_plan_leader_create(dsv4_comm *c, const dsv4_runner *inner, int max_len, dsv4_plan_leader **out,
                            dsv4_runner *out_runner, dsv4_err *err) {
    *out = NULL;
    if (c->rank != 0) return dsv4_err_set(err, DSV4_EINVAL, "step plan: the leader is rank 0, not %d", c->rank);
    dsv4_plan_leader *l = calloc(1, sizeof *l);
    if (!l) return dsv4_err_set(err, DSV4_ENOMEM, "step plan: out of memory");
    l->c = c;
    l->inner = *inner;
    l->max_len = max_len;
    /* the pool: rank 0's sizes; the followers hold the same pool and get every set_pages as a plan */
    *out_runner = (dsv4_runner){.ctx = l,
                                .vocab = inner->vocab,
                                .n_slots = inner->n_slots,
                                .forward = lead_forward,
                                .release = lead_release,
                                .reusable = inner->reusable ? lead_reusable : NULL,
                                .resume = inner->resume ? lead_resume : NULL,
                                .copy_slot = inner->copy_slot ? lead_copy : NULL,
                                .warmup = inner->warmup ? lead_warmup : NULL};
    if (inner->set_pages) {
        out_runner->page_tokens = inner->page_tokens;
        out_runner->n_pages = inner->n_pages;
        out_runner->page_bytes = inner->page_bytes;
        out_runner->set_pages = lead_set_pages;
    }
    *out = l;
    return 0;
}

void dsv4_plan_leader_free(dsv4_plan_leader *l) {
    if (!l) return;
    dsv4_err err = {0};
    if (lead_simple(l, PLAN_QUIT, 0, 0, 0, &err)) dsv4_log(DSV4_LOG_WARN, "step plan: quit: %s", err.msg);
    free(l->buf);
    free(l);
}

int dsv4_plan_follow(dsv4_comm *c, const dsv4_runner *inner, dsv4_err *err) {
    int32_t *buf = NULL;
    size_t cap = 0;
    float *logits = NULL;
    size_t lcap = 0;
    int rc = 0;
    for (;;) {
        int64_t h[H_N];
        if ((rc = c->broadcast(c, h, sizeof h, 0, err))) break;
        int64_t T = h[H_ROWS], S = h[H_SEQS], L = h[H_LOGITS];
        if (h[H_OP] == PLAN_QUIT) break;
        if (h[H_BYTES] < 0 || T < 0 || S < 0 || L < 0 || h[H_BYTES] > ((int64_t)1 << 34) ||
            (h[H_OP] == PLAN_FORWARD && (size_t)h[H_BYTES] != payload_ints(T, S, L) * sizeof(int32_t)) ||
            (h[H_OP] == PLAN_PAGES && (h[H_B] < 0 || h[H_BYTES] != h[H_B] * (int64_t)sizeof(int32_t)))) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "step plan: malformed header (op %lld, %lld bytes)",
                              (long long)h[H_OP], (long long)h[H_BYTES]);
            break;
        }
        if ((rc = grow(&buf, &cap, (size_t)h[H_BYTES] / sizeof(int32_t) + 1, err))) break;
        if (h[H_BYTES] && (rc = c->broadcast(c, buf, (size_t)h[H_BYTES], 0, err))) break;
        switch (h[H_OP]) {
        case PLAN_FORWARD: {
            const int32_t *p = buf;
            dsv4_batch b = {(int)T, (int)S, p, p + T, p + 2 * T, p + 3 * T, p + 4 * T, p + 4 * T + S + 1,
                            p + 4 * T + 2 * S + 1};
            const int32_t *rows = p + 4 * T + 3 * S + 1;
            size_t need = (size_t)L * (size_t)inner->vocab;
            if (need > lcap) {
                float *q = realloc(logits, need * sizeof(float));
                if (!q) {
                    rc = dsv4_err_set(err, DSV4_ENOMEM, "step plan: out of memory for logits");
                    break;
                }
                logits = q;
                lcap = need;
            }
            rc = inner->forward(inner->ctx, &b, rows, (int)L, logits, err);
            break;
        }
        case PLAN_RELEASE:
            inner->release(inner->ctx, (int)h[H_A]);
            break;
        case PLAN_RESUME:
            if (inner->resume) rc = inner->resume(inner->ctx, (int)h[H_A], h[H_B], err);
            break;
        case PLAN_COPY:
            if (inner->copy_slot) rc = inner->copy_slot(inner->ctx, (int)h[H_A], (int)h[H_B], err);
            break;
        case PLAN_PAGES:
            rc = inner->set_pages ? inner->set_pages(inner->ctx, (int)h[H_A], (int)h[H_B], buf, err)
                                  : dsv4_err_set(err, DSV4_EINVAL, "step plan: pages mapped but this rank has no KV pool");
            break;
        case PLAN_WARMUP: {
            int ng = 0, bad, theirs;
            if (!inner->warmup)
                rc = dsv4_err_set(err, DSV4_EINVAL,
                                  "step plan: node 0 runs a start-up warm-up but this rank has none (start every "
                                  "node with the same --device, --enforce-eager and DSV4_WARMUP)");
            else rc = inner->warmup(inner->ctx, &ng, err);
            if (!rc) rc = warm_counts(c, ng, &bad, &theirs, err);
            break;
        }
        default:
            rc = dsv4_err_set(err, DSV4_EFORMAT, "step plan: unknown op %lld", (long long)h[H_OP]);
        }
        if (rc) {
            c->abort(c);
            dsv4_err_prefix(err, "rank %d: ", c->rank);
            break;
        }
    }
    free(buf);
    free(logits);
    return rc;
}
