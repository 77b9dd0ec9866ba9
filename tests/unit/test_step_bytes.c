/*
 * The step-bytes model behind `dsv4 perf`'s roofline column
 * (src/engine/step_bytes.h), on the tiny-flash checkpoint:
 *  - every weight byte the model assumes equals the checkpoint's own tensor
 *    sizes (target tensors, mtp.* excluded) — the dtype rules are right;
 *  - one decode step and one verify-shaped step equal a count by hand from
 *    config.json (d 256, 4 heads x 128, q_lora 128, o 2x64, 8 experts of 128
 *    choose 2, 1 shared, hash layers 0-1, ratios 0/4/128/4, indexer 64x128
 *    top-4, window 16, hc 4, vocab 512; FP8 dense, FP4 experts).
 */
#include <math.h>
#include <string.h>

#include "engine/step_bytes.h"
#include "model/safetensors.h"
#include "test.h"

int main(void) {
    const char *dir = "models/tiny-flash";
    dsv4_config cfg;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_config_load(dir, &cfg, &err), 0);
    dsv4_ckpt *ck = NULL;
    CHECK_EQ_INT(dsv4_ckpt_open(dir, &ck, &err), 0);
    if (!ck) return TEST_REPORT();
    double stored = 0;
    for (size_t i = 0; i < dsv4_ckpt_count(ck); i++) {
        const dsv4_tview *v = dsv4_ckpt_at(ck, i);
        if (strncmp(v->name, "mtp.", 4) != 0) stored += (double)v->nbytes;
    }
    dsv4_ckpt_free(ck);
    CHECK_NEAR(dsv4_step_bytes_weights_total(&cfg), stored, 0.0);

    /* By hand. Per layer, common to all four:
     *  wq_a 128x256 FP8 + 1x2 scales = 32770; q_norm 256; wq_b 512x128 + 4x1 = 65540;
     *  wkv 128x256 + 2 = 32770; kv_norm 256; wo_a 128x256 + 2 = 32770; wo_b 256x128 + 2 = 32770;
     *  sinks 4 F32 = 16                                       -> attention 197148
     *  attn_norm + ffn_norm 2 x 512 = 1024; hc_attn + hc_ffn 2 x (24x1024 + 24 + 3) x 4 = 196824;
     *  router 8x256 BF16 = 4096; shared expert 3 x 32770 = 98310 -> common 497402
     * ratio 4 adds the compressor (ape 4x256 F32 4096, wkv/wgate 256x256 BF16 2 x 131072, norm 256
     *  = 266496) and the indexer (wq_b 8192x128 + 64x1 = 1048640, weights_proj 64x256 BF16 32768,
     *  its compressor 266496 = 1347904); ratio 128 adds ape 128x128 F32 65536 + wkv/wgate 128x256
     *  BF16 2 x 65536 + norm 256 = 196864; non-hash layers 2-3 add the gate bias 8 F32 = 32.
     * layers: 497402 + 2111802 + 694298 + 2111834 = 5415336
     * top: norm 512 + hc_head 4x1024x4 + 16 + 4 + head 512x256 BF16 262144 = 279060
     * one expert: w1, w3 128x256 FP4 = 16384 + 128x8 scales = 17408 each, w2 256x128 the same
     *  = 52224. */
    const double dense = 5415336.0 + 279060.0, expert = 52224.0;
    dsv4_step_bytes b;
    /* decode: 1 request, 1 row, 100 positions before it (101 visible) */
    CHECK_EQ_INT(dsv4_step_bytes_compute(&cfg, 1, 1, 100, 4, &b, &err), 0);
    CHECK_NEAR(b.dense, dense, 0.0);
    CHECK_NEAR(b.expert_bytes, expert, 0.0);
    CHECK_NEAR(b.experts, 4 * 2 * expert, 1e-6); /* one row selects exactly k = 2 per layer */
    CHECK_NEAR(b.gathered, 512 + 2 * 16, 0.0);   /* embedding row BF16 + tid2eid row I64x2 in 2 layers */
    /* state, F32: window 16 rows x 128 x 4 = 8192 per layer; ratio 4 also scans 25 indexer keys
     * (25x128x4 = 12800) and reads the 4 selected rows (2048); ratio 128 has no row yet */
    CHECK_NEAR(b.state, 8192 + (8192 + 12800 + 2048) + 8192 + (8192 + 12800 + 2048), 0.0);
    CHECK_NEAR(b.total, dense + 8 * expert + 544 + 62464, 1e-6);
    /* verify-shaped: 2 requests x 6 rows at context 300: 12 rows pick 2 of 8 */
    CHECK_EQ_INT(dsv4_step_bytes_compute(&cfg, 2, 6, 300, 4, &b, &err), 0);
    double distinct = 8 * (1 - pow(0.75, 12));
    CHECK_NEAR(b.experts_per_layer, distinct, 1e-12);
    CHECK_NEAR(b.experts, 4 * distinct * expert, 1e-6);
    /* 306 visible: window 16; ratio 4: 76 keys, 4 selected; ratio 128: 2 rows */
    double st = 8192 + (8192 + 76 * 512 + 2048) + (8192 + 2 * 512) + (8192 + 76 * 512 + 2048);
    CHECK_NEAR(b.state, 2 * st, 0.0);
    CHECK_NEAR(b.gathered, 12 * 512 + 2 * 12 * 16, 0.0);
    CHECK(dsv4_step_bytes_compute(&cfg, 0, 1, 0, 4, &b, &err) == DSV4_EINVAL);
    return TEST_REPORT();
}
