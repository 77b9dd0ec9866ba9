/*
 * The C DSpark drafter (src/model/dspark.c) against the independent PyTorch
 * reference tools/ref_dspark.py (fixtures tests/fixtures/ref/dspark, layout in
 * tools/REF_FORMAT.md), on the tiny DSpark checkpoint, in HF and reference
 * numerics. The context features come from the fixture (the reference's
 * transformers target), so this validates the drafter in isolation:
 *   - every (prompt, anchor P) case: draft logits within the fixture's
 *     tolerance, greedy tokens equal where the top-2 margin allows,
 *     confidence logits;
 *   - the batched case: two requests in two slots drafted in one call;
 *   - the speculative trace: ring written only with accepted rows P..P+a
 *     (DSPARK.md §4.6), next anchor at P+a+1 — each step's logits;
 *   - end to end (HF numerics): features from OUR target forward (hc-mean of
 *     the outputs of the tapped layers, §2.2) equal the fixture's, and the
 *     draft from them matches.
 * A flipped choice (anchor at P-1, input-of-layer taps, no K/V round-trip)
 * moves the logits by the fixture's `sensitivity` values, > 10x the tolerance.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/dspark.h"
#include "model/forward.h"
#include "model/safetensors.h"
#include "engine/sampler.h"
#include "test.h"
#include "test_models.h"

static char models[512], fixdir[600];

/* An array entry {file, shape} of the fixture → malloc'd floats (count checked). */
static float *load_array(const cJSON *entry, size_t *count) {
    const cJSON *sh = cJSON_GetObjectItem(entry, "shape"), *it;
    size_t want = 1;
    cJSON_ArrayForEach(it, sh) want *= (size_t)it->valueint;
    char path[900];
    snprintf(path, sizeof path, "%s/%s", fixdir, cJSON_GetObjectItem(entry, "file")->valuestring);
    size_t n = 0;
    float *a = (float *)tm_read_file(path, &n);
    CHECK_MSG(a && n == want * 4, "%s: %zu bytes, expected %zu", path, n, want * 4);
    if (count) *count = want;
    return a;
}

static const cJSON *arr(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "arrays"), key);
}

static int geti(const cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valueint; }

typedef struct drun {
    dsv4_config cfg;
    dsv4_ckpt *ck;
    dsv4_weights *w;
    dsv4_backend *be;
    dsv4_model *m;
    dsv4_state *st;
    dsv4_dspark *d;
} drun;

static int open_drafter(dsv4_numerics num, drun *r) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tiny-dspark", models);
    dsv4_err e = {0};
    memset(r, 0, sizeof *r);
    int rc = dsv4_config_load(dir, &r->cfg, &e);
    if (!rc) rc = dsv4_ckpt_open(dir, &r->ck, &e);
    if (!rc) rc = dsv4_config_set_drafts(&r->cfg, r->ck, &e);
    if (!rc) rc = dsv4_weights_bind(&r->cfg, r->ck, &r->w, &e);
    if (!rc) r->be = dsv4_backend_cpu_create(num, &e);
    if (!rc && !r->be) rc = e.code ? e.code : DSV4_EBACKEND;
    if (!rc) rc = dsv4_model_create(&r->cfg, r->w, r->be, &r->m, &e);
    if (!rc) rc = dsv4_dspark_create(&r->cfg, r->w, r->m, 2, &r->d, &e);
    int ratios[DSV4_MAX_LAYERS];
    for (int l = 0; l < r->cfg.num_hidden_layers; l++) ratios[l] = dsv4_config_layer_ratio(&r->cfg, l);
    if (!rc) rc = dsv4_state_create(r->be, &r->cfg, ratios, r->cfg.num_hidden_layers, 1, 256, 0, &r->st, &e);
    CHECK_MSG(rc == 0, "open tiny-dspark: %s", e.msg);
    return rc;
}

static void close_drafter(drun *r) {
    dsv4_state_free(r->st);
    dsv4_dspark_free(r->d);
    dsv4_model_free(r->m);
    if (r->be) r->be->free(r->be);
    dsv4_weights_free(r->w);
    dsv4_ckpt_free(r->ck);
}

/* Context rows for n segments: segment s = rows feats_s[0..len_s) at positions pos0_s.. in slot_s. */
static int context(drun *r, int ns, const int *slot, const int *pos0, const int *len, const float *const *feats) {
    int T = 0, F = r->d->main_proj.in;
    for (int s = 0; s < ns; s++) T += len[s];
    int32_t *mem = malloc(sizeof(int32_t) * ((size_t)T * 4 + 3 * 8 + 1));
    float *fx = malloc(sizeof(float) * (size_t)T * F);
    int32_t *tok = mem, *pos = tok + T, *sl = pos + T, *sq = sl + T, *cu = sq + T, *ss = cu + 9, *sp = ss + 8;
    cu[0] = 0;
    for (int s = 0, t = 0; s < ns; s++) {
        for (int i = 0; i < len[s]; i++, t++) {
            tok[t] = 0;
            pos[t] = pos0[s] + i;
            sl[t] = slot[s];
            sq[t] = s;
            memcpy(fx + (size_t)t * F, feats[s] + (size_t)i * F, sizeof(float) * F);
        }
        cu[s + 1] = t;
        ss[s] = slot[s];
        sp[s] = pos0[s];
    }
    dsv4_batch b = {.n_rows = T, .n_seqs = ns, .token = tok, .pos = pos, .slot = sl, .seq_idx = sq,
                    .cu_seqlens = cu, .seq_slot = ss, .seq_pos0 = sp};
    dsv4_err e = {0};
    int rc = dsv4_dspark_context(r->d, &b, fx, &e);
    CHECK_MSG(rc == 0, "context: %s", e.msg);
    free(mem);
    free(fx);
    return rc;
}

/*
 * Context features from OUR target forward (DSPARK.md §2.2): the block loop of
 * dsv4_forward run here with the public block API, reading the streams after
 * each tapped layer and averaging the hc_mult copies on the host (the target
 * forward has no tap output yet). feats: [T][n_tap*d].
 */
static int c_features(drun *r, const int32_t *ids, int T, float *feats) {
    const dsv4_config *cfg = &r->cfg;
    int hc = cfg->hc_mult, dm = cfg->hidden_size, nt = cfg->n_dspark_target_layer_ids;
    int32_t *mem = malloc(sizeof(int32_t) * (size_t)T * 3), *pos = mem, *sl = mem + T, *sq = mem + 2 * T;
    float *X = malloc(sizeof(float) * (size_t)T * hc * dm);
    for (int i = 0; i < T; i++) pos[i] = i, sl[i] = 0, sq[i] = 0;
    int32_t cu[2] = {0, T}, ss = 0, sp = 0;
    dsv4_batch b = {.n_rows = T, .n_seqs = 1, .token = ids, .pos = pos, .slot = sl, .seq_idx = sq,
                    .cu_seqlens = cu, .seq_slot = &ss, .seq_pos0 = &sp};
    dsv4_err e = {0};
    dsv4_buf Xb = {0};
    dsv4_backend *be = r->be;
    int rc = dsv4_state_reset_slot(r->st, 0, &e);
    if (!rc) rc = be->batch_begin(be, &b, &e);
    if (!rc) rc = be->buf_alloc(be, be->act_dtype, T, (int64_t)hc * dm, &Xb, &e);
    if (!rc) rc = be->embed(be, &r->m->embed, &b, hc, &Xb, &e);
    for (int l = 0; l < r->m->n_layers && !rc; l++) {
        rc = dsv4_block_forward(cfg, &r->m->layers[l], &r->st->layers[l], be, &b, &Xb, &e);
        for (int k = 0; k < nt && !rc; k++) {
            if (cfg->dspark_target_layer_ids[k] != l) continue;
            rc = be->buf_read(be, &Xb, X, &e);
            for (int t = 0; t < T && !rc; t++)
                for (int j = 0; j < dm; j++) {
                    double acc = 0; /* plain mean over the streams, no weights, no norm */
                    for (int c = 0; c < hc; c++) acc += X[((size_t)t * hc + c) * dm + j];
                    feats[((size_t)t * nt + k) * dm + j] = (float)(acc / hc);
                }
        }
    }
    CHECK_MSG(rc == 0, "target forward: %s", e.msg);
    be->buf_free(be, &Xb);
    free(mem);
    free(X);
    return rc;
}

/* Compare n*γ rows of logits; returns max |diff|. */
static double maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/*
 * Sampled drafting (DSPARK.md §2.5, §4.3) on the state the greedy case just
 * used: the first draft's q must be softmax(z_1 / T) of the greedy run's z_1
 * (same anchor, same ring; later z_i depend on the sampled previous draft),
 * every pick must be the inverse-CDF draw of its q at its uniform, and T = 0
 * must give the greedy drafts with q untouched.
 */
static void sampled_case(drun *r, int32_t sl, int32_t an, int32_t ps, const int32_t *greedy, const float *lg, int g,
                         int64_t V) {
    dsv4_err e = {0};
    float T = 0.7f, T0 = 0.0f;
    double u[64];
    for (int i = 0; i < g; i++) u[i] = (i + 0.5) / g;
    float *q = calloc((size_t)g * (size_t)V, sizeof(float));
    int32_t ts[64];
    int smpd = -1;
    dsv4_draft_sampling smp = {&T, u, q, &smpd};
    int rc = dsv4_dspark_draft_sampled(r->d, 1, &sl, &an, &ps, &smp, ts, NULL, NULL, &e);
    CHECK_MSG(rc == 0 && smpd == 1, "sampled draft: rc %d sampled %d %s", rc, smpd, e.msg);
    double mx = lg[0], sum = 0, worst = 0;
    for (int64_t v = 1; v < V; v++) mx = fmax(mx, lg[v]);
    for (int64_t v = 0; v < V; v++) sum += exp((lg[v] - mx) / T);
    for (int64_t v = 0; v < V; v++) worst = fmax(worst, fabs(q[v] - exp((lg[v] - mx) / T) / sum));
    CHECK_MSG(worst < 1e-5, "sampled draft: q_1 differs from softmax(z_1/T) by %g", worst);
    for (int i = 0; i < g; i++) {
        double tot = 0;
        for (int64_t v = 0; v < V; v++) tot += q[(size_t)i * V + v];
        CHECK_MSG(fabs(tot - 1) < 1e-4, "sampled draft %d: q sums to %g", i, tot);
        CHECK_EQ_INT(ts[i], dsv4_sample_from(q + (size_t)i * V, (int)V, u[i]));
    }
    smp.temperature = &T0;
    rc = dsv4_dspark_draft_sampled(r->d, 1, &sl, &an, &ps, &smp, ts, NULL, NULL, &e);
    CHECK(rc == 0 && smpd == 0);
    for (int i = 0; i < g; i++) CHECK_EQ_INT(ts[i], greedy[i]);
    free(q);
}

static void run_mode(const cJSON *idx, const char *mode, dsv4_numerics num) {
    drun r;
    if (open_drafter(num, &r)) return;
    int g = r.cfg.dspark_block_size, V = r.cfg.vocab_size, F = r.d->main_proj.in;
    double tol = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "tolerance"), mode), "logits_abs")
                     ->valuedouble;
    dsv4_err e = {0};
    /* prompts: features by name */
    const cJSON *p;
    float *feats[8] = {0};
    const cJSON *pr[8] = {0};
    int np = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(idx, "prompts")) if (np < 8) {
        pr[np] = p;
        feats[np++] = load_array(arr(p, "features"), NULL);
    }
    float *lg = malloc(sizeof(float) * 2 * g * V), *cl = malloc(sizeof(float) * 2 * g);
    int32_t tk[64];
    /* ---- single-request cases ---- */
    const cJSON *c;
    int ncase = 0;
    double worst = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(idx, "cases")) {
        if (strcmp(cJSON_GetObjectItem(c, "mode")->valuestring, mode)) continue;
        const char *pn = cJSON_GetObjectItem(c, "prompt")->valuestring;
        int pi = atoi(pn + 1), P = geti(c, "P"), x0 = geti(c, "anchor"), slot = 0, zero = 0;
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        CHECK(dsv4_dspark_reset_slot(r.d, 0, &e) == 0);
        const float *fs = feats[pi];
        if (context(&r, 1, &slot, &zero, &P, &fs)) continue;
        int32_t sl = 0, an = x0, ps = P;
        int rc = dsv4_dspark_draft(r.d, 1, &sl, &an, &ps, tk, lg, cl, &e);
        CHECK_MSG(rc == 0, "%s: draft: %s", name, e.msg);
        if (rc) continue;
        float *want = load_array(arr(c, "logits"), NULL), *wcl = load_array(arr(c, "conf_logit"), NULL);
        double md = maxdiff(lg, want, (size_t)g * V);
        worst = fmax(worst, md);
        CHECK_MSG(md <= tol, "%s: max |dlogit| %g > %g", name, md, tol);
        double margin = cJSON_GetObjectItem(c, "min_top2_margin")->valuedouble;
        const cJSON *t;
        int i = 0, bad = 0;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(c, "tokens")) bad += tk[i++] != t->valueint;
        if (margin > 2 * tol) CHECK_MSG(bad == 0, "%s: %d draft tokens differ", name, bad);
        for (i = 0; i < g; i++)
            CHECK_MSG(fabs(cl[i] - wcl[i]) <= tol * fmax(1.0, fabs(wcl[i])), "%s: conf_logit[%d] %g vs %g", name, i,
                      cl[i], wcl[i]);
        if (ncase == 0) sampled_case(&r, sl, an, ps, tk, lg, g, V);
        free(want);
        free(wcl);
        ncase++;
    }
    CHECK_MSG(ncase >= 4, "%s: only %d cases", mode, ncase);
    printf("dspark %-3s %d cases: max |dlogit| %.2e (tolerance %.0e)\n", mode, ncase, worst, tol);
    /* ---- batched draft: requests in slots 0 and 1, context written in one call ---- */
    const cJSON *bt = cJSON_GetObjectItem(idx, "batch");
    {
        int slots[2] = {0, 1}, pos0[2] = {0, 0}, len[2];
        int32_t sl[2] = {0, 1}, an[2], ps[2];
        const float *fs[2];
        int nr = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(bt, "requests")) if (nr < 2) {
            int pi = atoi(cJSON_GetObjectItem(c, "prompt")->valuestring + 1);
            len[nr] = ps[nr] = geti(c, "P");
            an[nr] = geti(c, "anchor");
            fs[nr] = feats[pi];
            nr++;
        }
        CHECK(dsv4_dspark_reset_slot(r.d, 0, &e) == 0 && dsv4_dspark_reset_slot(r.d, 1, &e) == 0);
        if (nr == 2 && !context(&r, 2, slots, pos0, len, fs)) {
            int rc = dsv4_dspark_draft(r.d, 2, sl, an, ps, tk, lg, NULL, &e);
            CHECK_MSG(rc == 0, "batch draft: %s", e.msg);
            float *want = load_array(arr(cJSON_GetObjectItem(bt, mode), "logits"), NULL);
            double md = maxdiff(lg, want, (size_t)2 * g * V);
            CHECK_MSG(md <= tol, "batch %s: max |dlogit| %g", mode, md);
            printf("dspark %-3s batch of 2: max |dlogit| %.2e\n", mode, md);
            free(want);
        }
    }
    /* ---- speculative trace: only accepted rows reach the ring ---- */
    const cJSON *tr = cJSON_GetObjectItem(idx, "trace");
    {
        int pi = atoi(cJSON_GetObjectItem(tr, "prompt")->valuestring + 1);
        int T0 = cJSON_GetArraySize(cJSON_GetObjectItem(pr[pi], "input_ids")), slot = 0, zero = 0;
        const float *fs = feats[pi];
        CHECK(dsv4_dspark_reset_slot(r.d, 0, &e) == 0);
        context(&r, 1, &slot, &zero, &T0, &fs);
        const cJSON *s;
        int step = 0;
        double tw = 0;
        cJSON_ArrayForEach(s, cJSON_GetObjectItem(tr, mode)) {
            int32_t sl = 0, an = geti(s, "anchor"), ps = geti(s, "P");
            int a = geti(s, "accepted");
            int rc = dsv4_dspark_draft(r.d, 1, &sl, &an, &ps, tk, lg, NULL, &e);
            CHECK_MSG(rc == 0, "trace step %d: %s", step, e.msg);
            float *want = load_array(arr(s, "logits"), NULL), *vf = load_array(arr(s, "verify_features"), NULL);
            double md = maxdiff(lg, want, (size_t)g * V);
            tw = fmax(tw, md);
            CHECK_MSG(md <= tol, "trace %s step %d: max |dlogit| %g", mode, step, md);
            int n = a + 1, p0 = ps;
            const float *vfs = vf;
            context(&r, 1, &slot, &p0, &n, &vfs); /* rows P..P+a only (§4.6) */
            free(want);
            free(vf);
            step++;
        }
        CHECK(step >= 4);
        printf("dspark %-3s trace of %d steps: max |dlogit| %.2e\n", mode, step, tw);
    }
    /* ---- end to end: our target's features, then our drafter (HF numerics only: the fixture's
     * features come from transformers in fp32) ---- */
    if (!strcmp(mode, "hf")) {
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(idx, "cases")) {
            if (strcmp(cJSON_GetObjectItem(c, "mode")->valuestring, mode) || geti(c, "P") < 2) continue;
            int pi = atoi(cJSON_GetObjectItem(c, "prompt")->valuestring + 1);
            int T = cJSON_GetArraySize(cJSON_GetObjectItem(pr[pi], "input_ids")), P = geti(c, "P"), slot = 0, zero = 0;
            int32_t ids[256];
            const cJSON *it;
            int k = 0;
            cJSON_ArrayForEach(it, cJSON_GetObjectItem(pr[pi], "input_ids")) ids[k++] = it->valueint;
            float *cf = malloc(sizeof(float) * (size_t)T * F);
            if (!c_features(&r, ids, T, cf)) {
                /* tap points (C2): output of layers dspark_target_layer_ids, hc-mean */
                double fmd = maxdiff(cf, feats[pi], (size_t)T * F), fmx = 0;
                for (size_t i = 0; i < (size_t)T * F; i++) fmx = fmax(fmx, fabs(feats[pi][i]));
                CHECK_MSG(fmd <= 1e-5 * fmx, "C target features vs fixture: max diff %g (scale %g)", fmd, fmx);
                const float *cfs = cf;
                CHECK(dsv4_dspark_reset_slot(r.d, 0, &e) == 0);
                context(&r, 1, &slot, &zero, &P, &cfs);
                int32_t sl = 0, an = geti(c, "anchor"), ps = P;
                int rc = dsv4_dspark_draft(r.d, 1, &sl, &an, &ps, tk, lg, NULL, &e);
                CHECK_MSG(rc == 0, "end to end draft: %s", e.msg);
                float *want = load_array(arr(c, "logits"), NULL);
                double md = maxdiff(lg, want, (size_t)g * V);
                CHECK_MSG(md <= tol, "end to end %s: max |dlogit| %g", cJSON_GetObjectItem(c, "name")->valuestring, md);
                printf("dspark end to end (C target features, %s): features %.1e of %.0f, max |dlogit| %.2e\n",
                       cJSON_GetObjectItem(c, "name")->valuestring, fmd, fmx, md);
                free(want);
            }
            free(cf);
            break;
        }
    }
    for (int i = 0; i < np; i++) free(feats[i]);
    free(lg);
    free(cl);
    close_drafter(&r);
}

/* Errors: bad requests are refused with a message, not a crash. */
static void test_errors(void) {
    drun r;
    if (open_drafter(DSV4_NUMERICS_HF, &r)) return;
    dsv4_err e = {0};
    int32_t tk[16], sl[2] = {0, 0}, an[2] = {5, 6}, ps[2] = {3, 4};
    CHECK(dsv4_dspark_draft(r.d, 2, sl, an, ps, tk, NULL, NULL, &e) == DSV4_EINVAL);
    CHECK_CONTAINS(e.msg, "share slot");
    int32_t bad_slot = 7;
    CHECK(dsv4_dspark_draft(r.d, 1, &bad_slot, an, ps, tk, NULL, NULL, &e) == DSV4_EINVAL);
    int32_t p0 = 0;
    CHECK(dsv4_dspark_draft(r.d, 1, sl, an, &p0, tk, NULL, NULL, &e) == DSV4_EINVAL);
    CHECK_CONTAINS(e.msg, "no context");
    int32_t tok = r.cfg.vocab_size;
    CHECK(dsv4_dspark_draft(r.d, 1, sl, &tok, ps, tk, NULL, NULL, &e) == DSV4_EINVAL);
    CHECK(dsv4_dspark_reset_slot(r.d, 2, &e) == DSV4_EINVAL);
    /* the stages are absolute layers n+s, top-k routed (DSPARK.md §2.1 pitfall) */
    for (int s = 0; s < r.d->n_stages; s++) {
        CHECK_EQ_INT(r.d->stages[s].w.layer_id, r.cfg.num_hidden_layers + s);
        CHECK(!r.d->stages[s].w.hash);
    }
    CHECK_EQ_INT(r.d->n_stages, 3);
    CHECK_EQ_INT(r.cfg.num_nextn_predict_layers, 1);
    close_drafter(&r);
}

int main(void) {
    {
        static const char *const need[] = {"tiny-dspark"};
        tm_find_models(models, sizeof models, need, (int)(sizeof need / sizeof need[0]));
    }
    snprintf(fixdir, sizeof fixdir, "%s/tests/fixtures/ref/dspark", DSV4_SOURCE_DIR);
    char path[700];
    snprintf(path, sizeof path, "%s/index.json", fixdir);
    char *js = tm_read_file(path, NULL);
    cJSON *idx = js ? cJSON_Parse(js) : NULL;
    CHECK_MSG(idx != NULL, "cannot read %s", path);
    if (idx) {
        run_mode(idx, "hf", DSV4_NUMERICS_HF);
        run_mode(idx, "ref", DSV4_NUMERICS_REFERENCE);
    }
    test_errors();
    cJSON_Delete(idx);
    free(js);
    return TEST_REPORT();
}
