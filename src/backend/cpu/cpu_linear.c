/*
 * Linears over stored weights (spec/MODEL.md §2.3-2.4, §3.4.8): each output
 * row of W is decoded to fp32 (FP8 × E8M0 128×128 block scale, FP4 × E8M0
 * per-32 scale, BF16, F32) and dotted with the input rows. In reference
 * numerics the input rows of FP8/FP4 linears are first quantised to FP8 in
 * blocks of 128 (W8A8) — the official fp8_gemm/fp4_gemm accumulate exactly
 * the products of those dequantised values in fp32.
 */
#include "backend/cpu/cpu_internal.h"

#include <stdlib.h>
#include <string.h>

static float scale_at(const dsv4_tview *s, int64_t i) {
    if (s->dtype == DSV4_DT_F8_E8M0) return dsv4_cpu_e8m0_to_f32(((const uint8_t *)s->data)[i]);
    return dsv4_cpu_load_f(s->data, s->dtype, i);
}

int dsv4_cpu_check_linear(const dsv4_linear *w, const char *what, dsv4_err *err) {
    const char *nm = w && w->w.name ? w->w.name : what;
    if (!w || !w->w.data)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: missing weight", what);
    int64_t o = w->out, i = w->in;
    switch (w->w.dtype) {
    case DSV4_DT_F8_E4M3:
        if (!w->scale.data)
            return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: FP8 weight without scale", nm);
        if (w->scale.ndim != 2 || w->scale.shape[0] != (o + 127) / 128 || w->scale.shape[1] != (i + 127) / 128)
            return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: FP8 scale shape does not match [%lld,%lld]/128",
                                nm, (long long)o, (long long)i);
        break;
    case DSV4_DT_I8:
    case DSV4_DT_U8:
        if (!w->scale.data || i % 32)
            return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: FP4 weight needs a scale and in %% 32 == 0", nm);
        if (w->scale.ndim != 2 || w->scale.shape[0] != o || w->scale.shape[1] != i / 32)
            return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: FP4 scale shape, expected [%lld,%lld]", nm,
                                (long long)o, (long long)(i / 32));
        break;
    case DSV4_DT_BF16:
    case DSV4_DT_F32:
    case DSV4_DT_F16:
        break;
    default:
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "cpu: %s: weight dtype %s not supported", nm,
                            dsv4_dtype_name(w->w.dtype));
    }
    return DSV4_OK;
}

void dsv4_cpu_decode_row(const dsv4_linear *w, int64_t r, float *out) {
    int64_t in = w->in;
    switch (w->w.dtype) {
    case DSV4_DT_F8_E4M3: {
        const uint8_t *q = (const uint8_t *)w->w.data + r * in;
        int64_t sc = w->scale.shape[1];
        for (int64_t k0 = 0; k0 < in; k0 += 128) { /* one scale per 128×128 block */
            float s = scale_at(&w->scale, (r / 128) * sc + k0 / 128);
            for (int64_t k = k0; k < in && k < k0 + 128; k++) out[k] = dsv4_cpu_e4m3_to_f32(q[k]) * s;
        }
        break;
    }
    case DSV4_DT_I8:
    case DSV4_DT_U8: {
        const uint8_t *p = (const uint8_t *)w->w.data + r * (in / 2);
        for (int64_t k0 = 0; k0 < in; k0 += 32) { /* one scale per 32 columns of the row */
            float s = scale_at(&w->scale, r * (in / 32) + k0 / 32);
            for (int64_t k = k0; k < k0 + 32; k++) {
                unsigned nib = (k & 1) ? p[k / 2] >> 4 : p[k / 2] & 15; /* low nibble = even column */
                out[k] = dsv4_cpu_e2m1_to_f32(nib) * s;
            }
        }
        break;
    }
    default:
        for (int64_t k = 0; k < in; k++) out[k] = dsv4_cpu_load_f(w->w.data, w->w.dtype, r * in + k);
    }
}

static int is_quantised(const dsv4_linear *w) {
    return w->w.dtype == DSV4_DT_F8_E4M3 || w->w.dtype == DSV4_DT_I8 || w->w.dtype == DSV4_DT_U8;
}

int dsv4_cpu_matmul(const float *x, int64_t T, const dsv4_linear *w, float *y, int act_quant,
                    dsv4_err *err) {
    int rc = dsv4_cpu_check_linear(w, "linear", err);
    if (rc) return rc;
    int64_t in = w->in, out = w->out;
    const float *xs = x;
    float *xq = NULL;
    if (act_quant && is_quantised(w)) {
        xq = malloc((size_t)(T * in) * sizeof(float));
        if (!xq) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: linear: out of memory");
        memcpy(xq, x, (size_t)(T * in) * sizeof(float));
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < in; k += 128)
                dsv4_cpu_fp8_roundtrip(xq + t * in + k, (int)(in - k < 128 ? in - k : 128));
        xs = xq;
    }
    int fail = 0;
#pragma omp parallel if (T * in * out > DSV4_CPU_PAR_MIN)
    {
        float *wr = malloc((size_t)in * sizeof(float));
        if (!wr) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(static)
        for (int64_t o = 0; o < out; o++) {
            if (!wr) continue;
            dsv4_cpu_decode_row(w, o, wr);
            for (int64_t t = 0; t < T; t++) {
                y[t * out + o] = dsv4_cpu_dot(xs + t * in, wr, in);
            }
        }
        free(wr);
    }
    free(xq);
    if (fail) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: linear: out of memory");
    return DSV4_OK;
}

int dsv4_cpu_linear(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, dsv4_buf *y,
                    dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(x, -1, w->in, "linear x", err);
    if (!rc) rc = dsv4_cpu_check_f32(y, x->rows, w->out, "linear y", err);
    if (rc) return dsv4_err_prefix(err, "%s: ", w->w.name ? w->w.name : "linear");
    return dsv4_cpu_matmul(x->data, x->rows, w, y->data, be->numerics == DSV4_NUMERICS_REFERENCE, err);
}

int dsv4_cpu_linear_grouped(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, int groups,
                            dsv4_buf *y, dsv4_err *err) {
    int rc = dsv4_cpu_check_linear(w, "linear_grouped", err);
    if (!rc && (groups <= 0 || w->out % groups))
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: linear_grouped: %d groups do not divide %lld rows",
                          groups, (long long)w->out);
    if (!rc) rc = dsv4_cpu_check_f32(x, -1, w->in * groups, "linear_grouped x", err);
    if (!rc) rc = dsv4_cpu_check_f32(y, x->rows, w->out, "linear_grouped y", err);
    if (rc) return rc;
    int64_t in_g = w->in, out = w->out, out_g = out / groups, T = x->rows;
    const float *xp = x->data;
    float *yp = y->data;
    int fail = 0;
#pragma omp parallel if (T * in_g * out > DSV4_CPU_PAR_MIN)
    {
        float *wr = malloc((size_t)in_g * sizeof(float));
        if (!wr) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(static)
        for (int64_t o = 0; o < out; o++) {
            if (!wr) continue;
            dsv4_cpu_decode_row(w, o, wr);
            int64_t g = o / out_g;
            for (int64_t t = 0; t < T; t++) {
                yp[t * out + o] = dsv4_cpu_dot(xp + t * in_g * groups + g * in_g, wr, in_g);
            }
        }
        free(wr);
    }
    if (fail) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: linear_grouped: out of memory");
    return DSV4_OK;
}
