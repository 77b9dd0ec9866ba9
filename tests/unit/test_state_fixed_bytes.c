/*
 * dsv4_state_fixed_bytes (src/model/state.c): the bytes a paged state holds
 * outside its pages, which the KV pool's --gpu-memory-utilization budget
 * (engine/model_runner.c) subtracts before counting pages. Why: the window,
 * compressor and indexer rings scale with the slots, and on the 43-layer
 * Flash config at 256 slots they are ~4 GiB, the whole default activation
 * reserve; before, the budget counted pages only (review 2026-12-01 item 6).
 * Expected values are not worked by hand: a real paged state is created on
 * the CPU backend and its buffers' sizes are summed, so the helper must agree
 * with what dsv4_state_create_paged allocates, for every KV row dtype, on the
 * committed Flash config and on tiny-flash.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/kvcodec.h"
#include "test.h"

static int64_t buf_bytes(const dsv4_buf *b) {
    return b->data ? b->rows * b->cols * (int64_t)dsv4_dtype_size(b->dtype) : 0;
}

static void check_dir(const char *dir, int n_slots, int max_len, int max_spec, int page_tokens, int n_pages) {
    dsv4_config cfg;
    dsv4_err err = {0};
    if (dsv4_config_load(dir, &cfg, &err)) {
        CHECK_MSG(0, "%s: %s", dir, err.msg);
        return;
    }
    int L = cfg.num_hidden_layers;
    int *ratios = malloc(sizeof(int) * (size_t)L);
    for (int l = 0; l < L; l++) ratios[l] = dsv4_config_layer_ratio(&cfg, l);
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
    CHECK(be != NULL);
    for (int t = 0; be && t < DSV4_KV_COUNT; t++) {
        dsv4_state *st = NULL;
        int rc = dsv4_state_create_paged(be, &cfg, ratios, L, n_slots, max_len, max_spec, page_tokens, n_pages,
                                         (dsv4_kv_dtype)t, &st, &err);
        CHECK_MSG(rc == 0, "%s %s: %s", dir, dsv4_kv_dtype_name((dsv4_kv_dtype)t), err.msg);
        if (rc) continue;
        int64_t fixed = buf_bytes(&st->block_table), paged = 0;
        for (int l = 0; l < L; l++) {
            const dsv4_layer_state *ls = &st->layers[l];
            fixed += buf_bytes(&ls->win.rows) + buf_bytes(&ls->cmp.kv) + buf_bytes(&ls->cmp.score) +
                     buf_bytes(&ls->idx.kv) + buf_bytes(&ls->idx.score);
            paged += buf_bytes(&ls->cmp.rows) + buf_bytes(&ls->idx.rows);
        }
        int64_t f = dsv4_state_fixed_bytes(&cfg, ratios, L, n_slots, max_len, max_spec, page_tokens, (dsv4_kv_dtype)t);
        CHECK_MSG(f == fixed, "%s %s: dsv4_state_fixed_bytes %lld, the state holds %lld outside its pages", dir,
                  dsv4_kv_dtype_name((dsv4_kv_dtype)t), (long long)f, (long long)fixed);
        /* the rest is exactly the pages the pool budget counts */
        CHECK(paged == (int64_t)n_pages * dsv4_state_page_bytes(&cfg, ratios, L, page_tokens, (dsv4_kv_dtype)t));
        printf("%s %s: %d slots hold %.2f MiB outside %d pages (%.2f MiB a slot)\n", dir,
               dsv4_kv_dtype_name((dsv4_kv_dtype)t), n_slots, (double)fixed / 1048576.0, n_pages,
               (double)fixed / n_slots / 1048576.0);
        dsv4_state_free(st);
    }
    /* bad arguments */
    CHECK(dsv4_state_fixed_bytes(&cfg, ratios, L, 0, max_len, max_spec, page_tokens, DSV4_KV_F32) == -1);
    CHECK(dsv4_state_fixed_bytes(&cfg, ratios, L, n_slots, max_len, max_spec, 0, DSV4_KV_F32) == -1);
    if (be) be->free(be);
    free(ratios);
}

int main(void) {
    check_dir("configs/deepseek-v4-flash-0731", 3, 1024, 3, 256, 2);
    check_dir("models/tiny-flash", 4, 128, 0, 256, 3);
    return TEST_REPORT();
}
