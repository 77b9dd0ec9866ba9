/*
 * dsv4-gpu-dummy-fill — the CUDA fill_dummy / fill_dummy_linear (--load-format
 * dummy; src/backend/cuda/cuda_fill.cu) against the CPU backend's:
 *  1. every fill kind gives the same bytes on both backends (odd and real
 *     sizes), since both evaluate backend/dummy_fill.h per element;
 *  2. a linear made by fill_dummy_linear on the GPU computes exactly what
 *     upload_linear of the CPU-filled checkpoint-layout tensors computes
 *     (FP8, BF16, and FP4, which the GPU fills straight into its repacked
 *     tile order: this checks that index map), and agrees with the CPU
 *     backend's linear to fp32 accumulation-order tolerance.
 * Needs a GPU: never part of ctest; tests/gpu/run_dummy_fill_h200.sh builds
 * and runs it. Exit status 0 = all equal, 1 = a mismatch, 2 = an error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

static int fails;

static size_t esize(dsv4_dtype d) {
    return d == DSV4_DT_F32 || d == DSV4_DT_I32 ? 4 : d == DSV4_DT_BF16 ? 2 : d == DSV4_DT_I64 ? 8 : 1;
}

static dsv4_tview view(const char *name, dsv4_dtype dt, int64_t r, int64_t c) {
    dsv4_tview v;
    memset(&v, 0, sizeof v);
    v.name = name;
    v.dtype = dt;
    v.ndim = 2;
    v.shape[0] = r;
    v.shape[1] = c;
    v.nbytes = (size_t)(r * c) * esize(dt);
    return v;
}

/* Bytes of a device tensor of the CUDA backend. */
static int download(dsv4_backend *cu, const dsv4_tview *v, void *host, dsv4_err *e) {
    dsv4_buf b = {(void *)v->data, DSV4_DT_U8, 1, (int64_t)v->nbytes};
    return cu->buf_read(cu, &b, host, e);
}

static void check_view(dsv4_backend *cpu, dsv4_backend *cu, const dsv4_fill *f, dsv4_tview v) {
    dsv4_err e = {0};
    dsv4_tview a = v, b = v;
    void *h = malloc(v.nbytes);
    if (!h || cpu->fill_dummy(cpu, f, &a, &e) || cu->fill_dummy(cu, f, &b, &e) || download(cu, &b, h, &e)) {
        printf("ERROR %s: %s\n", v.name, e.msg);
        exit(2);
    }
    int same = memcmp(a.data, h, v.nbytes) == 0;
    printf("%-28s [%lld, %lld] %s\n", v.name, (long long)v.shape[0], (long long)v.shape[1], same ? "identical" : "DIFFERENT");
    fails += !same;
    free(h);
}

static void check_linear(dsv4_backend *cpu, dsv4_backend *cu, const char *name, dsv4_dtype dt, int64_t o, int64_t in) {
    dsv4_err e = {0};
    int fp4 = dt == DSV4_DT_I8, q = dt != DSV4_DT_BF16;
    dsv4_linear l;
    memset(&l, 0, sizeof l);
    l.out = o;
    l.in = in;
    l.w = view(name, dt, o, fp4 ? in / 2 : in);
    if (q) l.scale = view("scale", DSV4_DT_F8_E8M0, fp4 ? o : o / 128, fp4 ? in / 32 : in / 128);
    dsv4_fill wf = {fp4 ? DSV4_FILL_BYTES : q ? DSV4_FILL_E4M3 : DSV4_FILL_UNIFORM, 11, 0, 0.05, 0, 0x38, 0, 0, 0};
    dsv4_fill sf = {DSV4_FILL_E8M0, 12, 0, 0, 118, 121, 0, 0, 0};
    dsv4_linear host = l, viacpu, filled = l;
    if (cpu->fill_dummy(cpu, &wf, &host.w, &e) || (q && cpu->fill_dummy(cpu, &sf, &host.scale, &e)) ||
        cu->upload_linear(cu, &host, &viacpu, &e) || cu->fill_dummy_linear(cu, &wf, q ? &sf : NULL, &filled, &e)) {
        printf("ERROR %s: %s\n", name, e.msg);
        exit(2);
    }
    enum { T = 5 };
    float *x = malloc(sizeof(float) * T * in), *y[3];
    for (int64_t k = 0; k < T * in; k++) x[k] = (float)sin(0.37 * (double)k);
    dsv4_buf xc = {x, DSV4_DT_F32, T, in}, yc, xg, y1, y2;
    int rc = cpu->buf_alloc(cpu, DSV4_DT_F32, T, o, &yc, &e) || cu->buf_alloc(cu, DSV4_DT_F32, T, in, &xg, &e) ||
             cu->buf_alloc(cu, DSV4_DT_F32, T, o, &y1, &e) || cu->buf_alloc(cu, DSV4_DT_F32, T, o, &y2, &e) ||
             cu->buf_write(cu, &xg, x, &e) || cpu->linear(cpu, &xc, &host, &yc, &e) ||
             cu->linear(cu, &xg, &viacpu, &y1, &e) || cu->linear(cu, &xg, &filled, &y2, &e) || cu->sync(cu, &e);
    for (int k = 0; k < 3; k++) y[k] = malloc(sizeof(float) * T * o);
    if (rc || cu->buf_read(cu, &y1, y[1], &e) || cu->buf_read(cu, &y2, y[2], &e)) {
        printf("ERROR %s: %s\n", name, e.msg);
        exit(2);
    }
    memcpy(y[0], yc.data, sizeof(float) * T * o);
    double num = 0, den = 0;
    for (int64_t k = 0; k < T * o; k++) num += fabs(y[2][k] - y[0][k]), den += fabs(y[0][k]);
    int same = memcmp(y[1], y[2], sizeof(float) * T * o) == 0, close = num <= 1e-3 * den;
    printf("%-28s [%lld, %lld] %s: filled vs uploaded %s, vs CPU rel err %.2e\n", name, (long long)o, (long long)in,
           dt == DSV4_DT_I8 ? "FP4" : dt == DSV4_DT_BF16 ? "BF16" : "FP8", same ? "identical" : "DIFFERENT",
           den > 0 ? num / den : 0.0);
    fails += !same || !close;
    for (int k = 0; k < 3; k++) free(y[k]);
    free(x);
    cpu->buf_free(cpu, &yc);
    cu->buf_free(cu, &xg);
    cu->buf_free(cu, &y1);
    cu->buf_free(cu, &y2);
}

int main(void) {
    dsv4_err e = {0};
    dsv4_backend *cpu = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
    dsv4_backend *cu = cpu ? dsv4_backend_cuda_create(DSV4_NUMERICS_REFERENCE, 0, &e) : NULL;
    if (!cu) {
        printf("ERROR: %s\n", e.msg);
        return 2;
    }
    dsv4_fill un = {DSV4_FILL_UNIFORM, 1, 1.0, 0.05, 0, 0, 0, 0, 0}, un2 = {DSV4_FILL_UNIFORM, 2, 0.0, 0.03, 0, 0, 0, 0, 0};
    dsv4_fill e4 = {DSV4_FILL_E4M3, 3, 0, 0, 0, 0x38, 0, 0, 0}, e8 = {DSV4_FILL_E8M0, 4, 0, 0, 110, 130, 0, 0, 0};
    dsv4_fill by = {DSV4_FILL_BYTES, 5, 0, 0, 0, 0, 0, 0, 0}, ix = {DSV4_FILL_INDEX, 6, 0, 0, 0, 256, 0, 0, 0};
    check_view(cpu, cu, &un, view("uniform F32 (norm-like)", DSV4_DT_F32, 3, 1001));
    check_view(cpu, cu, &un2, view("uniform BF16 (embed-like)", DSV4_DT_BF16, 129280, 4096));
    check_view(cpu, cu, &e4, view("E4M3", DSV4_DT_F8_E4M3, 257, 999));
    check_view(cpu, cu, &e8, view("E8M0", DSV4_DT_F8_E8M0, 32, 96));
    check_view(cpu, cu, &by, view("bytes (FP4 pairs)", DSV4_DT_I8, 2048, 2048));
    check_view(cpu, cu, &ix, view("index I64 (tid2eid)", DSV4_DT_I64, 129280, 6));
    check_linear(cpu, cu, "fp8 wq_a", DSV4_DT_F8_E4M3, 1024, 4096);
    check_linear(cpu, cu, "fp8 small", DSV4_DT_F8_E4M3, 128, 256);
    check_linear(cpu, cu, "fp4 expert w1", DSV4_DT_I8, 2048, 4096);
    check_linear(cpu, cu, "fp4 expert w2", DSV4_DT_I8, 4096, 2048);
    check_linear(cpu, cu, "fp4 small", DSV4_DT_I8, 48, 384);
    check_linear(cpu, cu, "bf16 gate", DSV4_DT_BF16, 256, 4096);
    printf("%s (%d mismatches)\n", fails ? "FAIL" : "PASS", fails);
    cu->free(cu);
    cpu->free(cpu);
    return fails ? 1 : 0;
}
