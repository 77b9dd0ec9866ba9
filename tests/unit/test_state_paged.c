/*
 * The paged state (issue 5; backend.h DSV4_CMP_ROW) at the forward level on
 * a random in-memory model (tests/unit/synth_model.h: ratio 4 / 128 / 4
 * layers, indexer top-3). Pages of 128 positions (32 ratio-4 rows, 1
 * ratio-128 row) mapped to scrambled page ids: a prompt of 154 positions in
 * chunks gives bit-identical logits to the unpaged state (f32 and fp8_ds_mla
 * storage); dsv4_state_copy_slot copies page by page; a row on an unmapped
 * page is an error naming it, never a silent read; set_pages validates.
 */
#include "model/kvcodec.h"
#include "synth_model.h"
#include "test.h"

enum { N = 154, V = 64 };
static int32_t toks[N];
static float ref[N][V], got[N][V];
static dsv4_model *model;

static int run(dsv4_state *st, int slot, int pos0, int n, float (*out)[V], dsv4_err *e) {
    static tu_batch tb;
    tu_batch_init(&tb);
    tu_batch_add(&tb, slot, pos0, n, toks); /* indexed by position */
    int32_t rows[N];
    static float lg[N * V];
    for (int t = 0; t < n; t++) rows[t] = t;
    int rc = dsv4_forward(model, st, &tb.b, rows, n, lg, NULL, e);
    for (int k = 0; !rc && out && k < n; k++) memcpy(out[pos0 + k], lg + (size_t)k * V, sizeof(float) * V);
    return rc;
}

/* Prefill 0..99 then 100..153 in two chunks. */
static int prefill(dsv4_state *st, int slot, float (*out)[V], dsv4_err *e) {
    int rc = run(st, slot, 0, 100, out, e);
    return rc ? rc : run(st, slot, 100, N - 100, out, e);
}

int main(void) {
    static synth s;
    synth_build(&s, 11);
    for (int p = 0; p < N; p++) toks[p] = (int32_t)((p * 29 + 3) % V);
    dsv4_err e = {0};
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
    CHECK_EQ_INT(dsv4_model_create(&s.cfg, &s.w, be, &model, &e), 0);
    int ratios[4] = {0, 4, 128, 4};
    for (int kv = 0; kv < 2 && model; kv++) {
        dsv4_kv_dtype kt = kv ? DSV4_KV_FP8_DS_MLA : DSV4_KV_F32;
        dsv4_state *flat = NULL, *paged = NULL;
        CHECK_EQ_INT(dsv4_state_create_paged(be, &s.cfg, ratios, 4, 4, 256, 0, 0, 0, kt, &flat, &e), 0);
        CHECK_EQ_INT(dsv4_state_create_paged(be, &s.cfg, ratios, 4, 4, 256, 0, 128, 8, kt, &paged, &e), 0);
        if (!flat || !paged) {
            fprintf(stderr, "%s\n", e.msg);
            break;
        }
        CHECK(flat->n_pages == 0 && flat->layers[1].cmp.block_table == NULL);
        CHECK_EQ_INT(paged->max_pages, 2);
        CHECK_EQ_INT(paged->layers[1].cmp.page_rows, 32);
        CHECK_EQ_INT(paged->layers[2].cmp.page_rows, 1);
        CHECK_EQ_INT(paged->layers[1].idx.page_rows, 32);
        CHECK_EQ_INT((int)paged->layers[1].cmp.rows.rows, 8 * 32);
        CHECK(paged->layers[1].cmp.block_table == paged->layers[3].idx.block_table); /* one table, every layer */

        CHECK_EQ_INT(prefill(flat, 0, ref, &e), 0);
        int32_t ids1[2] = {5, 2};
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 1, 2, ids1, &e), 0);
        CHECK_EQ_INT(prefill(paged, 1, got, &e), 0);
        CHECK_MSG(!memcmp(ref, got, sizeof ref), "%s: paged prefill != unpaged", dsv4_kv_dtype_name(kt));

        /* copy: paged slot 0 prefilled to 150 is copied to slot 2 (other pages),
         * then slot 0 is dropped and slot 2 decodes 150..153; the reference is
         * the unpaged state with the same chunks */
        static float ref2[N][V];
        CHECK_EQ_INT(run(flat, 2, 0, 100, NULL, &e), 0);
        CHECK_EQ_INT(run(flat, 2, 100, 50, NULL, &e), 0);
        CHECK_EQ_INT(run(flat, 2, 150, 2, ref2, &e), 0);
        CHECK_EQ_INT(run(flat, 2, 152, 2, ref2, &e), 0);
        int32_t ids0[2] = {4, 6}, ids2[2] = {7, 0};
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 0, 2, ids0, &e), 0);
        CHECK_EQ_INT(run(paged, 0, 0, 100, NULL, &e), 0);
        CHECK_EQ_INT(run(paged, 0, 100, 50, NULL, &e), 0);
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 2, 2, ids2, &e), 0);
        CHECK_EQ_INT(dsv4_state_copy_slot(paged, 0, 2, 150, &e), 0);
        CHECK_EQ_INT(dsv4_state_reset_slot(paged, 0, &e), 0);
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 0, 0, NULL, &e), 0);
        memset(got, 0, sizeof got);
        CHECK_EQ_INT(run(paged, 2, 150, 2, got, &e), 0);
        CHECK_EQ_INT(run(paged, 2, 152, 2, got, &e), 0);
        CHECK_MSG(!memcmp(ref2[150], got[150], sizeof(float) * V * 4), "%s: copied slot resumed != unpaged",
                  dsv4_kv_dtype_name(kt));

        /* slot 3 has no page: the first emitted row is refused */
        e.msg[0] = 0;
        CHECK_EQ_INT(run(paged, 3, 0, 8, NULL, &e), DSV4_ERANGE);
        CHECK_CONTAINS(e.msg, "not mapped");
        /* slot 3 with page 0 only: a position on page 1 is refused too */
        int32_t one = 3;
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 3, 1, &one, &e), 0);
        CHECK_EQ_INT(run(paged, 3, 0, 128, NULL, &e), 0);
        CHECK_EQ_INT(run(paged, 3, 128, 4, NULL, &e), DSV4_ERANGE);

        /* set_pages validation */
        int32_t bad = 8;
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 0, 1, &bad, &e), DSV4_EINVAL);
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 4, 0, NULL, &e), DSV4_EINVAL);
        CHECK_EQ_INT(dsv4_state_set_pages(paged, 0, 3, ids1, &e), DSV4_EINVAL);
        CHECK_EQ_INT(dsv4_state_set_pages(flat, 0, 0, NULL, &e), DSV4_EINVAL);
        dsv4_state *badst = NULL;
        CHECK_EQ_INT(dsv4_state_create_paged(be, &s.cfg, ratios, 4, 4, 256, 0, 100, 8, kt, &badst, &e), DSV4_EINVAL);
        CHECK_CONTAINS(e.msg, "multiple");
        dsv4_state_free(flat);
        dsv4_state_free(paged);
    }
    dsv4_model_free(model);
    be->free(be);
    synth_free(&s);
    return TEST_REPORT();
}
