/*
 * KV row codecs (src/model/kvcodec.h): the fp8_ds_mla record byte for byte
 * as spec/MODEL.md §4.3 defines it (expected bytes derived by hand from that
 * definition: E4M3FN codes, UE8M0 exponents 2^(b-127), BF16 rope dims), and
 * round trips: encoding is the reference FP8 QAT round-trip of the CPU
 * backend (qat_fp8, §3.4.2.3) on the nope dims and BF16 rounding on the rope
 * dims, so a row that already went through both decodes bit for bit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/formats.h"
#include "model/kvcodec.h"
#include "test.h"

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f);
}

/* Reference: the CPU backend's QAT round-trip on dims [0, nope) (blocks of 64), bf16 on the rest. */
static void reference(dsv4_backend *be, const float *x, int dim, int rope, float *y) {
    dsv4_buf b = {y, DSV4_DT_F32, 1, dim};
    memcpy(y, x, sizeof(float) * (size_t)dim);
    CHECK_EQ_INT(be->qat_fp8(be, &b, dim, dim - rope, 64, NULL), 0);
    for (int i = dim - rope; i < dim; i++) y[i] = dsv4_round_bf16(y[i]);
}

int main(void) {
    /* geometry */
    CHECK_EQ_INT((int)dsv4_kvcodec_row_bytes(DSV4_KV_FP8_DS_MLA, 512, 64), 584); /* §4.3 */
    CHECK_EQ_INT((int)dsv4_kvcodec_row_bytes(DSV4_KV_FP8_DS_MLA, 128, 64), 64 + 128 + 8);
    CHECK_EQ_INT((int)dsv4_kvcodec_row_bytes(DSV4_KV_BF16, 512, 64), 1024);
    CHECK_EQ_INT((int)dsv4_kvcodec_row_bytes(DSV4_KV_F32, 512, 64), 2048);
    CHECK_EQ_INT((int)dsv4_kvcodec_row_bytes(DSV4_KV_FP8_DS_MLA, 512, 600), -1);
    CHECK_EQ_INT(dsv4_kvcodec_rope_dim(DSV4_KV_FP8_DS_MLA, 512, 584), 64);
    CHECK_EQ_INT(dsv4_kvcodec_rope_dim(DSV4_KV_FP8_DS_MLA, 128, 200), 64);
    CHECK_EQ_INT(dsv4_kvcodec_rope_dim(DSV4_KV_FP8_DS_MLA, 512, 583), -1);
    CHECK_EQ_INT(dsv4_kvcodec_rope_dim(DSV4_KV_BF16, 512, 1024), 0); /* width in bytes */
    dsv4_kv_dtype t;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_kv_dtype_parse("auto", &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_F32);
    CHECK_EQ_INT(dsv4_kv_dtype_parse("fp8_ds_mla", &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_FP8_DS_MLA);
    CHECK_EQ_INT(dsv4_kv_dtype_parse("bf16", &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_BF16);
    CHECK_EQ_INT(dsv4_kv_dtype_parse("fp8", &t, &err), 0); /* vLLM's "fp8" for this model */
    CHECK_EQ_INT(t, DSV4_KV_FP8_DS_MLA);
    CHECK_EQ_INT(dsv4_kv_dtype_parse("bfloat16", &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_BF16);
    CHECK_EQ_INT(dsv4_kv_dtype_parse("fp8_e5m2", &t, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "fp8_ds_mla");
    /* "auto": the reference f32 rows on the CPU, vLLM's fp8_ds_mla default on the GPU */
    CHECK_EQ_INT(dsv4_kv_dtype_parse_for("auto", 1, &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_FP8_DS_MLA);
    CHECK_EQ_INT(dsv4_kv_dtype_parse_for(NULL, 1, &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_FP8_DS_MLA);
    CHECK_EQ_INT(dsv4_kv_dtype_parse_for("auto", 0, &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_F32);
    CHECK_EQ_INT(dsv4_kv_dtype_parse_for("f32", 1, &t, &err), 0);
    CHECK_EQ_INT(t, DSV4_KV_F32);
    CHECK_STR(dsv4_kv_dtype_name(DSV4_KV_FP8_DS_MLA), "fp8_ds_mla");

    /* byte layout of a 512-dim row (§4.3) */
    static float x[512], y[512], r[512];
    static uint8_t rec[584];
    memset(x, 0, sizeof x);
    x[0] = 56.0f;            /* block 0: amax 56 -> scale 2^ceil(log2(56/448)) = 2^-3; 56/s = 448 -> 0x7E */
    x[1] = -0.125f;          /* -1.0 at scale 2^-3 -> E4M3 sign|0111|000 = 0xB8 */
    x[64] = 3.0f;            /* block 1: amax 3 -> 2^ceil(log2(3/448)) = 2^-7 -> exponent byte 120; 3/2^-7 = 384 -> 0x7C */
    x[65] = 1.0f / 1024.0f;  /* 2^-10 / 2^-7 = 2^-3 -> normal, exp 4: 0|0100|000 = 0x20 */
    /* blocks 2..6 are zero: amax floored at 1e-4 -> 2^ceil(log2(1e-4/448)) = 2^-22 -> byte 105, codes 0 */
    x[448] = 1.0f;           /* rope dim 0: bf16 0x3F80, little-endian */
    x[511] = -2.5f;          /* rope dim 63: bf16 0xC020 */
    dsv4_kvcodec_encode(DSV4_KV_FP8_DS_MLA, 512, 64, x, rec);
    CHECK_EQ_INT(rec[0], 0x7E);
    CHECK_EQ_INT(rec[1], 0xB8);
    CHECK_EQ_INT(rec[2], 0x00);
    CHECK_EQ_INT(rec[64], 0x7C);
    CHECK_EQ_INT(rec[65], 0x20);
    CHECK_EQ_INT(rec[447], 0x00);
    CHECK_EQ_INT(rec[448], 0x80);
    CHECK_EQ_INT(rec[449], 0x3F);
    CHECK_EQ_INT(rec[574], 0x20);
    CHECK_EQ_INT(rec[575], 0xC0);
    CHECK_EQ_INT(rec[576], 127 - 3);
    CHECK_EQ_INT(rec[577], 127 - 7);
    for (int b = 2; b < 7; b++) CHECK_EQ_INT(rec[576 + b], 127 - 22);
    CHECK_EQ_INT(rec[583], 0); /* the pad byte */
    dsv4_kvcodec_decode(DSV4_KV_FP8_DS_MLA, 512, 64, rec, y);
    CHECK(y[0] == 56.0f && y[1] == -0.125f && y[64] == 3.0f && y[65] == 1.0f / 1024.0f && y[448] == 1.0f &&
          y[511] == -2.5f && y[2] == 0.0f);

    /* round trips against the reference QAT, random rows of several magnitudes */
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
    CHECK(be != NULL);
    unsigned seed = 7;
    int dims[2][2] = {{512, 64}, {128, 64}};
    int exact_q = 1, exact_requant = 1, exact_bf16 = 1, fp8_eq_ref = 1;
    for (int g = 0; g < 2 && be; g++) {
        int D = dims[g][0], R = dims[g][1];
        for (int it = 0; it < 50; it++) {
            float mag = ldexpf(1.0f, (it % 24) - 12);
            for (int i = 0; i < D; i++) x[i] = frand(&seed) * mag * (i % 64 == 5 ? 40.0f : 1.0f);
            if (it % 7 == 0) for (int i = 0; i < 64; i++) x[i] = 0; /* an all-zero block */
            /* fp8_ds_mla of a raw row == reference QAT + bf16 rope */
            reference(be, x, D, R, r);
            dsv4_kvcodec_encode(DSV4_KV_FP8_DS_MLA, D, R, x, rec);
            dsv4_kvcodec_decode(DSV4_KV_FP8_DS_MLA, D, R, rec, y);
            fp8_eq_ref &= !memcmp(y, r, sizeof(float) * (size_t)D);
            /* a row already in reference form comes back bit for bit (stored rows in reference numerics) */
            dsv4_kvcodec_encode(DSV4_KV_FP8_DS_MLA, D, R, r, rec);
            dsv4_kvcodec_decode(DSV4_KV_FP8_DS_MLA, D, R, rec, y);
            exact_requant &= !memcmp(y, r, sizeof(float) * (size_t)D);
            /* bf16 and f32 */
            static uint8_t rb[2048];
            dsv4_kvcodec_encode(DSV4_KV_BF16, D, R, x, rb);
            dsv4_kvcodec_decode(DSV4_KV_BF16, D, R, rb, y);
            for (int i = 0; i < D; i++) exact_bf16 &= y[i] == dsv4_round_bf16(x[i]);
            dsv4_kvcodec_encode(DSV4_KV_F32, D, R, x, rb);
            dsv4_kvcodec_decode(DSV4_KV_F32, D, R, rb, y);
            exact_q &= !memcmp(y, x, sizeof(float) * (size_t)D);
        }
    }
    CHECK(fp8_eq_ref);
    CHECK(exact_requant);
    CHECK(exact_bf16);
    CHECK(exact_q);
    if (be) be->free(be);
    return TEST_REPORT();
}
