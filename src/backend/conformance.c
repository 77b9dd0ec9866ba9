/*
 * Backend conformance: every op of the table run on identical random inputs
 * in a test backend and a reference backend (src/backend/conformance.h).
 * Inputs are made on the host from a small counter-based generator, so a run
 * is reproducible from its seed on any machine.
 */
#include "backend/conformance.h"
#include "backend/cpu/cpu_num.h"
#include "model/kvcodec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUFS 96

typedef struct conf {
    dsv4_backend *be[2]; /* 0 = test, 1 = ref */
    dsv4_buf bufs[2][MAX_BUFS];
    int nbuf;
    void *host[4 * MAX_BUFS]; /* host allocations to free */
    int nhost;
    uint64_t rng;
    double tol;
    FILE *rep;
    int fails;
    int skip;        /* the test backend reported the current op unsupported */
    int unsupported; /* ops the test backend reported unsupported */
    dsv4_err *err;
} conf;

static float rnd(conf *c) { /* uniform [-1, 1) */
    c->rng += 0x9E3779B97F4A7C15ull;
    uint64_t z = c->rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((z >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void *halloc(conf *c, size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (p && c->nhost < 4 * MAX_BUFS) {
        c->host[c->nhost++] = p;
    } else {
        free(p);
        p = NULL;
    }
    return p;
}

static float *hrand(conf *c, size_t n, float scale) {
    float *p = halloc(c, n * sizeof(float));
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = scale * rnd(c);
    return p;
}

/* A buffer in both backends with the same host contents (host may be NULL = zeros). */
static int pair(conf *c, dsv4_dtype dt, int64_t r, int64_t cols, const void *host, dsv4_buf **out) {
    if (c->nbuf == MAX_BUFS) return dsv4_err_set(c->err, DSV4_EINTERNAL, "conformance: out of buffers");
    int i = c->nbuf++;
    for (int s = 0; s < 2; s++) {
        int rc = c->be[s]->buf_alloc(c->be[s], dt, r, cols, &c->bufs[s][i], c->err);
        if (!rc && host) rc = c->be[s]->buf_write(c->be[s], &c->bufs[s][i], host, c->err);
        if (rc) return rc;
    }
    out[0] = &c->bufs[0][i];
    out[1] = &c->bufs[1][i];
    return DSV4_OK;
}

static int copy_ref_to_test(conf *c, dsv4_buf **b);

static void note_skipped(conf *c, const char *op) {
    if (c->rep) fprintf(c->rep, "%-22s unsupported by %s (reference output copied)\n", op, c->be[0]->name);
}

/* The test backend said DSV4_EUNSUPPORTED for this op: report it and give the
 * test side the reference's output, so the ops after it still get equal inputs. */
static int skipped(conf *c, const char *op, dsv4_buf **b) {
    note_skipped(c, op);
    return copy_ref_to_test(c, b);
}

/* Both sides' contents on the host: the test side's in *x, the reference's
 * in *y. The caller frees both, also on error. */
static int read_both(conf *c, dsv4_buf **b, void **x, void **y) {
    *x = malloc((size_t)(b[0]->rows * b[0]->cols) * dsv4_dtype_size(b[0]->dtype) + 1);
    *y = malloc((size_t)(b[1]->rows * b[1]->cols) * dsv4_dtype_size(b[1]->dtype) + 1);
    int rc = (*x && *y) ? DSV4_OK : dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    if (!rc) rc = c->be[0]->buf_read(c->be[0], b[0], *x, c->err);
    if (!rc) rc = c->be[1]->buf_read(c->be[1], b[1], *y, c->err);
    return rc;
}

/* Count and report a normalised error sqrt(num) / sqrt(den) against c->tol. */
static void judge_nerr(conf *c, const char *op, double num, double den, const char *note) {
    double e = sqrt(num) / fmax(sqrt(den), 1e-30);
    int bad = !(e <= c->tol);
    c->fails += bad;
    if (c->rep) fprintf(c->rep, "%-22s nerr %.3e %s%s\n", op, e, bad ? "FAIL" : "ok", note);
}

/* Normalised error of an F32 output; counts a failure above tol. */
static int check_f32(conf *c, const char *op, dsv4_buf **b) {
    if (c->skip) return skipped(c, op, b);
    size_t n = (size_t)(b[1]->rows * b[1]->cols);
    void *xv, *yv;
    int rc = read_both(c, b, &xv, &yv);
    float *x = xv, *y = yv;
    if (!rc) {
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            den += (double)y[i] * y[i];
        }
        judge_nerr(c, op, num, den, "");
    }
    free(x);
    free(y);
    return rc;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/*
 * Row comparison of an I32 output. as_sets: the order within a row does not
 * matter (both sorted first) and a fraction of differing rows up to tol
 * passes; else every row must be equal.
 */
static int check_i32_rows(conf *c, const char *op, dsv4_buf **b, int as_sets) {
    if (c->skip) return skipped(c, op, b);
    int64_t R = b[1]->rows, K = b[1]->cols;
    void *xv, *yv;
    int rc = read_both(c, b, &xv, &yv);
    int32_t *x = xv, *y = yv;
    if (!rc) {
        int64_t diff = 0;
        for (int64_t r = 0; r < R; r++) {
            if (as_sets) {
                qsort(x + r * K, (size_t)K, 4, cmp_i32);
                qsort(y + r * K, (size_t)K, 4, cmp_i32);
            }
            diff += memcmp(x + r * K, y + r * K, (size_t)K * 4) != 0;
        }
        double f = (double)diff / (double)(R ? R : 1);
        int bad = as_sets ? !(f <= c->tol) : diff > 0;
        c->fails += bad;
        if (c->rep && as_sets)
            fprintf(c->rep, "%-22s rows differing %.3f (%lld of %lld) %s\n", op, f, (long long)diff, (long long)R,
                    bad ? "FAIL" : "ok");
        else if (c->rep)
            fprintf(c->rep, "%-22s rows differing %lld of %lld (exact) %s\n", op, (long long)diff, (long long)R,
                    bad ? "FAIL" : "ok");
    }
    free(x);
    free(y);
    return rc;
}

static int check_sets(conf *c, const char *op, dsv4_buf **b) { return check_i32_rows(c, op, b, 1); }
static int check_exact(conf *c, const char *op, dsv4_buf **b) { return check_i32_rows(c, op, b, 0); }

/* Copy the reference side's buffer into the test side's (e.g. to feed both the same ids). */
static int copy_ref_to_test(conf *c, dsv4_buf **b) {
    size_t n = (size_t)(b[1]->rows * b[1]->cols) * dsv4_dtype_size(b[1]->dtype);
    void *h = malloc(n ? n : 1);
    if (!h) return dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    int rc = c->be[1]->buf_read(c->be[1], b[1], h, c->err);
    if (!rc) rc = c->be[0]->buf_write(c->be[0], b[0], h, c->err);
    free(h);
    return rc;
}

/* ---- coded KV rows (--kv-cache-dtype, src/model/kvcodec.h) ---- */

/* The buffer dtype and width of a row store of `dim` values in record kt. */
static dsv4_dtype kv_buf_dtype(dsv4_kv_dtype kt) {
    return kt == DSV4_KV_F32 ? DSV4_DT_F32 : kt == DSV4_KV_BF16 ? DSV4_DT_BF16 : DSV4_DT_U8;
}
static int64_t kv_buf_cols(dsv4_kv_dtype kt, int dim, int rope) {
    return kt == DSV4_KV_FP8_DS_MLA ? dsv4_kvcodec_row_bytes(kt, dim, rope) : dim;
}

/* n host rows x[n][dim] as records (halloc'd), or NULL (out of memory). */
static uint8_t *kv_encode_host(conf *c, dsv4_kv_dtype kt, int dim, int rope, const float *x, int64_t n) {
    int64_t rb = dsv4_kvcodec_row_bytes(kt, dim, rope);
    uint8_t *r = x && rb > 0 ? halloc(c, (size_t)(n * rb)) : NULL;
    for (int64_t i = 0; r && i < n; i++) dsv4_kvcodec_encode(kt, dim, rope, x + i * dim, r + i * rb);
    return r;
}

/* A row store of n rows in both backends holding the records of x (random floats). */
static int kv_pair(conf *c, dsv4_kv_dtype kt, int64_t n, int dim, int rope, const float *x, dsv4_buf **out) {
    const uint8_t *rec = kv_encode_host(c, kt, dim, rope, x, n);
    if (!rec) return dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    return pair(c, kv_buf_dtype(kt), n, kv_buf_cols(kt, dim, rope), rec, out);
}

/* Both sides' rows of a store of `dim`-value records read back and decoded to floats x (test), y (ref). */
static int kv_read_pair(conf *c, dsv4_kv_dtype kt, int dim, int rope, dsv4_buf **b, float **x, float **y) {
    int64_t rb = dsv4_kvcodec_row_bytes(kt, dim, rope), n0 = b[0]->rows, n1 = b[1]->rows;
    uint8_t *r0 = malloc((size_t)(n0 * rb) + 1), *r1 = malloc((size_t)(n1 * rb) + 1);
    *x = malloc((size_t)(n0 * dim) * sizeof(float) + 1);
    *y = malloc((size_t)(n1 * dim) * sizeof(float) + 1);
    int rc = (r0 && r1 && *x && *y) ? DSV4_OK : dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    if (!rc) rc = c->be[0]->buf_read(c->be[0], b[0], r0, c->err);
    if (!rc) rc = c->be[1]->buf_read(c->be[1], b[1], r1, c->err);
    for (int64_t i = 0; !rc && i < n0; i++) dsv4_kvcodec_decode(kt, dim, rope, r0 + i * rb, *x + i * dim);
    for (int64_t i = 0; !rc && i < n1; i++) dsv4_kvcodec_decode(kt, dim, rope, r1 + i * rb, *y + i * dim);
    free(r0);
    free(r1);
    return rc;
}

/* Normalised error of a coded row store (decoded on the host; unpaged both sides). */
static int check_kv(conf *c, const char *op, dsv4_kv_dtype kt, int dim, int rope, dsv4_buf **b) {
    if (kt == DSV4_KV_F32) return check_f32(c, op, b);
    if (c->skip) return skipped(c, op, b);
    float *x = NULL, *y = NULL;
    int rc = kv_read_pair(c, kt, dim, rope, b, &x, &y);
    if (!rc) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < b[1]->rows * dim; i++) {
            num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            den += (double)y[i] * y[i];
        }
        char note[32];
        snprintf(note, sizeof note, " (%s rows)", dsv4_kv_dtype_name(kt));
        judge_nerr(c, op, num, den, note);
    }
    free(x);
    free(y);
    return rc;
}

/* ---- weights ---- */

static dsv4_tview view(dsv4_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1) {
    dsv4_tview v = {0};
    v.dtype = dt;
    v.ndim = ndim;
    v.shape[0] = d0;
    v.shape[1] = d1;
    v.data = data;
    v.nbytes = (size_t)(d0 * (ndim > 1 ? d1 : 1)) * dsv4_dtype_size(dt);
    return v;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* Host linear: FP8 (random codes, no NaN), FP4 (random nibbles) or BF16; scales near 2^-7. */
static dsv4_linear host_linear(conf *c, dsv4_dtype dt, int64_t o, int64_t i) {
    dsv4_linear l = {.out = o, .in = i};
    if (dt == DSV4_DT_F8_E4M3) {
        uint8_t *q = halloc(c, (size_t)(o * i)), *s = halloc(c, (size_t)(((o + 127) / 128) * ((i + 127) / 128)));
        for (int64_t k = 0; q && k < o * i; k++) {
            uint8_t b = (uint8_t)((rnd(c) + 1) * 127.9f);
            q[k] = (b & 0x7F) == 0x7F ? 0x38 : (uint8_t)(b & 0xBF); /* exponents up to 7: |v| < 2 */
        }
        for (int64_t k = 0; s && k < ((o + 127) / 128) * ((i + 127) / 128); k++) s[k] = (uint8_t)(120 + k % 3);
        l.w = view(DSV4_DT_F8_E4M3, q, 2, o, i);
        l.scale = view(DSV4_DT_F8_E8M0, s, 2, (o + 127) / 128, (i + 127) / 128);
    } else if (dt == DSV4_DT_I8) {
        uint8_t *q = halloc(c, (size_t)(o * i / 2)), *s = halloc(c, (size_t)(o * i / 32));
        for (int64_t k = 0; q && k < o * i / 2; k++) q[k] = (uint8_t)((rnd(c) + 1) * 127.9f);
        for (int64_t k = 0; s && k < o * i / 32; k++) s[k] = (uint8_t)(121 + k % 3);
        l.w = view(DSV4_DT_I8, q, 2, o, i / 2);
        l.scale = view(DSV4_DT_F8_E8M0, s, 2, o, i / 32);
    } else {
        uint16_t *w = halloc(c, (size_t)(o * i) * 2);
        float sc = 1.0f / sqrtf((float)i);
        for (int64_t k = 0; w && k < o * i; k++) w[k] = to_bf16(sc * rnd(c));
        l.w = view(DSV4_DT_BF16, w, 2, o, i);
    }
    return l;
}

static int up_view(conf *c, int s, const dsv4_tview *h, dsv4_tview *d) {
    if (!h->data) {
        *d = *h;
        return DSV4_OK;
    }
    return c->be[s]->upload(c->be[s], h, d, c->err);
}

static int up_linear(conf *c, const dsv4_linear *h, dsv4_linear *d /* [2] */) {
    for (int s = 0; s < 2; s++) {
        int rc;
        if (c->be[s]->upload_linear) {
            rc = c->be[s]->upload_linear(c->be[s], h, &d[s], c->err);
        } else {
            d[s] = *h;
            rc = up_view(c, s, &h->w, &d[s].w);
            if (!rc) rc = up_view(c, s, &h->scale, &d[s].scale);
        }
        if (rc) return rc;
    }
    return DSV4_OK;
}

static int up_vec(conf *c, const float *data, int64_t n, dsv4_tview *d /* [2] */) {
    dsv4_tview h = view(DSV4_DT_F32, data, 1, n, 0);
    int rc = up_view(c, 0, &h, &d[0]);
    return rc ? rc : up_view(c, 1, &h, &d[1]);
}

/* DSV4_EUNSUPPORTED from the test backend is not an error: the op is
 * reported as unsupported and its outputs are copied from the reference
 * (c->skip, read by the checks). Returns rc, or 0 for that case. */
static int allow_unsupported(conf *c, int rc) {
    c->skip = rc == DSV4_EUNSUPPORTED;
    if (!c->skip) return rc;
    c->unsupported++;
    if (c->err) c->err->code = 0, c->err->msg[0] = 0;
    return DSV4_OK;
}

/* Run an op in both backends (call0 = test, call1 = reference). */
#define RUN(call0, call1)                                    \
    do {                                                     \
        int rc_ = allow_unsupported(c, (call0));             \
        if (!rc_) rc_ = (call1);                             \
        if (rc_) return dsv4_err_prefix(c->err, "%s: ", op); \
    } while (0)

/* ---- the ops ---- */

/* The test side (0) takes rmsnorm_rope where it exists; the reference (1) rmsnorm, then rope. */
static int norm_rope_side(conf *c, int side, dsv4_buf *x, const dsv4_tview *w, int hd, const dsv4_rope *r,
                          const dsv4_batch *b) {
    dsv4_backend *be = c->be[side];
    if (side == 0 && be->rmsnorm_rope) return be->rmsnorm_rope(be, x, w, hd, 1e-6f, r, b, c->err);
    int rc = be->rmsnorm(be, x, w, hd, 1e-6f, x, c->err);
    return rc ? rc : be->rope(be, x, hd, r, b, 0, c->err);
}

/* The test side (0) takes rmsnorm_rope_qat_fp8 where it exists; the reference (1) rmsnorm, rope, qat_fp8. */
static int norm_rope_qat_side(conf *c, int side, dsv4_buf *x, const dsv4_tview *w, int hd, const dsv4_rope *r,
                              const dsv4_batch *b) {
    dsv4_backend *be = c->be[side];
    const int nq = hd - r->rope_dim;
    if (side == 0 && be->rmsnorm_rope_qat_fp8) return be->rmsnorm_rope_qat_fp8(be, x, w, hd, 1e-6f, r, b, nq, 64, c->err);
    int rc = be->rmsnorm(be, x, w, hd, 1e-6f, x, c->err);
    if (!rc) rc = be->rope(be, x, hd, r, b, 0, c->err);
    return rc ? rc : be->qat_fp8(be, x, hd, nq, 64, c->err);
}

/* The test side (0) takes rope_qat_hadamard_fp4 where it exists; the reference (1) rope, then qat_hadamard_fp4. */
static int rope_had_side(conf *c, int side, dsv4_buf *x, int hd, const dsv4_rope *r, const dsv4_batch *b) {
    dsv4_backend *be = c->be[side];
    if (side == 0 && be->rope_qat_hadamard_fp4) return be->rope_qat_hadamard_fp4(be, x, hd, r, b, c->err);
    int rc = be->rope(be, x, hd, r, b, 0, c->err);
    return rc ? rc : be->qat_hadamard_fp4(be, x, hd, c->err);
}

static int conf_dense(conf *c, const dsv4_conf_shape *s, const dsv4_batch *b) {
    int T = s->rows, rc;
    const char *op = "dense";
    dsv4_buf *x[2], *y[2], *g[2], *u[2];
    /* rmsnorm (weighted, and per-head unweighted) */
    dsv4_tview nw[2];
    if ((rc = pair(c, DSV4_DT_F32, T, s->d, hrand(c, (size_t)T * s->d, 3), x)) ||
        (rc = pair(c, DSV4_DT_F32, T, s->d, NULL, y)) || (rc = up_vec(c, hrand(c, s->d, 1), s->d, nw)))
        return rc;
    op = "rmsnorm";
    RUN(c->be[0]->rmsnorm(c->be[0], x[0], &nw[0], s->d, 1e-6f, y[0], c->err),
        c->be[1]->rmsnorm(c->be[1], x[1], &nw[1], s->d, 1e-6f, y[1], c->err));
    if ((rc = check_f32(c, op, y))) return rc;
    op = "add";
    RUN(c->be[0]->add(c->be[0], x[0], y[0], y[0], c->err), c->be[1]->add(c->be[1], x[1], y[1], y[1], c->err));
    if ((rc = check_f32(c, op, y))) return rc;
    /* rope forward + inverse on q-shaped rows, and the two QAT round-trips */
    dsv4_rope r;
    if ((rc = dsv4_rope_init(&r, s->rope_dim, 160000, 16, 65536, 32, 1, c->err))) return rc;
    int64_t qw = (int64_t)s->n_heads * s->head_dim;
    if ((rc = pair(c, DSV4_DT_F32, T, qw, hrand(c, (size_t)(T * qw), 2), g))) return rc;
    op = "rope";
    RUN(c->be[0]->rope(c->be[0], g[0], s->head_dim, &r, b, 0, c->err), c->be[1]->rope(c->be[1], g[1], s->head_dim, &r, b, 0, c->err));
    if ((rc = check_f32(c, op, g))) return rc;
    op = "rope_inverse";
    RUN(c->be[0]->rope(c->be[0], g[0], s->head_dim, &r, b, 1, c->err), c->be[1]->rope(c->be[1], g[1], s->head_dim, &r, b, 1, c->err));
    if ((rc = check_f32(c, op, g))) return rc;
    op = "rmsnorm_per_head";
    RUN(c->be[0]->rmsnorm(c->be[0], g[0], NULL, s->head_dim, 1e-6f, g[0], c->err),
        c->be[1]->rmsnorm(c->be[1], g[1], NULL, s->head_dim, 1e-6f, g[1], c->err));
    if ((rc = check_f32(c, op, g))) return rc;
    /* rmsnorm_rope (where the test backend has it) against the reference's rmsnorm + rope:
     * unweighted over q-shaped heads, weighted over one KV-shaped head */
    {
        dsv4_buf *q2[2], *k2[2];
        dsv4_tview hw[2];
        if ((rc = pair(c, DSV4_DT_F32, T, qw, hrand(c, (size_t)(T * qw), 2), q2)) ||
            (rc = pair(c, DSV4_DT_F32, T, s->head_dim, hrand(c, (size_t)T * s->head_dim, 2), k2)) ||
            (rc = up_vec(c, hrand(c, s->head_dim, 1), s->head_dim, hw)))
            return rc;
        for (int k = 0; k < 2; k++) {
            dsv4_buf **xb = k ? k2 : q2;
            const dsv4_tview *w0 = k ? &hw[0] : NULL, *w1 = k ? &hw[1] : NULL;
            op = k ? "rmsnorm_rope_weighted" : "rmsnorm_rope";
            RUN(norm_rope_side(c, 0, xb[0], w0, s->head_dim, &r, b), norm_rope_side(c, 1, xb[1], w1, s->head_dim, &r, b));
            if ((rc = check_f32(c, op, xb))) return rc;
        }
        /* the KV head's norm + rope + FP8 QAT in one op (where the test backend has it) */
        if (s->head_dim - s->rope_dim > 0 && (s->head_dim - s->rope_dim) % 64 == 0) {
            if ((rc = pair(c, DSV4_DT_F32, T, s->head_dim, hrand(c, (size_t)T * s->head_dim, 3), k2))) return rc;
            op = "rmsnorm_rope_qat_fp8";
            RUN(norm_rope_qat_side(c, 0, k2[0], &hw[0], s->head_dim, &r, b),
                norm_rope_qat_side(c, 1, k2[1], &hw[1], s->head_dim, &r, b));
            if ((rc = check_f32(c, op, k2))) return rc;
        }
    }
    op = "qat_fp8";
    int nq = s->head_dim - s->rope_dim;
    RUN(c->be[0]->qat_fp8(c->be[0], g[0], s->head_dim, nq, 64, c->err), c->be[1]->qat_fp8(c->be[1], g[1], s->head_dim, nq, 64, c->err));
    if ((rc = check_f32(c, op, g))) return rc;
    if ((rc = pair(c, DSV4_DT_F32, T, (int64_t)s->index_heads * s->index_dim,
                   hrand(c, (size_t)T * s->index_heads * s->index_dim, 2), u)))
        return rc;
    op = "qat_hadamard_fp4";
    RUN(c->be[0]->qat_hadamard_fp4(c->be[0], u[0], s->index_dim, c->err), c->be[1]->qat_hadamard_fp4(c->be[1], u[1], s->index_dim, c->err));
    if ((rc = check_f32(c, op, u))) return rc;
    /* the indexer's queries: rope + Hadamard + FP4 in one op (where the test backend has it) */
    if (s->rope_dim > s->index_dim) return DSV4_OK;
    if ((rc = pair(c, DSV4_DT_F32, T, (int64_t)s->index_heads * s->index_dim,
                   hrand(c, (size_t)T * s->index_heads * s->index_dim, 2), u)))
        return rc;
    op = "rope_qat_hadamard_fp4";
    RUN(rope_had_side(c, 0, u[0], s->index_dim, &r, b), rope_had_side(c, 1, u[1], s->index_dim, &r, b));
    return check_f32(c, op, u);
}

/* linear_multi where it exists (else `linear` per weight) against the reference's `linear`:
 * seven weights on one x, as a block's projections (FP8 mostly, two BF16 ones that a backend may group,
 * and more FP8 weights than one grouped launch takes), each output checked. */
static int multi_side(conf *c, int side, const dsv4_buf *x, int n, const dsv4_linear *const *w, dsv4_buf *const *y) {
    dsv4_backend *be = c->be[side];
    if (side == 0 && be->linear_multi) return be->linear_multi(be, x, n, w, y, c->err);
    for (int i = 0; i < n; i++) {
        int rc = be->linear(be, x, w[i], y[i], c->err);
        if (rc) return rc;
    }
    return DSV4_OK;
}

static int conf_linear_multi(conf *c, const dsv4_conf_shape *s) {
    enum { NW = 7 };
    const int T = s->rows;
    const struct { dsv4_dtype dt; int64_t out; } ws[NW] = {
        {DSV4_DT_F8_E4M3, s->q_lora},      {DSV4_DT_F8_E4M3, s->head_dim}, {DSV4_DT_BF16, s->index_heads},
        {DSV4_DT_F8_E4M3, 2 * s->head_dim}, {DSV4_DT_F8_E4M3, s->head_dim}, {DSV4_DT_F8_E4M3, s->d},
        {DSV4_DT_BF16, 2 * s->head_dim}};
    dsv4_linear L[2][NW];
    const dsv4_linear *lp[2][NW];
    dsv4_buf *x[2], *y[NW][2], *yp[2][NW];
    int rc = pair(c, DSV4_DT_F32, T, s->d, hrand(c, (size_t)T * s->d, 2), x);
    for (int i = 0; !rc && i < NW; i++) {
        dsv4_linear h = host_linear(c, ws[i].dt, ws[i].out, s->d), d[2];
        if ((rc = up_linear(c, &h, d)) || (rc = pair(c, DSV4_DT_F32, T, ws[i].out, NULL, y[i]))) break;
        for (int side = 0; side < 2; side++) {
            L[side][i] = d[side];
            lp[side][i] = &L[side][i];
            yp[side][i] = y[i][side];
        }
    }
    if (rc) return rc;
    const char *op = "linear_multi";
    RUN(multi_side(c, 0, x[0], NW, lp[0], yp[0]), multi_side(c, 1, x[1], NW, lp[1], yp[1]));
    for (int i = 0; i < NW; i++) {
        char name[32];
        snprintf(name, sizeof name, "linear_multi[%d]", i);
        if ((rc = check_f32(c, name, y[i]))) return rc;
    }
    return DSV4_OK;
}

/* The test side (0) takes linear_swiglu_add where it exists; the reference (1) swiglu, linear, add. */
static int swiglu_add_side(conf *c, int side, const dsv4_buf *g, const dsv4_buf *u, const dsv4_linear *w, dsv4_buf *h,
                           dsv4_buf *t, dsv4_buf *y) {
    dsv4_backend *be = c->be[side];
    if (side == 0 && be->linear_swiglu_add) return be->linear_swiglu_add(be, g, u, 10.0f, w, y, c->err);
    int rc = be->swiglu(be, g, u, 10.0f, h, c->err);
    if (!rc) rc = be->linear(be, h, w, t, c->err);
    return rc ? rc : be->add(be, y, t, y, c->err);
}

static int conf_linear(conf *c, const dsv4_conf_shape *s, const dsv4_batch *b) {
    int T = s->rows, rc;
    static const struct { const char *name; dsv4_dtype dt; } kinds[3] = {
        {"linear_fp8", DSV4_DT_F8_E4M3}, {"linear_fp4", DSV4_DT_I8}, {"linear_bf16", DSV4_DT_BF16}};
    for (int k = 0; k < 3; k++) {
        const char *op = kinds[k].name;
        int64_t out = k == 1 ? s->moe_inter : s->q_lora;
        dsv4_linear h = host_linear(c, kinds[k].dt, out, s->d), L[2];
        dsv4_buf *x[2], *y[2];
        if ((rc = up_linear(c, &h, L)) || (rc = pair(c, DSV4_DT_F32, T, s->d, hrand(c, (size_t)T * s->d, 2), x)) ||
            (rc = pair(c, DSV4_DT_F32, T, out, NULL, y)))
            return rc;
        RUN(c->be[0]->linear(c->be[0], x[0], &L[0], y[0], c->err), c->be[1]->linear(c->be[1], x[1], &L[1], y[1], c->err));
        if ((rc = check_f32(c, op, y))) return rc;
    }
    {
        /* linear_swiglu_add (the shared expert's w2 into the routed output): y += w·swiglu(g, u), an FP8 weight
         * [d][moe_inter]; the test backend's fused op where it has one, the reference's three ops */
        const char *op = "linear_swiglu_add";
        int64_t in = s->moe_inter, out = s->d;
        dsv4_linear h = host_linear(c, DSV4_DT_F8_E4M3, out, in), L[2];
        dsv4_buf *g[2], *u[2], *y[2], *hb[2], *tb[2];
        if ((rc = up_linear(c, &h, L)) || (rc = pair(c, DSV4_DT_F32, T, in, hrand(c, (size_t)T * in, 4), g)) ||
            (rc = pair(c, DSV4_DT_F32, T, in, hrand(c, (size_t)T * in, 20), u)) ||
            (rc = pair(c, DSV4_DT_F32, T, out, hrand(c, (size_t)T * out, 1), y)) ||
            (rc = pair(c, DSV4_DT_F32, T, in, NULL, hb)) || (rc = pair(c, DSV4_DT_F32, T, out, NULL, tb)))
            return rc;
        RUN(swiglu_add_side(c, 0, g[0], u[0], &L[0], hb[0], tb[0], y[0]),
            swiglu_add_side(c, 1, g[1], u[1], &L[1], hb[1], tb[1], y[1]));
        if ((rc = check_f32(c, op, y))) return rc;
    }
    const char *op = "linear_grouped";
    int64_t in_g = (int64_t)s->n_heads * s->head_dim / s->o_groups, out = (int64_t)s->o_groups * s->o_lora;
    dsv4_linear h = host_linear(c, DSV4_DT_F8_E4M3, out, in_g), L[2];
    dsv4_buf *x[2], *y[2];
    if ((rc = up_linear(c, &h, L)) ||
        (rc = pair(c, DSV4_DT_F32, T, in_g * s->o_groups, hrand(c, (size_t)(T * in_g * s->o_groups), 1), x)) ||
        (rc = pair(c, DSV4_DT_F32, T, out, NULL, y)))
        return rc;
    RUN(c->be[0]->linear_grouped(c->be[0], x[0], &L[0], s->o_groups, y[0], c->err),
        c->be[1]->linear_grouped(c->be[1], x[1], &L[1], s->o_groups, y[1], c->err));
    (void)b;
    if ((rc = check_f32(c, op, y))) return rc;
    return conf_linear_multi(c, s);
}

/* The test side (0) takes hc_pre_norm where it exists; the reference (1) hc_pre, then rmsnorm. */
static int hc_pre_norm_side(conf *c, int side, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                            const dsv4_tview *sc, int n, const dsv4_tview *nw, dsv4_buf *y, dsv4_buf *post,
                            dsv4_buf *comb, int d) {
    dsv4_backend *be = c->be[side];
    if (side == 0 && be->hc_pre_norm)
        return be->hc_pre_norm(be, X, fn, base, sc, n, 20, 1e-6f, nw, 1e-6f, y, post, comb, c->err);
    int rc = be->hc_pre(be, X, fn, base, sc, n, 20, 1e-6f, y, post, comb, c->err);
    return rc ? rc : be->rmsnorm(be, y, nw, d, 1e-6f, y, c->err);
}

/* The test side (0) takes hc_post_pre_norm where it exists; the reference (1) hc_post, then hc_pre + rmsnorm. */
static int hc_post_pre_side(conf *c, int side, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *pin,
                            const dsv4_buf *cin, int n, dsv4_buf *Xo, const dsv4_tview *fn, const dsv4_tview *base,
                            const dsv4_tview *sc, const dsv4_tview *nw, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb,
                            int d) {
    dsv4_backend *be = c->be[side];
    if (side == 0 && be->hc_post_pre_norm)
        return be->hc_post_pre_norm(be, X, f, pin, cin, n, Xo, fn, base, sc, 20, 1e-6f, nw, 1e-6f, y, post, comb,
                                    c->err);
    int rc = be->hc_post(be, X, f, pin, cin, n, Xo, c->err);
    return rc ? rc : hc_pre_norm_side(c, side, Xo, fn, base, sc, n, nw, y, post, comb, d);
}

static int conf_hc(conf *c, const dsv4_conf_shape *s, const dsv4_batch *b) {
    int T = s->rows, n = s->hc, nm = n * (2 + n), rc;
    int64_t w = (int64_t)n * s->d;
    dsv4_tview fn[2], base[2], sc[2], hfn[2], hbase[2], hsc[2];
    float *scale = hrand(c, 3, 0.25f);
    for (int i = 0; scale && i < 3; i++) scale[i] += 1;
    if ((rc = up_vec(c, hrand(c, (size_t)(nm * w), 1.0f / sqrtf((float)w)), nm * w, fn)) ||
        (rc = up_vec(c, hrand(c, nm, 1), nm, base)) || (rc = up_vec(c, scale, 3, sc)) ||
        (rc = up_vec(c, hrand(c, (size_t)(n * w), 1.0f / sqrtf((float)w)), n * w, hfn)) ||
        (rc = up_vec(c, hrand(c, n, 1), n, hbase)) || (rc = up_vec(c, scale, 1, hsc)))
        return rc;
    /* the ops read fn as [rows][w]: shape is only checked by element count */
    dsv4_buf *X[2], *y[2], *post[2], *comb[2], *f[2], *X2[2];
    if ((rc = pair(c, DSV4_DT_F32, T, w, hrand(c, (size_t)(T * w), 2), X)) || (rc = pair(c, DSV4_DT_F32, T, s->d, NULL, y)) ||
        (rc = pair(c, DSV4_DT_F32, T, n, NULL, post)) || (rc = pair(c, DSV4_DT_F32, T, n * n, NULL, comb)) ||
        (rc = pair(c, DSV4_DT_F32, T, s->d, hrand(c, (size_t)T * s->d, 1), f)) || (rc = pair(c, DSV4_DT_F32, T, w, NULL, X2)))
        return rc;
    const char *op = "hc_pre";
    RUN(c->be[0]->hc_pre(c->be[0], X[0], &fn[0], &base[0], &sc[0], n, 20, 1e-6f, y[0], post[0], comb[0], c->err),
        c->be[1]->hc_pre(c->be[1], X[1], &fn[1], &base[1], &sc[1], n, 20, 1e-6f, y[1], post[1], comb[1], c->err));
    if ((rc = check_f32(c, "hc_pre y", y)) || (rc = check_f32(c, "hc_pre post", post)) ||
        (rc = check_f32(c, "hc_pre comb", comb)))
        return rc;
    /* hc_pre_norm (where the test backend has it) against the reference's hc_pre + rmsnorm */
    {
        dsv4_tview nw[2];
        dsv4_buf *y2[2], *p2[2], *c2[2];
        if ((rc = up_vec(c, hrand(c, s->d, 1), s->d, nw)) || (rc = pair(c, DSV4_DT_F32, T, s->d, NULL, y2)) ||
            (rc = pair(c, DSV4_DT_F32, T, n, NULL, p2)) || (rc = pair(c, DSV4_DT_F32, T, n * n, NULL, c2)))
            return rc;
        op = "hc_pre_norm";
        RUN(hc_pre_norm_side(c, 0, X[0], &fn[0], &base[0], &sc[0], n, &nw[0], y2[0], p2[0], c2[0], s->d),
            hc_pre_norm_side(c, 1, X[1], &fn[1], &base[1], &sc[1], n, &nw[1], y2[1], p2[1], c2[1], s->d));
        if ((rc = check_f32(c, "hc_pre_norm y", y2)) || (rc = check_f32(c, "hc_pre_norm post", p2)) ||
            (rc = check_f32(c, "hc_pre_norm comb", c2)))
            return rc;
        /* hc_post_pre_norm: hc_pre's post / comb (above) feed an hc_post of X and f, then the mixes
         * of its output with the same weights (the test backend's fused op where it has one) */
        dsv4_buf *Xo[2], *y3[2], *p3[2], *c3[2];
        if ((rc = pair(c, DSV4_DT_F32, T, w, NULL, Xo)) || (rc = pair(c, DSV4_DT_F32, T, s->d, NULL, y3)) ||
            (rc = pair(c, DSV4_DT_F32, T, n, NULL, p3)) || (rc = pair(c, DSV4_DT_F32, T, n * n, NULL, c3)))
            return rc;
        op = "hc_post_pre_norm";
        RUN(hc_post_pre_side(c, 0, X[0], f[0], post[0], comb[0], n, Xo[0], &fn[0], &base[0], &sc[0], &nw[0], y3[0],
                             p3[0], c3[0], s->d),
            hc_post_pre_side(c, 1, X[1], f[1], post[1], comb[1], n, Xo[1], &fn[1], &base[1], &sc[1], &nw[1], y3[1],
                             p3[1], c3[1], s->d));
        if ((rc = check_f32(c, "hc_post_pre_norm Xout", Xo)) || (rc = check_f32(c, "hc_post_pre_norm y", y3)) ||
            (rc = check_f32(c, "hc_post_pre_norm post", p3)) || (rc = check_f32(c, "hc_post_pre_norm comb", c3)))
            return rc;
    }
    op = "hc_post";
    RUN(c->be[0]->hc_post(c->be[0], X[0], f[0], post[0], comb[0], n, X2[0], c->err),
        c->be[1]->hc_post(c->be[1], X[1], f[1], post[1], comb[1], n, X2[1], c->err));
    if ((rc = check_f32(c, op, X2))) return rc;
    op = "hc_head";
    RUN(c->be[0]->hc_head(c->be[0], X2[0], &hfn[0], &hbase[0], &hsc[0], n, 1e-6f, y[0], c->err),
        c->be[1]->hc_head(c->be[1], X2[1], &hfn[1], &hbase[1], &hsc[1], n, 1e-6f, y[1], c->err));
    if ((rc = check_f32(c, op, y))) return rc;
    op = "swiglu";
    dsv4_buf *u[2];
    if ((rc = pair(c, DSV4_DT_F32, T, s->d, hrand(c, (size_t)T * s->d, 20), u))) return rc;
    RUN(c->be[0]->swiglu(c->be[0], f[0], u[0], 10.0f, u[0], c->err), c->be[1]->swiglu(c->be[1], f[1], u[1], 10.0f, u[1], c->err));
    (void)b;
    return check_f32(c, op, u);
}

/*
 * logit_top (issue 7, greedy ids on the device): rows of a vocabulary-wide
 * logit matrix (129280 at Flash shapes) with exact ties planted — coarse
 * rows where the maximum repeats, a maximum duplicated at both ends of a row,
 * -inf and a NaN — so the tie rule (lowest id) and the NaN rule are
 * exercised. ids must match exactly (k = 1, the engine's greedy path, and
 * k = 20, top logprobs); the log-softmax values by normalised error.
 */
static int conf_logit_top(conf *c, const dsv4_conf_shape *s) {
    const char *op = "logit_top";
    if (!c->be[0]->logit_top || !c->be[1]->logit_top) {
        if (c->rep) fprintf(c->rep, "%-22s unsupported by %s\n", op, c->be[c->be[0]->logit_top ? 1 : 0]->name);
        c->unsupported++;
        return DSV4_OK;
    }
    int T = s->rows, rc;
    int64_t V = s->d >= 4096 ? 129280 : 997;
    float *x = hrand(c, (size_t)T * V, 8);
    if (!x) return dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    for (int t = 0; t < T; t++) {
        float *r = x + (size_t)t * V;
        if (t % 3 == 1)
            for (int64_t v = 0; v < V; v++) r[v] = floorf(r[v]); /* 17 levels: the maximum repeats */
        if (t % 4 == 2) r[V - 1] = r[3] = 20.0f;                  /* a tie at both ends */
        if (t % 5 == 3) r[0] = r[V / 2] = -INFINITY;
        if (t % 7 == 4) r[t % V] = NAN;
        if (t == 5 && V > 1) r[0] = NAN; /* the host scan keeps a NaN at id 0 */
    }
    dsv4_buf *X[2], *id1[2], *idk[2], *lpk[2];
    int K = 20;
    if ((rc = pair(c, DSV4_DT_F32, T, V, x, X)) || (rc = pair(c, DSV4_DT_I32, T, 1, NULL, id1)) ||
        (rc = pair(c, DSV4_DT_I32, T, K, NULL, idk)) || (rc = pair(c, DSV4_DT_F32, T, K, NULL, lpk)))
        return rc;
    RUN(c->be[0]->logit_top(c->be[0], X[0], id1[0], NULL, c->err),
        c->be[1]->logit_top(c->be[1], X[1], id1[1], NULL, c->err));
    if ((rc = check_exact(c, "logit_top argmax", id1))) return rc;
    op = "logit_top k=20";
    /* lp with a NaN in the row is NaN on both sides: compare the finite rows' lp only */
    for (int t = 0; t < T; t++)
        if (t % 7 == 4 || t == 5) x[(size_t)t * V + (t % 7 == 4 ? t % V : 0)] = -1.0f;
    if ((rc = c->be[0]->buf_write(c->be[0], X[0], x, c->err)) || (rc = c->be[1]->buf_write(c->be[1], X[1], x, c->err)))
        return rc;
    RUN(c->be[0]->logit_top(c->be[0], X[0], idk[0], lpk[0], c->err),
        c->be[1]->logit_top(c->be[1], X[1], idk[1], lpk[1], c->err));
    if ((rc = check_exact(c, "logit_top k=20 ids", idk))) return rc;
    return check_f32(c, "logit_top k=20 logprob", lpk);
}

/* ---- attention state: compressors (optionally paged), indexer, attention ---- */

/*
 * One compressor's state in both backends. The reference is unpaged; with
 * s->paged the test side's emitted rows live in shuffled pages of page_rows
 * rows (DSV4_CMP_ROW), spare pages hold NaN (a kernel reading a row it must
 * not read poisons its output) and pages past the last row a slot can see
 * are unmapped (-1).
 */
typedef struct cmp_pair {
    dsv4_cmp_state st[2];
    dsv4_buf *rows[2], *kv[2], *sc[2];
    int32_t *bt; /* host block table (paged) */
    int64_t max_rows;
    dsv4_kv_dtype kt; /* record of the emitted rows (kvcodec.h) */
    int rope;         /* its rope dims (fp8_ds_mla) */
} cmp_pair;

/* A buffer in one backend only (the other side's slot stays empty). */
static int single(conf *c, int side, dsv4_dtype dt, int64_t r, int64_t cols, const void *host, dsv4_buf **out) {
    if (c->nbuf == MAX_BUFS) return dsv4_err_set(c->err, DSV4_EINTERNAL, "conformance: out of buffers");
    dsv4_buf *b = &c->bufs[side][c->nbuf++];
    int rc = c->be[side]->buf_alloc(c->be[side], dt, r, cols, b, c->err);
    if (!rc && host) rc = c->be[side]->buf_write(c->be[side], b, host, c->err);
    *out = b;
    return rc;
}

/* Unpaged row index of paged row r, or -1 (spare / unmapped). */
static int64_t unpage_of(const cmp_pair *cp, int64_t slot, int64_t w) {
    const dsv4_cmp_state *t = &cp->st[0];
    if (w / t->page_rows >= t->max_pages || cp->bt[slot * t->max_pages + w / t->page_rows] < 0) return -1;
    return (int64_t)cp->bt[slot * t->max_pages + w / t->page_rows] * t->page_rows + w % t->page_rows;
}

/* Copy unpaged rows [n_slots][max_rows] of rb bytes to where the test side's
 * block table puts them (rows of unmapped pages are dropped, spare rows untouched). */
static void page_rows(const cmp_pair *cp, int64_t rb, const void *unpaged, void *paged) {
    for (int sl = 0; sl < cp->st[0].n_slots; sl++)
        for (int64_t w = 0; w < cp->max_rows; w++) {
            int64_t r = unpage_of(cp, sl, w);
            if (r >= 0)
                memcpy((char *)paged + r * rb, (const char *)unpaged + (sl * cp->max_rows + w) * rb, (size_t)rb);
        }
}

static int make_cmp(conf *c, int ratio, int overlap, int D, int slots, const int64_t *nvis_max, int paged,
                    dsv4_kv_dtype kt, int rope, int hfp4, cmp_pair *cp) {
    int64_t maxr = 1;
    for (int sl = 0; sl < slots; sl++) maxr = nvis_max[sl] + 1 > maxr ? nvis_max[sl] + 1 : maxr;
    int cap = ratio * (1 + overlap) + 4, cw = D * (1 + overlap), rc;
    float *rows = hrand(c, (size_t)(slots * maxr * D), 1);
    if (!rows) return dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    for (int64_t i = 0; hfp4 && i < slots * maxr; i++) { /* index keys as the reference stores them (§3.4.6) */
        dsv4_cpu_hadamard(rows + i * D, D);
        for (int k = 0; k < D; k += 32) dsv4_cpu_fp4_roundtrip(rows + i * D + k, 32);
    }
    memset(cp, 0, sizeof *cp);
    cp->max_rows = maxr;
    cp->kt = kt;
    cp->rope = rope;
    const int64_t rb = dsv4_kvcodec_row_bytes(kt, D, rope); /* bytes per emitted row */
    const uint8_t *rec = kv_encode_host(c, kt, D, rope, rows, slots * maxr);
    if (!rec) return dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    if ((rc = pair(c, DSV4_DT_F32, (int64_t)slots * cap, cw, hrand(c, (size_t)slots * cap * cw, 1), cp->kv)) ||
        (rc = pair(c, DSV4_DT_F32, (int64_t)slots * cap, cw, hrand(c, (size_t)slots * cap * cw, 1), cp->sc)))
        return rc;
    for (int k = 0; k < 2; k++)
        cp->st[k] = (dsv4_cmp_state){.ratio = ratio, .overlap = overlap, .out_dim = D, .cap = cap, .n_slots = slots,
                                     .max_rows = maxr, .kv = *cp->kv[k], .score = *cp->sc[k]};
    if (!paged) {
        if ((rc = pair(c, kv_buf_dtype(kt), slots * maxr, kv_buf_cols(kt, D, rope), rec, cp->rows))) return rc;
        cp->st[0].rows = *cp->rows[0];
        cp->st[1].rows = *cp->rows[1];
        return DSV4_OK;
    }
    int pr = 4, mp = (int)((maxr + pr - 1) / pr), np = slots * mp + 3;
    int32_t *perm = halloc(c, (size_t)np * 4), *bt = halloc(c, (size_t)slots * mp * 4);
    uint8_t *prow = halloc(c, (size_t)(np * pr * rb));
    if (!perm || !bt || !prow) return dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    for (int i = 0; i < np; i++) perm[i] = i;
    for (int i = np - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)((rnd(c) + 1) * 0.5f * (float)(i + 1));
        j = j > i ? i : j;
        int32_t x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    memset(prow, 0xff, (size_t)(np * pr * rb)); /* NaN in every record format */
    int used = 0;
    for (int sl = 0; sl < slots; sl++)
        for (int pg = 0; pg < mp; pg++) bt[sl * mp + pg] = (int64_t)pg * pr <= nvis_max[sl] ? perm[used++] : -1;
    cp->bt = bt;
    cp->st[0].page_rows = pr;
    cp->st[0].max_pages = mp;
    page_rows(cp, rb, rec, prow);
    dsv4_buf *tb = NULL;
    if ((rc = single(c, 0, kv_buf_dtype(kt), (int64_t)np * pr, kv_buf_cols(kt, D, rope), prow, &cp->rows[0])) ||
        (rc = single(c, 1, kv_buf_dtype(kt), slots * maxr, kv_buf_cols(kt, D, rope), rec, &cp->rows[1])) ||
        (rc = single(c, 0, DSV4_DT_I32, slots, mp, bt, &tb)))
        return rc;
    cp->st[0].rows = *cp->rows[0];
    cp->st[1].rows = *cp->rows[1];
    cp->st[0].block_table = (const int32_t *)tb->data;
    return DSV4_OK;
}

/* Compare emitted rows; a paged test side is read back through its block table. */
static int check_rows(conf *c, const char *op, cmp_pair *cp) {
    const dsv4_cmp_state *t = &cp->st[0];
    if (!cp->bt) return check_kv(c, op, cp->kt, t->out_dim, cp->rope, cp->rows);
    int64_t D = t->out_dim;
    if (c->skip) { /* page the reference's records into the test side */
        void *rx, *ry;
        int rc = read_both(c, cp->rows, &rx, &ry);
        if (!rc) {
            note_skipped(c, op);
            page_rows(cp, dsv4_kvcodec_row_bytes(cp->kt, (int)D, cp->rope), ry, rx);
            rc = c->be[0]->buf_write(c->be[0], cp->rows[0], rx, c->err);
        }
        free(rx);
        free(ry);
        return rc;
    }
    float *x = NULL, *y = NULL;
    int rc = kv_read_pair(c, cp->kt, (int)D, cp->rope, cp->rows, &x, &y);
    if (!rc) {
        double num = 0, den = 0;
        for (int sl = 0; sl < t->n_slots; sl++)
            for (int64_t w = 0; w < cp->max_rows; w++) {
                int64_t r = unpage_of(cp, sl, w);
                const float *ref = y + (sl * cp->max_rows + w) * D, *got = r >= 0 ? x + r * D : ref;
                for (int64_t j = 0; j < D; j++) {
                    num += ((double)got[j] - ref[j]) * ((double)got[j] - ref[j]);
                    den += (double)ref[j] * ref[j];
                }
            }
        char note[48];
        snprintf(note, sizeof note, " (paged, %s rows)", dsv4_kv_dtype_name(cp->kt));
        judge_nerr(c, op, num, den, note);
    }
    free(x);
    free(y);
    return rc;
}

/* The test side (0) takes attention_rope where it exists; the reference (1) attention, then rope (inverse). */
static int att_rope_side(conf *c, int side, dsv4_buf *q, dsv4_buf *kv, dsv4_win_state *ws, dsv4_cmp_state *cs,
                         dsv4_buf *sel, const dsv4_tview *sinks, int H, const dsv4_batch *b, const dsv4_rope *r,
                         dsv4_buf *o) {
    dsv4_backend *be = c->be[side];
    if (side == 0 && be->attention_rope) return be->attention_rope(be, q, kv, ws, cs, sel, sinks, H, b, r, o, c->err);
    int rc = be->attention(be, q, kv, ws, cs, sel, sinks, H, b, o, c->err);
    return rc ? rc : be->rope(be, o, (int)kv->cols, r, b, 1, c->err);
}

/* Window ring + compressed rows + attention + compressor + indexer for the batch's requests. */
static int conf_attention(conf *c, const dsv4_conf_shape *s, const dsv4_batch *b) {
    int T = s->rows, hd = s->head_dim, H = s->n_heads, slots = b->n_seqs, rc;
    int ratio = s->ratio ? s->ratio : 4, ov = ratio == 4, cap = s->window + 4, idim = s->index_dim;
    int64_t nv_main[64], nv_idx[64];
    if (slots > 64) return dsv4_err_set(c->err, DSV4_EINVAL, "conformance: more than 64 requests");
    for (int sq = 0; sq < slots; sq++) { /* rows a slot can see (and emit) in this batch */
        int64_t last = b->seq_pos0[sq] + (b->cu_seqlens[sq + 1] - b->cu_seqlens[sq]) - 1;
        nv_main[sq] = (last + 1) / ratio;
        nv_idx[sq] = (last + 1) / 4;
    }
    cmp_pair cm, ci;
    dsv4_win_state ws[2];
    dsv4_buf *ring[2];
    /* window rows and main compressed rows in the shape's --kv-cache-dtype record; index keys F32, Hadamard + FP4
     * values as compress stores them */
    const dsv4_kv_dtype kt = (dsv4_kv_dtype)s->kv_dtype;
    const int krope = kt == DSV4_KV_FP8_DS_MLA ? s->rope_dim : 0;
    if ((rc = kv_pair(c, kt, (int64_t)slots * cap, hd, krope, hrand(c, (size_t)slots * cap * hd, 1), ring)) ||
        (rc = make_cmp(c, ratio, ov, hd, slots, nv_main, s->paged, kt, krope, 0, &cm)) ||
        (ov && (rc = make_cmp(c, 4, 1, idim, slots, nv_idx, s->paged, DSV4_KV_F32, 0, 1, &ci))))
        return rc;
    for (int k = 0; k < 2; k++) ws[k] = (dsv4_win_state){.window = s->window, .cap = cap, .n_slots = slots, .rows = *ring[k]};
    dsv4_rope r;
    if ((rc = dsv4_rope_init(&r, s->rope_dim, 160000, 16, 65536, 32, 1, c->err))) return rc;
    /* compressor (main, FP8 QAT) and the indexer's (Hadamard + FP4) */
    int64_t cw = (int64_t)hd * (1 + ov);
    dsv4_buf *K[2], *Z[2], *Ki[2], *Zi[2];
    dsv4_tview ape[2], nw[2], iape[2], inw[2];
    if ((rc = pair(c, DSV4_DT_F32, T, cw, hrand(c, (size_t)(T * cw), 1), K)) ||
        (rc = pair(c, DSV4_DT_F32, T, cw, hrand(c, (size_t)(T * cw), 2), Z)) ||
        (rc = up_vec(c, hrand(c, (size_t)(ratio * cw), 1), ratio * cw, ape)) || (rc = up_vec(c, hrand(c, hd, 1), hd, nw)))
        return rc;
    const char *op = "compress";
    RUN(c->be[0]->compress(c->be[0], &cm.st[0], K[0], Z[0], &ape[0], &nw[0], 1e-6f, &r, DSV4_QAT_FP8_NOPE, b, c->err),
        c->be[1]->compress(c->be[1], &cm.st[1], K[1], Z[1], &ape[1], &nw[1], 1e-6f, &r, DSV4_QAT_FP8_NOPE, b, c->err));
    if ((rc = check_rows(c, "compress rows", &cm)) || (rc = check_f32(c, "compress kv ring", cm.kv)) ||
        (rc = check_f32(c, "compress score ring", cm.sc)))
        return rc;
    dsv4_buf *sel[2] = {NULL, NULL};
    if (ov) {
        if ((rc = pair(c, DSV4_DT_F32, T, 2 * idim, hrand(c, (size_t)T * 2 * idim, 1), Ki)) ||
            (rc = pair(c, DSV4_DT_F32, T, 2 * idim, hrand(c, (size_t)T * 2 * idim, 2), Zi)) ||
            (rc = up_vec(c, hrand(c, (size_t)8 * idim, 1), 8 * idim, iape)) ||
            (rc = up_vec(c, hrand(c, idim, 1), idim, inw)))
            return rc;
        op = "compress_indexer";
        RUN(c->be[0]->compress(c->be[0], &ci.st[0], Ki[0], Zi[0], &iape[0], &inw[0], 1e-6f, &r, DSV4_QAT_HADAMARD_FP4, b, c->err),
            c->be[1]->compress(c->be[1], &ci.st[1], Ki[1], Zi[1], &iape[1], &inw[1], 1e-6f, &r, DSV4_QAT_HADAMARD_FP4, b, c->err));
        if ((rc = check_rows(c, "compress_indexer rows", &ci))) return rc;
        /* indexer selection */
        dsv4_buf *qi[2], *g[2];
        int64_t qiw = (int64_t)s->index_heads * idim;
        if ((rc = pair(c, DSV4_DT_F32, T, qiw, hrand(c, (size_t)(T * qiw), 1), qi)) ||
            (rc = pair(c, DSV4_DT_F32, T, s->index_heads, hrand(c, (size_t)T * s->index_heads, 1), g)) ||
            (rc = pair(c, DSV4_DT_I32, T, s->index_topk, NULL, sel)))
            return rc;
        float gs = 1.0f / sqrtf((float)qiw);
        op = "indexer_select";
        RUN(c->be[0]->indexer_select(c->be[0], qi[0], g[0], gs, &ci.st[0], s->index_topk, b, sel[0], c->err),
            c->be[1]->indexer_select(c->be[1], qi[1], g[1], gs, &ci.st[1], s->index_topk, b, sel[1], c->err));
        if ((rc = check_sets(c, op, sel))) return rc;
        /* again with the model's reference-numerics q (block.c: Hadamard + FP4 round trip, exact in bf16,
         * so a CUDA prefill chunk scores it on the tensor cores); the reference side's q fed to both */
        op = "indexer_select QAT q";
        if ((rc = c->be[1]->qat_hadamard_fp4(c->be[1], qi[1], idim, c->err)) || (rc = copy_ref_to_test(c, qi)))
            return dsv4_err_prefix(c->err, "%s: ", op);
        RUN(c->be[0]->indexer_select(c->be[0], qi[0], g[0], gs, &ci.st[0], s->index_topk, b, sel[0], c->err),
            c->be[1]->indexer_select(c->be[1], qi[1], g[1], gs, &ci.st[1], s->index_topk, b, sel[1], c->err));
        if ((rc = check_sets(c, op, sel)) || (rc = copy_ref_to_test(c, sel))) return rc;
    }
    /* attention: window only, all visible compressed rows, and the reference's selection */
    dsv4_buf *q[2], *kv[2], *o[2];
    dsv4_tview sinks[2];
    if ((rc = pair(c, DSV4_DT_F32, T, (int64_t)H * hd, hrand(c, (size_t)T * H * hd, 1), q)) ||
        (rc = pair(c, DSV4_DT_F32, T, hd, hrand(c, (size_t)T * hd, 1), kv)) ||
        (rc = pair(c, DSV4_DT_F32, T, (int64_t)H * hd, NULL, o)) || (rc = up_vec(c, hrand(c, H, 1), H, sinks)))
        return rc;
    for (int mode = 0; mode < 2 + ov; mode++) {
        static const char *names[3] = {"attention_window", "attention_all_rows", "attention_selected"};
        op = names[mode];
        RUN(c->be[0]->attention(c->be[0], q[0], kv[0], &ws[0], mode ? &cm.st[0] : NULL, mode == 2 ? sel[0] : NULL,
                                &sinks[0], H, b, o[0], c->err),
            c->be[1]->attention(c->be[1], q[1], kv[1], &ws[1], mode ? &cm.st[1] : NULL, mode == 2 ? sel[1] : NULL,
                                &sinks[1], H, b, o[1], c->err));
        if ((rc = check_f32(c, op, o))) return rc;
    }
    /* attention_rope (where the test backend has it) against the reference's attention + inverse rope,
     * over the widest candidate set */
    op = "attention_rope";
    RUN(att_rope_side(c, 0, q[0], kv[0], &ws[0], &cm.st[0], ov ? sel[0] : NULL, &sinks[0], H, b, &r, o[0]),
        att_rope_side(c, 1, q[1], kv[1], &ws[1], &cm.st[1], ov ? sel[1] : NULL, &sinks[1], H, b, &r, o[1]));
    if ((rc = check_f32(c, op, o))) return rc;
    op = "win_store";
    RUN(c->be[0]->win_store(c->be[0], &ws[0], kv[0], b, c->err), c->be[1]->win_store(c->be[1], &ws[1], kv[1], b, c->err));
    return check_kv(c, op, kt, hd, krope, ring);
}

static int conf_moe(conf *c, const dsv4_conf_shape *s, const dsv4_batch *b) {
    int T = s->rows, E = s->n_exp, k = s->top_k, rc;
    dsv4_linear gh = host_linear(c, DSV4_DT_BF16, E, s->d), gate[2];
    dsv4_tview bias[2];
    dsv4_buf *x[2], *ids[2], *w[2], *y[2];
    if ((rc = up_linear(c, &gh, gate)) || (rc = up_vec(c, hrand(c, E, 0.5f), E, bias)) ||
        (rc = pair(c, DSV4_DT_F32, T, s->d, hrand(c, (size_t)T * s->d, 2), x)) || (rc = pair(c, DSV4_DT_I32, T, k, NULL, ids)) ||
        (rc = pair(c, DSV4_DT_F32, T, k, NULL, w)) || (rc = pair(c, DSV4_DT_F32, T, s->d, NULL, y)))
        return rc;
    const char *op = "moe_route";
    RUN(c->be[0]->moe_route(c->be[0], x[0], &gate[0], &bias[0], NULL, k, 1.5f, b, ids[0], w[0], c->err),
        c->be[1]->moe_route(c->be[1], x[1], &gate[1], &bias[1], NULL, k, 1.5f, b, ids[1], w[1], c->err));
    if ((rc = check_sets(c, "moe_route ids", ids)) || (rc = copy_ref_to_test(c, ids)) || (rc = copy_ref_to_test(c, w)))
        return rc;
    dsv4_linear *w1 = calloc((size_t)E * 6, sizeof *w1);
    if (!w1) return dsv4_err_set(c->err, DSV4_ENOMEM, "conformance: out of memory");
    dsv4_linear *w3 = w1 + 2 * E, *w2 = w1 + 4 * E; /* [side][E] each */
    for (int e = 0; e < E && !rc; e++) {
        dsv4_linear h1 = host_linear(c, DSV4_DT_I8, s->moe_inter, s->d), h3 = host_linear(c, DSV4_DT_I8, s->moe_inter, s->d),
                    h2 = host_linear(c, DSV4_DT_I8, s->d, s->moe_inter), d[2];
        if (!(rc = up_linear(c, &h1, d))) w1[e] = d[0], w1[E + e] = d[1];
        if (!rc && !(rc = up_linear(c, &h3, d))) w3[e] = d[0], w3[E + e] = d[1];
        if (!rc && !(rc = up_linear(c, &h2, d))) w2[e] = d[0], w2[E + e] = d[1];
    }
    /* as a model load does (dsv4_block_dev_init): experts_ready before the first moe_experts */
    for (int side = 0; side < 2 && !rc; side++)
        if (c->be[side]->experts_ready &&
            (rc = c->be[side]->experts_ready(c->be[side], w1 + side * E, w3 + side * E, w2 + side * E, E, c->err)))
            dsv4_err_prefix(c->err, "experts_ready: ");
    /* both sides route with the reference's ids and weights, so only the experts are compared */
    op = "moe_experts";
    if (!rc) {
        rc = allow_unsupported(c,
                               c->be[0]->moe_experts(c->be[0], x[0], w1, w3, w2, E, ids[0], w[0], 10.0f, y[0], c->err));
        if (!rc) rc = c->be[1]->moe_experts(c->be[1], x[1], w1 + E, w3 + E, w2 + E, E, ids[1], w[1], 10.0f, y[1], c->err);
        if (rc) dsv4_err_prefix(c->err, "%s: ", op);
    }
    free(w1);
    return rc ? rc : check_f32(c, op, y);
}

void dsv4_conf_shape_tiny(dsv4_conf_shape *s) {
    *s = (dsv4_conf_shape){.rows = 24, .d = 256, .n_heads = 4, .head_dim = 128, .rope_dim = 64, .q_lora = 128,
                           .o_groups = 2, .o_lora = 64, .n_exp = 8, .top_k = 2, .moe_inter = 128, .index_heads = 8,
                           .index_dim = 128, .index_topk = 4, .window = 16, .hc = 4};
}

void dsv4_conf_shape_flash(dsv4_conf_shape *s, int rows) {
    *s = (dsv4_conf_shape){.rows = rows, .d = 4096, .n_heads = 64, .head_dim = 512, .rope_dim = 64, .q_lora = 1024,
                           .o_groups = 8, .o_lora = 1024, .n_exp = 16, .top_k = 6, .moe_inter = 2048,
                           .index_heads = 64, .index_dim = 128, .index_topk = 512, .window = 128, .hc = 4};
}

int dsv4_backend_conformance(dsv4_backend *test, dsv4_backend *ref, const dsv4_conf_shape *s, double tol,
                             unsigned seed, FILE *report, dsv4_err *err) {
    conf *c = calloc(1, sizeof *c);
    if (!c) return -dsv4_err_set(err, DSV4_ENOMEM, "conformance: out of memory");
    c->be[0] = test;
    c->be[1] = ref;
    c->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    c->tol = tol;
    c->rep = report;
    c->err = err;
    dsv4_numerics saved = test->numerics;
    test->numerics = ref->numerics;
    /* the batch: two requests splitting the rows (slot 0 continues at position 5, slot 1 at 37), or
     * rows/seg_rows requests of seg_rows rows; older positions come from the random state */
    int T = s->rows, ns = s->seg_rows > 0 ? T / s->seg_rows : 2;
    int32_t *a = calloc((size_t)T * 5 + 3 * (size_t)ns + 1, sizeof(int32_t));
    int rc = a ? DSV4_OK : dsv4_err_set(err, DSV4_ENOMEM, "conformance: out of memory");
    if (!rc && (T < 2 || ns > 64 || (s->seg_rows > 0 && T % s->seg_rows)))
        rc = dsv4_err_set(err, DSV4_EINVAL, "conformance: %d rows in segments of %d (at most 64 segments)", T,
                          s->seg_rows);
    dsv4_batch b = {0};
    if (!rc) {
        int32_t *cu = a + 5 * T, *ss = cu + ns + 1, *sp = ss + ns;
        for (int i = 0; i <= ns; i++) cu[i] = s->seg_rows > 0 ? i * s->seg_rows : i * (T / 2) + (i == 2) * (T % 2);
        for (int i = 0; i < ns; i++) {
            ss[i] = i;
            sp[i] = s->pos0 > 0 ? s->pos0 + 131 * i : 5 + 32 * i;
        }
        for (int sq = 0; sq < ns; sq++)
            for (int t = cu[sq]; t < cu[sq + 1]; t++) {
                a[t] = (int32_t)(t * 7 % 64);
                a[T + t] = sp[sq] + (t - cu[sq]);
                a[2 * T + t] = ss[sq];
                a[3 * T + t] = sq;
            }
        b = (dsv4_batch){.n_rows = T, .n_seqs = ns, .token = a, .pos = a + T, .slot = a + 2 * T, .seq_idx = a + 3 * T,
                         .cu_seqlens = cu, .seq_slot = ss, .seq_pos0 = sp};
        rc = test->batch_begin(test, &b, err);
        if (!rc) rc = ref->batch_begin(ref, &b, err);
    }
    if (!rc && !s->attn_only) rc = conf_dense(c, s, &b);
    if (!rc && !s->attn_only) rc = conf_linear(c, s, &b);
    if (!rc && !s->attn_only) rc = conf_hc(c, s, &b);
    if (!rc) rc = conf_attention(c, s, &b);
    if (!rc && !s->attn_only) rc = conf_moe(c, s, &b);
    if (!rc && !s->attn_only) rc = conf_logit_top(c, s);
    int fails = c->fails;
    if (report && !rc)
        fprintf(report, "%s vs %s: %d outputs above tol %.1e, %d ops unsupported by %s\n", test->name, ref->name,
                fails, tol, c->unsupported, test->name);
    for (int i = 0; i < c->nbuf; i++) {
        test->buf_free(test, &c->bufs[0][i]);
        ref->buf_free(ref, &c->bufs[1][i]);
    }
    for (int i = 0; i < c->nhost; i++) free(c->host[i]);
    free(a);
    free(c);
    test->numerics = saved;
    return rc ? -rc : fails;
}
