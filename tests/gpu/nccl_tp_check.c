/*
 * The NCCL communicator (src/parallel/comm_nccl.c) on 2 GPUs of one host:
 * two threads, one per GPU, each with its own communicator handle, check
 * all_reduce_sum (F32 one row and 16 rows; BF16), all_gather, broadcast and
 * barrier against values computed here, and that both ranks hold
 * bit-identical sums; then print the time of a 4096-float all-reduce (a
 * measurement, not a check). Built and run by tests/gpu/run_nccl_h200x2.sh
 * (gcc + libcudart; NCCL is dlopen'ed from DSV4_NCCL_LIB).
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/comm.h"

static uint8_t g_id[DSV4_NCCL_ID_BYTES];
static int g_fail;
static float g_sum[2][16 * 4096];

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); __atomic_store_n(&g_fail, 1, __ATOMIC_SEQ_CST); } while (0)

static int be_sync(dsv4_backend *be, dsv4_err *err) {
    (void)be;
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : dsv4_err_set(err, DSV4_EBACKEND, "%s", cudaGetErrorString(e));
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* values below are exact in bf16 */
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void *rank_main(void *arg) {
    int r = (int)(intptr_t)arg;
    dsv4_err err = {0};
    if (cudaSetDevice(r) != cudaSuccess) {
        FAIL("rank %d: cudaSetDevice failed", r);
        return NULL;
    }
    dsv4_backend be;
    memset(&be, 0, sizeof be);
    be.name = "cuda-check";
    be.sync = be_sync;
    dsv4_comm *c = NULL;
    if (dsv4_comm_nccl_create(r, 2, g_id, &c, &err)) {
        FAIL("rank %d: %s", r, err.msg);
        return NULL;
    }
    /* F32, 16 rows x 4096 */
    size_t n = 16 * 4096;
    float *h = malloc(n * sizeof(float)), *d;
    for (size_t i = 0; i < n; i++) h[i] = (float)((i % 1000) * 0.001 + r * 0.37);
    cudaMalloc((void **)&d, n * sizeof(float));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    dsv4_buf b = {d, DSV4_DT_F32, 16, 4096};
    if (c->all_reduce_sum(c, &be, &b, &err)) FAIL("rank %d: all_reduce: %s", r, err.msg);
    cudaMemcpy(g_sum[r], d, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) {
        float want = (float)((i % 1000) * 0.001 + 0 * 0.37) + (float)((i % 1000) * 0.001 + 1 * 0.37);
        if (g_sum[r][i] != want) {
            FAIL("rank %d: F32 sum[%zu] = %.9g, want %.9g", r, i, g_sum[r][i], want);
            break;
        }
    }
    /* BF16 */
    uint16_t hb[4096], *db;
    for (int i = 0; i < 4096; i++) hb[i] = to_bf16((float)(i % 64 + r));
    cudaMalloc((void **)&db, sizeof hb);
    cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice);
    dsv4_buf bb = {db, DSV4_DT_BF16, 1, 4096};
    if (c->all_reduce_sum(c, &be, &bb, &err)) FAIL("rank %d: bf16 all_reduce: %s", r, err.msg);
    cudaMemcpy(hb, db, sizeof hb, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 4096; i++)
        if (from_bf16(hb[i]) != (float)(2 * (i % 64) + 1)) {
            FAIL("rank %d: BF16 sum[%d] = %g", r, i, from_bf16(hb[i]));
            break;
        }
    /* all_gather [3][5] -> [3][10] */
    float gi[15], go[30], *dgi, *dgo;
    for (int i = 0; i < 15; i++) gi[i] = (float)(100 * r + i);
    cudaMalloc((void **)&dgi, sizeof gi);
    cudaMalloc((void **)&dgo, sizeof go);
    cudaMemcpy(dgi, gi, sizeof gi, cudaMemcpyHostToDevice);
    dsv4_buf bi = {dgi, DSV4_DT_F32, 3, 5}, bo = {dgo, DSV4_DT_F32, 3, 10};
    if (c->all_gather(c, &be, &bi, &bo, &err)) FAIL("rank %d: all_gather: %s", r, err.msg);
    cudaMemcpy(go, dgo, sizeof go, cudaMemcpyDeviceToHost);
    for (int row = 0; row < 3; row++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 5; j++)
                if (go[row * 10 + k * 5 + j] != (float)(100 * k + row * 5 + j)) {
                    FAIL("rank %d: all_gather [%d][%d]", r, row, k * 5 + j);
                    row = 3, k = 2, j = 5;
                }
    /* broadcast from rank 1, barrier */
    char msg[32] = "";
    if (r == 1) snprintf(msg, sizeof msg, "hello from rank 1");
    if (c->broadcast(c, msg, sizeof msg, 1, &err)) FAIL("rank %d: broadcast: %s", r, err.msg);
    if (strcmp(msg, "hello from rank 1")) FAIL("rank %d: broadcast got '%s'", r, msg);
    if (c->barrier(c, &err)) FAIL("rank %d: barrier: %s", r, err.msg);
    /* timing: 4096 floats (one Flash row), 200 in a row */
    dsv4_buf row1 = {d, DSV4_DT_F32, 1, 4096};
    struct timespec t0, t1;
    for (int i = 0; i < 20; i++) c->all_reduce_sum(c, &be, &row1, &err);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 200; i++) c->all_reduce_sum(c, &be, &row1, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (r == 0)
        printf("all_reduce_sum 4096 F32 (sync + NCCL + wait): %.1f us per call\n",
               ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 200 / 1e3);
    cudaFree(d);
    cudaFree(db);
    cudaFree(dgi);
    cudaFree(dgo);
    free(h);
    c->free(c);
    return NULL;
}

int main(void) {
    dsv4_err err = {0};
    int ndev = 0;
    cudaGetDeviceCount(&ndev);
    if (ndev < 2) {
        fprintf(stderr, "need 2 GPUs, have %d\n", ndev);
        return 2;
    }
    if (dsv4_nccl_unique_id(g_id, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    pthread_t th[2];
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    if (!g_fail && memcmp(g_sum[0], g_sum[1], sizeof g_sum[0])) FAIL("ranks disagree on the F32 sum");
    printf(g_fail ? "NCCL TP CHECK FAILED\n" : "NCCL TP CHECK OK\n");
    return g_fail;
}
