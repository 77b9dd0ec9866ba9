/*
 * Engine: scheduling, batching, speculation and stops (spec/DSPARK.md §4-5,
 * spec/SERVING.md §6-8), driven by a small deterministic language model.
 *
 * The toy model: the logits at (slot, position p) are a hash of the tokens the
 * runner holds for that slot at positions 0..p. The runner stores tokens by
 * position (overwritable), exactly the contract of the real state; so any
 * engine bug that feeds a wrong token, a wrong position, a wrong slot, or
 * leaves a rejected draft in place changes the output, and the output of a
 * request can be computed independently by running the toy model sequentially.
 * Every test runs with and without the runner's greedy-ids path (issue 7).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "test.h"

#define VOCAB 64
#define SLOTS 8
#define MAXPOS 4096
/* The toy's "window ring" (like the real model's, spec/MODEL.md §4.1): a row
 * at position p reads positions p-TOYW+1 .. p-1; those below the segment's
 * first position must still be in a ring of TOYCAP rows (TOYW + the largest
 * rejected run), else the forward fails ("ring miss"). So resuming a cached
 * slot at a position whose window rows were overwritten is caught. */
#define TOYW 4
#define TOYCAP (TOYW + 5)

typedef struct toy {
    int32_t hist[SLOTS][MAXPOS];
    int written[SLOTS]; /* positions [0, written) hold tokens */
    int ring[SLOTS][TOYCAP]; /* position + 1 held by each ring row, 0 = none */
    int hw[SLOTS];      /* highest written position + 1 */
    int released[SLOTS];
    int fail_next;      /* make the next forward fail */
    int rows_per_step[1024], steps;
    int64_t host_rows;  /* logit rows handed out as whole rows (forward) */
    int64_t id_rows;    /* logit rows handed out as greedy ids (forward_ids) */
} toy;

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* logits of the toy model after the sequence h[0..n) */
static void toy_logits(const int32_t *h, int n, float *out) {
    uint64_t acc = 0;
    for (int i = 0; i < n; i++) acc = mix(acc ^ (uint64_t)(h[i] + 1) * 0x100000001B3ull);
    for (int v = 0; v < VOCAB; v++) out[v] = (float)(mix(acc + (uint64_t)v) % 1000) / 150.0f;
}

static int32_t argmax(const float *x) {
    int32_t b = 0;
    for (int v = 1; v < VOCAB; v++)
        if (x[v] > x[b]) b = v;
    return b;
}

static int toy_forward(void *ctx, const dsv4_batch *b, const int32_t *lrows, int nl, float *logits, dsv4_err *err) {
    toy *t = ctx;
    if (t->fail_next) {
        t->fail_next = 0;
        return dsv4_err_set(err, DSV4_EBACKEND, "injected failure");
    }
    if (t->steps < 1024) t->rows_per_step[t->steps] = b->n_rows;
    t->steps++;
    int seen[SLOTS] = {0};
    for (int s = 0; s < b->n_seqs; s++) {
        int sl = b->seq_slot[s];
        if (sl < 0 || sl >= SLOTS || seen[sl]++) return dsv4_err_set(err, DSV4_EINVAL, "slot %d twice", sl);
        if (b->seq_pos0[s] > t->written[sl])
            return dsv4_err_set(err, DSV4_EINVAL, "slot %d: gap before position %d", sl, b->seq_pos0[s]);
        for (int r = b->cu_seqlens[s]; r < b->cu_seqlens[s + 1]; r++) {
            if (b->pos[r] != b->seq_pos0[s] + (r - b->cu_seqlens[s]) || b->slot[r] != sl || b->seq_idx[r] != s)
                return dsv4_err_set(err, DSV4_EINVAL, "row %d metadata inconsistent", r);
            for (int q = b->pos[r] - TOYW + 1 < 0 ? 0 : b->pos[r] - TOYW + 1; q < b->seq_pos0[s]; q++)
                if (t->ring[sl][q % TOYCAP] != q + 1)
                    return dsv4_err_set(err, DSV4_EINVAL, "slot %d: ring miss at position %d (row at %d)", sl, q,
                                        b->pos[r]);
        }
    }
    for (int s = 0; s < b->n_seqs; s++) { /* the ring is written after every row read it */
        int sl = b->seq_slot[s];
        for (int r = b->cu_seqlens[s]; r < b->cu_seqlens[s + 1]; r++) {
            t->hist[sl][b->pos[r]] = b->token[r];
            t->ring[sl][b->pos[r] % TOYCAP] = b->pos[r] + 1;
            if (b->pos[r] + 1 > t->hw[sl]) t->hw[sl] = b->pos[r] + 1;
        }
        t->written[sl] = b->seq_pos0[s] + (b->cu_seqlens[s + 1] - b->cu_seqlens[s]);
    }
    for (int i = 0; i < nl; i++) {
        int r = lrows[i];
        toy_logits(t->hist[b->slot[r]], b->pos[r] + 1, logits + (size_t)i * VOCAB);
    }
    t->host_rows += nl;
    return 0;
}

/* runner forward_ids over the toy: the same forward, then each row's argmax
 * (a device backend computes it where the logits are: backend logit_top) */
static int toy_forward_ids(void *ctx, const dsv4_batch *b, const int32_t *lrows, int nl, int32_t *ids,
                           dsv4_err *err) {
    toy *t = ctx;
    float *lg = malloc(sizeof(float) * (size_t)(nl > 0 ? nl : 1) * VOCAB);
    if (!lg) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    int rc = toy_forward(ctx, b, lrows, nl, lg, err);
    for (int i = 0; i < nl && !rc; i++) ids[i] = argmax(lg + (size_t)i * VOCAB);
    if (!rc) {
        t->host_rows -= nl;
        t->id_rows += nl;
    }
    free(lg);
    return rc;
}

static void toy_release(void *ctx, int slot) {
    toy *t = ctx;
    t->released[slot]++;
    t->written[slot] = 0;
    t->hw[slot] = 0;
    memset(t->ring[slot], 0, sizeof t->ring[slot]);
}

/* Drafter: follows the toy model's greedy chain from the committed history,
 * but is wrong at some positions, so acceptance is partial. It keeps its own
 * copy of the committed tokens (taken only through commit), as a real
 * drafter's context ring is fed only committed rows. */
static int32_t dctx[SLOTS][MAXPOS];
static int dlen[SLOTS];

static int toy_commit(void *ctx, int n, const int32_t *slot, const int64_t *len, dsv4_err *err) {
    toy *t = ctx;
    for (int i = 0; i < n; i++) {
        int s = slot[i];
        if (len[i] > t->written[s] || len[i] < dlen[s])
            return dsv4_err_set(err, DSV4_EINVAL, "commit: slot %d length %lld (written %d, had %d)", s,
                                (long long)len[i], t->written[s], dlen[s]);
        memcpy(dctx[s] + dlen[s], t->hist[s] + dlen[s], sizeof(int32_t) * (size_t)(len[i] - dlen[s]));
        dlen[s] = (int)len[i];
    }
    return 0;
}

static int toy_propose1(int slot, int32_t anchor, int64_t apos, int k, float temp, uint64_t seed, int32_t *d,
                        float *q, dsv4_err *err) {
    if (apos != dlen[slot]) return dsv4_err_set(err, DSV4_EINVAL, "drafter: context %d, anchor at %lld", dlen[slot],
                                                (long long)apos);
    int32_t h[MAXPOS];
    memcpy(h, dctx[slot], sizeof(int32_t) * (size_t)apos); /* committed part only */
    h[apos] = anchor;
    float lg[VOCAB];
    for (int j = 0; j < k; j++) {
        toy_logits(h, (int)apos + 1 + j, lg);
        int32_t x = argmax(lg);
        if (mix((uint64_t)(apos + j) * 31 + (uint64_t)slot) % 4 == 0) x = (x + 1) % VOCAB; /* a wrong guess */
        if (q) { /* sampled drafting: a softened distribution, draft drawn from it */
            double m = lg[argmax(lg)], s = 0;
            for (int v = 0; v < VOCAB; v++) s += q[(size_t)j * VOCAB + v] = (float)exp((lg[v] - m) / (temp + 0.5));
            for (int v = 0; v < VOCAB; v++) q[(size_t)j * VOCAB + v] = (float)(q[(size_t)j * VOCAB + v] / s);
            x = dsv4_sample_from(q + (size_t)j * VOCAB, VOCAB, dsv4_rng_u01(seed, apos + 1 + j, DSV4_RNG_DRAFT));
        }
        d[j] = x;
        h[apos + 1 + j] = x;
    }
    return 0;
}

static int toy_propose(void *ctx, int n, const int32_t *slot, const int32_t *anchor, const int64_t *apos, int k,
                       const float *temp, const uint64_t *seed, int32_t *d, float *const *q, int *qv, dsv4_err *err) {
    for (int i = 0; i < n; i++) {
        int rc = toy_propose1(slot[i], anchor[i], apos[i], k, temp[i], seed[i], d + (size_t)i * k, q[i], err);
        if (rc) return rc;
        qv[i] = q[i] != NULL;
    }
    return 0;
}

static void toy_drafter_release(void *ctx, int slot) { dlen[slot] = 0; }

/* Prefix caching over the toy (runner.h): exact when the ring still holds the
 * window below R and the drafter has committed at least R positions. */
static int toy_use_dr;
static int64_t toy_reusable(void *ctx, int slot, int64_t committed, int64_t want, int64_t n_new) {
    toy *t = ctx;
    (void)n_new;
    int64_t R = want < committed ? want : committed;
    if (R > t->written[slot]) R = t->written[slot];
    if (toy_use_dr && R > dlen[slot]) R = dlen[slot];
    int64_t need = R - TOYW + 1 < 0 ? 0 : R - TOYW + 1;
    if (R < 1 || (t->hw[slot] > TOYCAP && need < t->hw[slot] - TOYCAP)) return 0;
    return R;
}

static int toy_resume(void *ctx, int slot, int64_t pos, dsv4_err *err) {
    toy *t = ctx;
    if (pos < 1 || pos > t->written[slot]) return dsv4_err_set(err, DSV4_EINVAL, "resume at %lld", (long long)pos);
    t->written[slot] = (int)pos;
    if (dlen[slot] > pos) dlen[slot] = (int)pos;
    return 0;
}

static int toy_copy(void *ctx, int src, int dst, dsv4_err *err) {
    toy *t = ctx;
    (void)err;
    memcpy(t->hist[dst], t->hist[src], sizeof t->hist[src]);
    memcpy(t->ring[dst], t->ring[src], sizeof t->ring[src]);
    t->written[dst] = t->written[src];
    t->hw[dst] = t->hw[src];
    memcpy(dctx[dst], dctx[src], sizeof dctx[src]);
    dlen[dst] = dlen[src];
    return 0;
}

/* Independent reference: greedy continuation of prompt by the toy model,
 * with EOS handling as the engine's rules say. Returns the number of tokens. */
static int reference(const int32_t *prompt, int n, int max_tokens, int32_t eos, int32_t *out) {
    int32_t h[MAXPOS];
    memcpy(h, prompt, sizeof(int32_t) * (size_t)n);
    float lg[VOCAB];
    int g = 0;
    while (g < max_tokens) {
        toy_logits(h, n + g, lg);
        out[g] = h[n + g] = argmax(lg);
        g++;
        if (out[g - 1] == eos) break;
    }
    return g;
}

static toy T;
static dsv4_runner RUN = {&T, VOCAB, SLOTS, toy_forward, toy_release, NULL, NULL, NULL, 0, 0, 0, NULL, NULL, NULL};
static dsv4_drafter DR = {&T, 5, toy_commit, toy_propose, toy_drafter_release};

/* Every test runs twice (main): without and with the runner's forward_ids
 * (greedy ids instead of logits, issue 7): the outputs must not change. */
static int toy_ids;

static dsv4_engine *make_ex(int seqs, int budget, int k, int64_t maxlen, int32_t eos, int caching) {
    memset(&T, 0, sizeof T);
    memset(dlen, 0, sizeof dlen);
    toy_use_dr = k > 0;
    dsv4_engine_opts o = {seqs, budget, maxlen, k, eos, {{0}}, 0, caching};
    dsv4_runner run = RUN;
    if (toy_ids) run.forward_ids = toy_forward_ids;
    if (caching) {
        run.reusable = toy_reusable;
        run.resume = toy_resume;
        run.copy_slot = toy_copy;
    }
    dsv4_engine *e = NULL;
    dsv4_err err = {0};
    int rc = dsv4_engine_create(&o, &run, k ? &DR : NULL, &e, &err);
    CHECK_MSG(rc == 0, "create: %s", err.msg);
    return e;
}

static dsv4_engine *make(int seqs, int budget, int k, int64_t maxlen, int32_t eos) {
    return make_ex(seqs, budget, k, maxlen, eos, 0);
}

static void run_idle(dsv4_engine *e) {
    dsv4_err err = {0};
    for (int i = 0; i < 100000 && dsv4_engine_step(e, &err) > 0; i++) {}
}

static int drain(dsv4_request *r, int32_t *out, dsv4_finish *f) {
    int n = 0, got;
    *f = DSV4_FINISH_NONE;
    while ((got = dsv4_request_poll(r, out + n, 4096, f, 0)) > 0) n += got;
    return n;
}

static void prompt_of(int i, int len, int32_t *p) {
    for (int j = 0; j < len; j++) p[j] = (int32_t)(mix((uint64_t)i * 1000 + (uint64_t)j) % VOCAB);
}

/* Several concurrent greedy requests, chunked prefill, with and without speculation:
 * each equals its single-stream reference. */
static void test_batched_equals_single(int k) {
    const int N = 6;
    int lens[6] = {3, 40, 17, 90, 1, 25}, maxt[6] = {30, 12, 50, 8, 40, 33};
    int32_t prompts[6][128], ref[6][128], out[4096];
    dsv4_engine *e = make(6, 11, k, 1 << 20, -1);
    dsv4_request *rq[6];
    dsv4_err err = {0};
    for (int i = 0; i < N; i++) {
        prompt_of(i, lens[i], prompts[i]);
        dsv4_gen_params gp;
        dsv4_gen_params_default(&gp);
        gp.sampling.temperature = 0;
        gp.max_tokens = maxt[i];
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[i], lens[i], &gp, &rq[i], &err), 0);
    }
    run_idle(e);
    for (int i = 0; i < N; i++) {
        int nref = reference(prompts[i], lens[i], maxt[i], -1, ref[i]);
        dsv4_finish f;
        int n = drain(rq[i], out, &f);
        CHECK_EQ_INT(n, nref);
        CHECK_MSG(n == nref && !memcmp(out, ref[i], sizeof(int32_t) * (size_t)n), "request %d (k=%d) differs", i, k);
        CHECK_EQ_INT(f, DSV4_FINISH_LENGTH);
        dsv4_request_release(rq[i]);
    }
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.running + st.waiting, 0);
    int total_prompt = 0;
    for (int i = 0; i < N; i++) total_prompt += lens[i];
    CHECK_EQ_INT(st.prompt_tokens, total_prompt);
    CHECK_EQ_INT(st.spec_draft_failures, 0);
    if (k) {
        CHECK(st.spec_drafts > 0);
        CHECK(st.spec_accepted_tokens > 0 && st.spec_accepted_tokens < st.spec_draft_tokens);
        CHECK(st.spec_accepted_per_pos[0] >= st.spec_accepted_per_pos[1]);
    }
    for (int i = 0; i < SLOTS; i++) CHECK(T.rows_per_step[0] <= 11);
    for (int s = 0; s < SLOTS && s < 6; s++) CHECK_EQ_INT(T.released[s], 1); /* every slot freed once */
    dsv4_engine_free(e);
}

/* EOS and stop ids inside a speculative run cut right after the token (§4.4). */
static void test_stops(int k) {
    int32_t p[20], ref[200], out[4096];
    prompt_of(77, 20, p);
    int nref = reference(p, 20, 200, -1, ref);
    int32_t eos = ref[37]; /* a token that appears in the output: make it EOS */
    int first = 0;
    while (ref[first] != eos) first++;
    dsv4_engine *e = make(2, 16, k, 1 << 20, eos);
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 200;
    dsv4_request *r;
    dsv4_err err = {0};
    dsv4_engine_submit(e, p, 20, &gp, &r, &err);
    run_idle(e);
    dsv4_finish f;
    int n = drain(r, out, &f);
    CHECK_EQ_INT(n, first + 1);
    CHECK_EQ_INT(f, DSV4_FINISH_STOP);
    CHECK(!memcmp(out, ref, sizeof(int32_t) * (size_t)n));
    dsv4_request_release(r);

    /* ignore_eos + a stop token id instead; min_tokens defers it */
    gp.ignore_eos = 1;
    int32_t sid = ref[50];
    int sfirst = 0;
    while (ref[sfirst] != sid) sfirst++;
    gp.stop_ids = &sid;
    gp.n_stop_ids = 1;
    gp.min_tokens = sfirst + 2; /* skip its first occurrence */
    int second = sfirst + 1;
    while (second < nref && ref[second] != sid) second++;
    dsv4_engine_submit(e, p, 20, &gp, &r, &err);
    run_idle(e);
    n = drain(r, out, &f);
    if (second < nref) {
        CHECK_EQ_INT(n, second + 1);
        CHECK_EQ_INT(f, DSV4_FINISH_STOP);
    } else {
        CHECK_EQ_INT(n, 200);
    }
    dsv4_request_release(r);
    dsv4_engine_free(e);
}

/* A text-level hook (stop strings) that cuts inside a multi-token step. */
typedef struct hook { int32_t target; int seen; } hook;
static int on_tok(void *u, const int32_t *t, int n, int *keep) {
    hook *h = u;
    for (int i = 0; i < n; i++)
        if (t[i] == h->target) {
            *keep = i; /* drop the matched token, like a stop string not included in output */
            h->seen++;
            return 1;
        }
    return 0;
}

static void test_hook(int k) {
    int32_t p[9], ref[100], out[4096];
    prompt_of(5, 9, p);
    reference(p, 9, 100, -1, ref);
    hook h = {ref[23], 0};
    int first = 0;
    while (ref[first] != h.target) first++;
    dsv4_engine *e = make(2, 16, k, 1 << 20, -1);
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 100;
    gp.on_tokens = on_tok;
    gp.user = &h;
    dsv4_request *r;
    dsv4_err err = {0};
    dsv4_engine_submit(e, p, 9, &gp, &r, &err);
    run_idle(e);
    dsv4_finish f;
    int n = drain(r, out, &f);
    CHECK_EQ_INT(n, first);
    CHECK_EQ_INT(f, DSV4_FINISH_STOP);
    CHECK(!memcmp(out, ref, sizeof(int32_t) * (size_t)n));
    int pt, gt;
    dsv4_request_counts(r, &pt, &gt);
    CHECK_EQ_INT(gt, first); /* usage counts only kept tokens */
    dsv4_request_release(r);
    dsv4_engine_free(e);
}

/* A logits processor (constrained decoding, engine.h): sees every generated
 * token before each sample, its mask decides every token (first one
 * included), the raw logprobs are untouched, and the request never drafts. */
typedef struct lproc {
    int calls, bad_history;
    int32_t seen[256];
} lproc;

static void only_mod7(void *u, const int32_t *out, int n_out, float *logits, int vocab) {
    lproc *l = u;
    /* the history only grows: what was seen before is still the prefix */
    if (n_out != l->calls || (n_out > 1 && memcmp(out, l->seen, sizeof(int32_t) * (size_t)(n_out - 1))))
        l->bad_history++;
    if (n_out > 0 && n_out <= 256) memcpy(l->seen, out, sizeof(int32_t) * (size_t)n_out);
    for (int i = 0; i < vocab; i++)
        if (i % 7 != 3) logits[i] = -INFINITY;
    l->calls++;
}

static void test_logits_proc(int k) {
    int32_t p[10], out[4096];
    prompt_of(11, 10, p);
    dsv4_engine *e = make(2, 16, k, 1 << 20, -1);
    lproc l = {0};
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0.8f;
    gp.sampling.seed = 99;
    gp.max_tokens = 40;
    gp.logprobs = 1;
    gp.logits_proc = only_mod7;
    gp.proc_user = &l;
    dsv4_request *r;
    dsv4_err err = {0};
    CHECK(dsv4_engine_submit(e, p, 10, &gp, &r, &err) == 0);
    run_idle(e);
    dsv4_finish f;
    int n = drain(r, out, &f);
    CHECK_EQ_INT(n, 40);
    CHECK_EQ_INT(l.bad_history, 0);
    CHECK(!memcmp(l.seen, out, sizeof(int32_t) * 39)); /* the last call saw the first 39 */
    int pt, gt;
    dsv4_request_counts(r, &pt, &gt);
    CHECK_EQ_INT(gt, 40);
    CHECK_EQ_INT(l.calls, 40);
    dsv4_token_logprob lp[40];
    CHECK_EQ_INT(dsv4_request_logprobs(r, 0, 40, lp), 40);
    float raw[VOCAB], ls[VOCAB];
    int32_t hist[64];
    memcpy(hist, p, sizeof p);
    int ok = 1, lp_ok = 1;
    for (int i = 0; i < 40; i++) {
        ok &= lp[i].token % 7 == 3;
        toy_logits(hist, 10 + i, raw);
        dsv4_log_softmax(raw, VOCAB, ls);
        lp_ok &= fabsf(ls[lp[i].token] - lp[i].logprob) < 1e-4f;
        hist[10 + i] = lp[i].token;
    }
    CHECK_MSG(ok, "a token outside the processor's mask was sampled");
    CHECK_MSG(lp_ok, "logprobs are not those of the raw logits");
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.spec_drafts, 0);
    dsv4_request_release(r);
    dsv4_engine_free(e);
}

/* A victim request's output is unchanged while others arrive, get cancelled and finish around it;
 * cancelled slots are freed and reused. */
static void test_churn_and_cancel(void) {
    int32_t pv[30], ref[300], out[4096], po[8][50];
    prompt_of(1000, 30, pv);
    int nref = reference(pv, 30, 300, -1, ref);
    dsv4_engine *e = make(3, 9, 3, 1 << 20, -1);
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 300;
    dsv4_request *victim, *o[8] = {0};
    dsv4_err err = {0};
    dsv4_engine_submit(e, pv, 30, &gp, &victim, &err);
    for (int i = 0; i < 8; i++) {
        prompt_of(2000 + i, 50, po[i]);
        dsv4_gen_params g2 = gp;
        g2.max_tokens = 5 + i * 7;
        g2.sampling.temperature = (i % 2) ? 0.8f : 0; /* mixed sampled and greedy neighbours */
        g2.sampling.seed = (uint64_t)i;
        dsv4_engine_submit(e, po[i], 50, &g2, &o[i], &err);
        for (int s = 0; s < 3; s++) dsv4_engine_step(e, &err);
        if (i % 3 == 1) dsv4_request_cancel(o[i]);
    }
    run_idle(e);
    dsv4_finish f;
    int n = drain(victim, out, &f);
    CHECK_EQ_INT(n, nref);
    CHECK(!memcmp(out, ref, sizeof(int32_t) * (size_t)nref));
    dsv4_request_release(victim);
    int cancelled = 0;
    for (int i = 0; i < 8; i++) {
        int32_t tmp[4096];
        dsv4_finish fi;
        drain(o[i], tmp, &fi);
        if (i % 3 == 1) cancelled += fi == DSV4_FINISH_ABORT || fi == DSV4_FINISH_LENGTH;
        else CHECK(fi == DSV4_FINISH_LENGTH);
        dsv4_request_release(o[i]);
    }
    CHECK_EQ_INT(cancelled, 3);
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.running + st.waiting, 0);
    dsv4_engine_free(e);
}

/* Decode never starves while long prefills run: the short streams gain a token every step. */
static void test_no_starvation(void) {
    int32_t lp[4][400], sp[2][5];
    dsv4_engine *e = make(6, 16, 0, 1 << 20, -1);
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 60;
    dsv4_request *s[2], *l[4];
    dsv4_err err = {0};
    for (int i = 0; i < 2; i++) {
        prompt_of(300 + i, 5, sp[i]);
        dsv4_engine_submit(e, sp[i], 5, &gp, &s[i], &err);
    }
    for (int i = 0; i < 4; i++) {
        prompt_of(400 + i, 400, lp[i]);
        dsv4_engine_submit(e, lp[i], 400, &gp, &l[i], &err);
    }
    int32_t buf[64];
    dsv4_finish f;
    dsv4_engine_step(e, &err); /* both short prompts prefill in the first step */
    int starved = 0, steps = 0;
    for (int it = 0; it < 59; it++) {
        dsv4_engine_step(e, &err);
        steps++;
        for (int i = 0; i < 2; i++) starved += dsv4_request_poll(s[i], buf, 64, &f, 0) == 0;
    }
    CHECK_EQ_INT(starved, 0);
    run_idle(e);
    for (int i = 0; i < 2; i++) dsv4_request_release(s[i]);
    for (int i = 0; i < 4; i++) dsv4_request_release(l[i]);
    dsv4_engine_free(e);
}

/* Errors: context overflow phrase, bad params, injected forward failure. */
static void test_errors(void) {
    dsv4_engine *e = make(2, 8, 0, 64, -1);
    int32_t p[64] = {0};
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    dsv4_request *r = NULL;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_engine_submit(e, p, 64, &gp, &r, &err), DSV4_ERANGE);
    CHECK_CONTAINS(err.msg, "maximum context length is 64 tokens");
    CHECK(r == NULL);
    p[3] = VOCAB;
    CHECK_EQ_INT(dsv4_engine_submit(e, p, 10, &gp, &r, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "index 3");
    p[3] = 0;
    gp.sampling.top_p = 2;
    CHECK_EQ_INT(dsv4_engine_submit(e, p, 10, &gp, &r, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "top_p");
    dsv4_gen_params_default(&gp);
    gp.max_tokens = 1000; /* clamped to the remaining context: 64 - 10 */
    CHECK_EQ_INT(dsv4_engine_submit(e, p, 10, &gp, &r, &err), 0);
    run_idle(e);
    int32_t out[4096];
    dsv4_finish f;
    CHECK_EQ_INT(drain(r, out, &f), 54);
    CHECK_EQ_INT(f, DSV4_FINISH_LENGTH);
    dsv4_request_release(r);
    dsv4_gen_params_default(&gp);
    dsv4_engine_submit(e, p, 10, &gp, &r, &err);
    T.fail_next = 1;
    run_idle(e);
    drain(r, out, &f);
    CHECK_EQ_INT(f, DSV4_FINISH_ERROR);
    dsv4_request_release(r);
    /* the engine keeps serving after a failed step */
    dsv4_engine_submit(e, p, 10, &gp, &r, &err);
    run_idle(e);
    CHECK_EQ_INT(drain(r, out, &f), 16);
    dsv4_request_release(r);
    dsv4_engine_free(e);

    dsv4_engine_opts o = {9, 16, 100, 0, 1, {{0}}, 0, 0};
    CHECK_EQ_INT(dsv4_engine_create(&o, &RUN, NULL, &e, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "max_num_seqs");
    dsv4_engine_opts o2 = {2, 16, 100, 6, 1, {{0}}, 0, 0};
    CHECK_EQ_INT(dsv4_engine_create(&o2, &RUN, &DR, &e, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "block size 5");
}

/* Sampled requests: same seed -> same output, with and without neighbours. */
static void test_seeded(void) {
    int32_t p[12], a[64], b[64];
    prompt_of(9, 12, p);
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0.9f;
    gp.sampling.seed = 1234;
    gp.max_tokens = 40;
    dsv4_err err = {0};
    dsv4_finish f;
    dsv4_request *r, *x;
    dsv4_engine *e = make(4, 16, 3, 1 << 20, -1);
    dsv4_engine_submit(e, p, 12, &gp, &r, &err);
    run_idle(e);
    int na = drain(r, a, &f);
    dsv4_request_release(r);
    int32_t q[30];
    prompt_of(10, 30, q);
    dsv4_engine_submit(e, q, 30, &gp, &x, &err);
    dsv4_engine_submit(e, p, 12, &gp, &r, &err);
    run_idle(e);
    int nb = drain(r, b, &f);
    CHECK_EQ_INT(na, nb);
    CHECK(na == nb && !memcmp(a, b, sizeof(int32_t) * (size_t)na));
    dsv4_request_release(r);
    dsv4_request_release(x);
    dsv4_engine_free(e);
}

/*
 * Logprobs (SERVING.md §3.3, §7.2): every generated token's record equals an
 * independent log_softmax (double) of the toy model's raw logits after the
 * prompt and the tokens before it, also when speculation emits several tokens
 * per step and when sampling with penalties (logprobs stay raw). Requests that
 * did not ask get none.
 */
static void test_logprobs(int k, float temp) {
    int32_t p[2][20], out[2][4096], h[MAXPOS];
    prompt_of(77, 20, p[0]);
    prompt_of(78, 9, p[1]);
    dsv4_engine *e = make(2, 16, k, 1 << 20, -1);
    dsv4_request *r[2];
    dsv4_err err = {0};
    for (int i = 0; i < 2; i++) {
        dsv4_gen_params gp;
        dsv4_gen_params_default(&gp);
        gp.sampling.temperature = temp;
        gp.sampling.seed = 99;
        gp.sampling.presence_penalty = temp > 0 ? 1.5f : 0; /* changes sampling, not the reported logprobs */
        gp.max_tokens = 40;
        gp.logprobs = i == 0;
        gp.top_logprobs = 7;
        CHECK_EQ_INT(dsv4_engine_submit(e, p[i], i ? 9 : 20, &gp, &r[i], &err), 0);
    }
    run_idle(e);
    dsv4_finish f;
    int n = drain(r[0], out[0], &f);
    CHECK_EQ_INT(n, 40);
    dsv4_token_logprob *lp = calloc((size_t)n + 1, sizeof *lp);
    CHECK_EQ_INT(dsv4_request_logprobs(r[0], 0, n + 5, lp), n);
    memcpy(h, p[0], sizeof(int32_t) * 20);
    int bad = 0, top1_hits = 0;
    for (int g = 0; g < n; g++) {
        float lg[VOCAB];
        toy_logits(h, 20 + g, lg);
        double mx = lg[0], s = 0, ref[VOCAB];
        for (int v = 1; v < VOCAB; v++) mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < VOCAB; v++) s += exp((double)lg[v] - mx);
        for (int v = 0; v < VOCAB; v++) ref[v] = lg[v] - mx - log(s);
        bad += lp[g].token != out[0][g] || fabs(lp[g].logprob - ref[out[0][g]]) > 1e-5 || lp[g].n_top != 7;
        for (int t = 0; t < lp[g].n_top; t++) {
            int32_t id = lp[g].top_ids[t];
            bad += fabs(lp[g].top_logprobs[t] - ref[id]) > 1e-5;
            if (t > 0) bad += lp[g].top_logprobs[t] > lp[g].top_logprobs[t - 1];
            int above = 0; /* exactly t ids are strictly more likely */
            for (int v = 0; v < VOCAB; v++) above += ref[v] > ref[id];
            bad += above > t;
        }
        top1_hits += lp[g].top_ids[0] == out[0][g];
        h[20 + g] = out[0][g];
    }
    CHECK_MSG(bad == 0, "k=%d temp=%g: %d logprob mismatches", k, temp, bad);
    if (temp == 0) CHECK_EQ_INT(top1_hits, n); /* greedy picks the raw top-1 */
    else CHECK(top1_hits < n);                 /* sampling with a penalty strays from it */
    CHECK_EQ_INT(dsv4_request_logprobs(r[0], 35, 10, lp), 5);
    CHECK_EQ_INT(drain(r[1], out[1], &f), 40);
    CHECK_EQ_INT(dsv4_request_logprobs(r[1], 0, 40, lp), 0);
    if (k) {
        dsv4_engine_stats st;
        dsv4_engine_get_stats(e, &st);
        CHECK(st.spec_accepted_tokens > 0); /* multi-token steps were covered */
    }
    free(lp);
    dsv4_request_release(r[0]);
    dsv4_request_release(r[1]);
    dsv4_engine_free(e);
    /* top_logprobs out of range is refused */
    e = make(1, 8, 0, 1 << 20, -1);
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.logprobs = 1;
    gp.top_logprobs = DSV4_MAX_TOP_LOGPROBS + 1;
    CHECK_EQ_INT(dsv4_engine_submit(e, p[0], 20, &gp, &r[0], &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "top_logprobs");
    dsv4_engine_free(e);
}

/* Threaded: the engine thread serves requests submitted from several client threads. */
typedef struct client { dsv4_engine *e; int id; int ok; } client;
static void *client_main(void *arg) {
    client *c = arg;
    int32_t p[40], ref[64], out[4096];
    prompt_of(500 + c->id, 20 + c->id, p);
    int nref = reference(p, 20 + c->id, 48, -1, ref);
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 48;
    dsv4_request *r;
    dsv4_err err = {0};
    if (dsv4_engine_submit(c->e, p, 20 + c->id, &gp, &r, &err)) return NULL;
    int n = 0;
    dsv4_finish f = DSV4_FINISH_NONE;
    while (f == DSV4_FINISH_NONE) n += dsv4_request_poll(r, out + n, 64, &f, 1000);
    c->ok = n == nref && !memcmp(out, ref, sizeof(int32_t) * (size_t)n) && f == DSV4_FINISH_LENGTH;
    dsv4_request_release(r);
    return NULL;
}

static void test_threaded(void) {
    dsv4_engine *e = make(4, 12, 4, 1 << 20, -1);
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_engine_start(e, &err), 0);
    pthread_t th[6];
    client c[6];
    for (int i = 0; i < 6; i++) {
        c[i] = (client){e, i, 0};
        pthread_create(&th[i], NULL, client_main, &c[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(c[i].ok, "client %d", i);
    }
    dsv4_engine_free(e);
}

/* Per-batch-size k (DSPARK.md §5.3): no drafts while 2+ requests run, k=2 alone. */
static void test_k_schedule(void) {
    memset(&T, 0, sizeof T);
    memset(dlen, 0, sizeof dlen);
    dsv4_engine_opts o = {4, 16, 1 << 20, 4, -1, {{2, 64, 0}, {1, 1, 2}}, 2, 0};
    dsv4_engine *e;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_engine_create(&o, &RUN, &DR, &e, &err), 0);
    int32_t p[2][10], ref[2][64], out[4096];
    dsv4_request *r[2];
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    for (int i = 0; i < 2; i++) {
        prompt_of(60 + i, 10, p[i]);
        gp.max_tokens = i ? 40 : 10;
        reference(p[i], 10, gp.max_tokens, -1, ref[i]);
        dsv4_engine_submit(e, p[i], 10, &gp, &r[i], &err);
    }
    run_idle(e);
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    /* drafts only once request 0 finished: all of size 2, never 4 */
    CHECK(st.spec_drafts > 0 && st.spec_draft_tokens == 2 * st.spec_drafts);
    for (int i = 0; i < 2; i++) {
        dsv4_finish f;
        int n = drain(r[i], out, &f);
        CHECK(n == (i ? 40 : 10) && !memcmp(out, ref[i], sizeof(int32_t) * (size_t)n));
        dsv4_request_release(r[i]);
    }
    dsv4_engine_free(e);
    dsv4_engine_opts bad = {4, 16, 1 << 20, 4, -1, {{1, 8, 5}}, 1, 0};
    CHECK_EQ_INT(dsv4_engine_create(&bad, &RUN, &DR, &e, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "num_speculative_tokens_per_batch_size");
}

/* ------------------------------------------------------------------------ */
/* Prefix caching (spec/SERVING.md §8.7)                                    */
/* ------------------------------------------------------------------------ */

/* Run one greedy request alone to the end; check it equals the reference;
 * return its cached prompt tokens. */
static int run_one(dsv4_engine *e, const int32_t *p, int n, int maxt) {
    int32_t ref[512], out[4096];
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = maxt;
    dsv4_request *r;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_engine_submit(e, p, n, &gp, &r, &err), 0);
    run_idle(e);
    dsv4_finish f;
    int got = drain(r, out, &f), nref = reference(p, n, maxt, -1, ref);
    CHECK_EQ_INT(f, DSV4_FINISH_LENGTH);
    CHECK_MSG(got == nref && !memcmp(out, ref, sizeof(int32_t) * (size_t)got), "prompt of %d tokens: output differs",
              n);
    int c = dsv4_request_cached_tokens(r);
    dsv4_request_release(r);
    return c;
}

/* Hits (same prompt again, a longer prompt, a multi-turn continuation), a
 * miss where the ring no longer holds the window below the shared prefix, and
 * every output equal to the cold reference. */
static void test_prefix_cache(int k) {
    dsv4_engine *e = make_ex(2, 16, k, 1 << 20, -1, 1);
    int32_t p[200], q[200], ref[64];
    prompt_of(500, 40, p);
    CHECK_EQ_INT(run_one(e, p, 40, 20), 0); /* cold */
    CHECK_EQ_INT(run_one(e, p, 40, 20), 39); /* the prompt's state was kept at its prefill end */
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.prefix_queries, 80);
    CHECK_EQ_INT(st.prefix_hits, 39);
    CHECK_EQ_INT(st.prompt_tokens, 41); /* 40 cold + 1 warm row */
    CHECK(st.prefix_snapshots >= 1);
    /* a longer prompt: resumes at the end of the kept prompt */
    memcpy(q, p, sizeof(int32_t) * 40);
    prompt_of(501, 7, q + 40);
    CHECK_EQ_INT(run_one(e, q, 47, 10), 40);
    /* multi-turn: prompt + its whole output + a new turn reuses the finished slot */
    int nr = reference(p, 40, 20, -1, ref);
    memcpy(q, p, sizeof(int32_t) * 40);
    memcpy(q + 40, ref, sizeof(int32_t) * (size_t)nr);
    prompt_of(502, 5, q + 40 + nr);
    int c = run_one(e, q, 45 + nr, 8);
    if (k == 0) CHECK_EQ_INT(c, 40 + nr - 1); /* every committed position (the last token was never fed) */
    else CHECK(c >= 40);                      /* the drafter's context may lag a verify step behind */
    /* diverging after 30 tokens: the kept windows sit past position 30, so exact
     * reuse is impossible in this toy (ring of TOYCAP rows) — a clean miss */
    memcpy(q, p, sizeof(int32_t) * 30);
    prompt_of(503, 12, q + 30);
    CHECK_EQ_INT(run_one(e, q, 42, 6), 0);
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.spec_draft_failures, 0);
    dsv4_engine_free(e);
}

/* LRU eviction: with 8 slots and two kept states per request (the finished
 * slot and the prompt snapshot), older prompts are evicted, recent ones hit. */
static void test_prefix_evict(void) {
    dsv4_engine *e = make_ex(1, 32, 0, 1 << 20, -1, 1);
    int32_t p[8][30];
    for (int i = 0; i < 8; i++) {
        prompt_of(600 + i, 30, p[i]);
        CHECK_EQ_INT(run_one(e, p[i], 30, 4), 0);
    }
    CHECK_EQ_INT(run_one(e, p[7], 30, 4), 29); /* most recent: kept */
    CHECK_EQ_INT(run_one(e, p[0], 30, 4), 0);  /* oldest: evicted */
    int rel = 0;
    for (int s = 0; s < SLOTS; s++) rel += T.released[s];
    CHECK(rel > 0); /* evicted slots were released before reuse */
    dsv4_engine_free(e);
    /* off: nothing is kept, nothing counted, every slot released at finish */
    e = make_ex(1, 32, 0, 1 << 20, -1, 0);
    CHECK_EQ_INT(run_one(e, p[1], 30, 4), 0);
    CHECK_EQ_INT(run_one(e, p[1], 30, 4), 0);
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.prefix_queries + st.prefix_hits + st.prefix_snapshots, 0);
    CHECK_EQ_INT(T.released[0], 2);
    dsv4_engine_free(e);
}

/* Concurrent requests sharing a long prefix, with snapshots and hits while
 * others run, chunked prefill and speculation: each equals its reference. */
static void test_prefix_concurrent(int k) {
    dsv4_engine *e = make_ex(3, 13, k, 1 << 20, -1, 1);
    int32_t prompts[9][80], out[4096], ref[64];
    dsv4_request *rq[9];
    dsv4_err err = {0};
    for (int i = 0; i < 9; i++) {
        prompt_of(700, 60, prompts[i]);           /* shared 60-token prefix */
        prompt_of(701 + i % 3, 10, prompts[i] + 60); /* three distinct endings, each seen three times */
        dsv4_gen_params gp;
        dsv4_gen_params_default(&gp);
        gp.sampling.temperature = 0;
        gp.max_tokens = 12 + i;
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[i], 70, &gp, &rq[i], &err), 0);
        if (i % 3 == 2) run_idle(e); /* arrivals in three waves */
    }
    int hits = 0;
    for (int i = 0; i < 9; i++) {
        int nref = reference(prompts[i], 70, 12 + i, -1, ref);
        dsv4_finish f;
        int n = drain(rq[i], out, &f);
        CHECK_MSG(n == nref && !memcmp(out, ref, sizeof(int32_t) * (size_t)n), "request %d (k=%d) differs", i, k);
        hits += dsv4_request_cached_tokens(rq[i]) > 0;
        dsv4_request_release(rq[i]);
    }
    CHECK(hits >= 3); /* the later waves reuse the earlier prompts' states */
    dsv4_engine_free(e);
}

/* Prompt logprobs (gen_params.prompt_logprobs; SERVING.md §3.6 echo + logprobs):
 * every record i >= 1 is log_softmax of the toy logits after prompt[0..i) at
 * prompt[i], with its rank; the prefill runs in chunks of at most
 * DSV4_PROMPT_LOGPROB_CHUNK rows and is never served from the prefix cache,
 * and a plain request batched alongside is unaffected. */
static void test_prompt_logprobs(int k) {
    enum { N = 150 };
    dsv4_engine *e = make_ex(2, 256, k, 1 << 20, -1, 1);
    int32_t p[N], q[20], out[4096], ref[64];
    prompt_of(900, N, p);
    prompt_of(901, 20, q);
    CHECK_EQ_INT(run_one(e, p, N, 4), 0); /* cold: the prompt's state is now cached */
    dsv4_request *r, *other;
    dsv4_err err = {0};
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 6;
    CHECK_EQ_INT(dsv4_engine_submit(e, q, 20, &gp, &other, &err), 0);
    gp.prompt_logprobs = 1;
    gp.prompt_top_logprobs = 3;
    CHECK_EQ_INT(dsv4_engine_submit(e, p, N, &gp, &r, &err), 0);
    dsv4_token_logprob *lp = calloc(N, sizeof *lp);
    int32_t rank[N];
    CHECK_EQ_INT(dsv4_request_prompt_logprobs(r, lp, rank, N), 0); /* not prefilled yet */
    int steps0 = T.steps;
    run_idle(e);
    for (int s = steps0; s < steps0 + 3 && s < 1024; s++)
        CHECK_MSG(T.rows_per_step[s] <= DSV4_PROMPT_LOGPROB_CHUNK + 20, "step %d: %d rows", s, T.rows_per_step[s]);
    CHECK_EQ_INT(dsv4_request_cached_tokens(r), 0);
    CHECK_EQ_INT(dsv4_request_prompt_logprobs(r, lp, rank, N - 1), 0); /* too small a buffer */
    CHECK_EQ_INT(dsv4_request_prompt_logprobs(r, lp, rank, N), N);
    int bad = 0;
    for (int i = 1; i < N; i++) {
        float lg[VOCAB];
        toy_logits(p, i, lg);
        double mx = lg[0], sum = 0;
        for (int v = 1; v < VOCAB; v++) mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < VOCAB; v++) sum += exp((double)lg[v] - mx);
        int above = 0;
        for (int v = 0; v < VOCAB; v++) above += lg[v] > lg[p[i]];
        bad += lp[i].token != p[i] || fabs(lp[i].logprob - (lg[p[i]] - mx - log(sum))) > 1e-5 ||
               rank[i] != above + 1 || lp[i].n_top != 3 || lp[i].top_ids[0] != argmax(lg);
    }
    CHECK_MSG(bad == 0, "k=%d: %d prompt logprob records wrong", k, bad);
    dsv4_finish f;
    int n = drain(r, out, &f), nref = reference(p, N, 6, -1, ref);
    CHECK(n == nref && !memcmp(out, ref, sizeof(int32_t) * (size_t)n));
    n = drain(other, out, &f);
    nref = reference(q, 20, 6, -1, ref);
    CHECK(n == nref && !memcmp(out, ref, sizeof(int32_t) * (size_t)n));
    CHECK_EQ_INT(dsv4_request_prompt_logprobs(other, lp, rank, N), 0); /* not asked */
    free(lp);
    dsv4_request_release(r);
    dsv4_request_release(other);
    dsv4_engine_free(e);
}

/*
 * The greedy-ids path itself (runner forward_ids, issue 7). A batch of plain
 * greedy requests (speculating or not) is served from ids alone: no logits
 * row reaches the engine, and every token equals the single-stream
 * reference. A step holding a request the ids cannot serve (sampled, logit
 * bias, a penalty, logprobs, a logits processor) takes the full logits for
 * the whole step, and its output equals the host path's (ids off) token for
 * token. DSV4_DEVICE_ARGMAX=0 turns the path off.
 */
static void run_mixed(int k, int variant, int32_t out[3][4096], int n[3], dsv4_engine_stats *st) {
    dsv4_engine *e = make(3, 13, k, 1 << 20, -1);
    dsv4_request *r[3];
    dsv4_err err = {0};
    for (int i = 0; i < 3; i++) {
        int32_t p[30];
        prompt_of(300 + i, 10 + 7 * i, p);
        dsv4_gen_params gp;
        dsv4_gen_params_default(&gp);
        gp.sampling.temperature = 0;
        gp.max_tokens = 25 + 5 * i;
        if (i == 2) { /* the request that needs whole rows */
            switch (variant) {
            case 1: gp.sampling.temperature = 0.7f, gp.sampling.seed = 5; break;
            case 2: gp.sampling.presence_penalty = 1.0f; break;
            case 3: gp.logprobs = 1, gp.top_logprobs = 3; break;
            case 4: gp.sampling.repetition_penalty = 1.3f; break;
            default: break;
            }
        }
        CHECK_EQ_INT(dsv4_engine_submit(e, p, 10 + 7 * i, &gp, &r[i], &err), 0);
    }
    run_idle(e);
    for (int i = 0; i < 3; i++) {
        dsv4_finish f;
        n[i] = drain(r[i], out[i], &f);
        dsv4_request_release(r[i]);
    }
    dsv4_engine_get_stats(e, st);
    dsv4_engine_free(e);
}

static void test_greedy_ids(int k) {
    int saved = toy_ids;
    int32_t a[3][4096], b[3][4096];
    int na[3], nb[3];
    dsv4_engine_stats sa, sb;
    for (int variant = 0; variant <= 4; variant++) {
        toy_ids = 0;
        run_mixed(k, variant, a, na, &sa);
        CHECK_EQ_INT(T.id_rows, 0);
        CHECK_EQ_INT(sa.greedy_id_steps, 0);
        toy_ids = 1;
        run_mixed(k, variant, b, nb, &sb);
        for (int i = 0; i < 3; i++)
            CHECK_MSG(na[i] == nb[i] && !memcmp(a[i], b[i], sizeof(int32_t) * (size_t)na[i]),
                      "k=%d variant %d request %d: ids path differs from the host path", k, variant, i);
        CHECK_EQ_INT(sa.generation_tokens, sb.generation_tokens);
        CHECK_EQ_INT(sa.spec_accepted_tokens, sb.spec_accepted_tokens);
        if (variant == 0) { /* all greedy: every logit row came back as an id */
            CHECK(T.id_rows > 0);
            CHECK_EQ_INT(T.host_rows, 0);
            CHECK(sb.greedy_id_steps > 0);
            for (int i = 0; i < 3; i++) {
                int32_t p[30], ref[64];
                prompt_of(300 + i, 10 + 7 * i, p);
                int nref = reference(p, 10 + 7 * i, 25 + 5 * i, -1, ref);
                CHECK_MSG(nb[i] == nref && !memcmp(b[i], ref, sizeof(int32_t) * (size_t)nref),
                          "k=%d request %d: ids path differs from the reference", k, i);
            }
        } else { /* the third request needs rows while it runs; the others finish earlier */
            CHECK(T.host_rows > 0);
        }
    }
    /* DSV4_DEVICE_ARGMAX=0: the runner's forward_ids is not used */
    setenv("DSV4_DEVICE_ARGMAX", "0", 1);
    toy_ids = 1;
    run_mixed(k, 0, b, nb, &sb);
    unsetenv("DSV4_DEVICE_ARGMAX");
    CHECK_EQ_INT(T.id_rows, 0);
    CHECK_EQ_INT(sb.greedy_id_steps, 0);
    toy_ids = saved;
}

/*
 * dsv4_engine_stats_diff: every counter (scalar and array) is now - base,
 * every gauge is now's, checked over the same field list that declares the
 * struct, so a field added to the list is covered here too; out may alias.
 */
static void test_stats_diff(void) {
    dsv4_engine_stats now, base, d;
    memset(&now, 0, sizeof now);
    memset(&base, 0, sizeof base);
    int i = 0;
#define SET_(t, f) now.f = (t)(1000 + 7 * i), base.f = (t)(3 * i + 1), i++;
#define SET_A_(t, f, n) \
    for (int j = 0; j < (n); j++) now.f[j] = (t)(1000 + 7 * i + j), base.f[j] = (t)(3 * i + 2 * j + 1); \
    i++;
    DSV4_ENGINE_STATS_FIELDS(SET_, SET_A_, SET_)
    dsv4_engine_stats_diff(&now, &base, &d);
    int bad = 0, n_counters = 0, n_gauges = 0;
#define CHK_C_(t, f) bad += d.f != (t)(now.f - base.f) || d.f == now.f, n_counters++;
#define CHK_A_(t, f, n) \
    for (int j = 0; j < (n); j++) bad += d.f[j] != (t)(now.f[j] - base.f[j]) || d.f[j] == now.f[j]; \
    n_counters++;
#define CHK_G_(t, f) bad += d.f != now.f, n_gauges++;
    DSV4_ENGINE_STATS_FIELDS(CHK_C_, CHK_A_, CHK_G_)
    CHECK_EQ_INT(bad, 0);
    CHECK(n_counters >= 16); /* steps .. greedy_id_steps, incl. preemptions (the service once missed it) */
    CHECK_EQ_INT(n_gauges, 6);
    CHECK_EQ_INT(d.preemptions, now.preemptions - base.preemptions);
    CHECK_EQ_INT(d.greedy_id_steps, now.greedy_id_steps - base.greedy_id_steps);
    CHECK_EQ_INT(d.running, now.running);
    dsv4_engine_stats alias = now;
    dsv4_engine_stats_diff(&alias, &base, &alias);
    CHECK(alias.steps == d.steps && alias.spec_draft_per_pos[2] == d.spec_draft_per_pos[2] &&
          alias.spec_verify_seconds == d.spec_verify_seconds && alias.kv_page_bytes == d.kv_page_bytes);
    dsv4_engine_stats_diff(&now, &now, &d); /* since itself: counters 0, gauges kept */
    CHECK_EQ_INT(d.steps, 0);
    CHECK(d.spec_verify_seconds == 0);
    CHECK_EQ_INT(d.spec_draft_per_pos[3], 0);
    CHECK_EQ_INT(d.kv_pages_total, now.kv_pages_total);
}

static void all_tests(void) {
    test_prompt_logprobs(0);
    test_prompt_logprobs(3);
    test_prefix_cache(0);
    test_prefix_cache(4);
    test_prefix_evict();
    test_prefix_concurrent(0);
    test_prefix_concurrent(5);
    test_k_schedule();
    test_batched_equals_single(0);
    test_batched_equals_single(3);
    test_batched_equals_single(5);
    test_stops(0);
    test_stops(4);
    test_hook(0);
    test_hook(5);
    test_logits_proc(0);
    test_logits_proc(4);
    test_churn_and_cancel();
    test_no_starvation();
    test_errors();
    test_seeded();
    test_logprobs(0, 0);
    test_logprobs(4, 0);
    test_logprobs(0, 0.8f);
    test_logprobs(5, 0.8f);
    test_threaded();
}

int main(void) {
    test_stats_diff();
    test_greedy_ids(0);
    test_greedy_ids(4);
    toy_ids = 0; /* the host path (full logits every step) */
    all_tests();
    toy_ids = 1; /* the runner offers greedy ids: every test must still pass */
    all_tests();
    return TEST_REPORT();
}
