/*
 * KV compressor (spec/MODEL.md §3.4.5) and the indexer's own compressor
 * (§3.4.6): every block of `ratio` positions [w·m, w·m+m−1] becomes one row,
 * a per-channel softmax-weighted sum of the block's projections; ratio 4
 * overlaps with the previous block (its first halves Ka, Za).
 *
 * Where a slot's (K, Z) comes from: positions >= the segment's first
 * position p0 are this batch's rows (Z gets ape[p mod m] added here); older
 * positions come from the slot's token ring, which stores Z with ape already
 * added. The ring is written last, so windows of a long chunk read their own
 * rows even when the chunk is longer than the ring.
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Pointers to the (K, Z) row of position pp, and whether Z still lacks ape. */
static void token_row(const dsv4_cmp_state *cs, const float *K, const float *Z, int64_t cw, int t,
                      int64_t p, int64_t p0, int slot, int64_t pp, const float **kr, const float **zr,
                      int *needs_ape) {
    if (pp >= p0) {
        int64_t r = t - (p - pp);
        *kr = K + r * cw;
        *zr = Z + r * cw;
        *needs_ape = 1;
    } else {
        int64_t r = (int64_t)slot * cs->cap + pp % cs->cap;
        *kr = (const float *)cs->kv.data + r * cw;
        *zr = (const float *)cs->score.data + r * cw;
        *needs_ape = 0;
    }
}

/* Pool window w of one slot into out[out_dim] (§3.4.5 "Pooling"). */
static void pool_window(const dsv4_cmp_state *cs, const float *K, const float *Z, const dsv4_tview *ape,
                        int t, int64_t p, int64_t p0, int slot, int64_t w, float *out, float *zbuf,
                        float *kbuf) {
    int m = cs->ratio, D = cs->out_dim;
    int64_t cw = (int64_t)D * (cs->overlap ? 2 : 1);
    int nslot = 0;
    /* Collect slots: (previous window, first half) then (this window, second half or full). */
    for (int part = cs->overlap ? 0 : 1; part < 2; part++) {
        int64_t wb = part == 0 ? w - 1 : w;
        int64_t off = (cs->overlap && part == 1) ? D : 0;
        for (int i = 0; i < m; i++, nslot++) {
            if (wb < 0) { /* absent previous window: weight 0 */
                for (int j = 0; j < D; j++) {
                    zbuf[(int64_t)nslot * D + j] = -INFINITY;
                    kbuf[(int64_t)nslot * D + j] = 0;
                }
                continue;
            }
            int64_t pp = wb * m + i;
            const float *kr, *zr;
            int na;
            token_row(cs, K, Z, cw, t, p, p0, slot, pp, &kr, &zr, &na);
            for (int j = 0; j < D; j++) {
                float z = zr[off + j];
                if (na) z += dsv4_cpu_load_f(ape->data, ape->dtype, (int64_t)(pp % m) * cw + off + j);
                zbuf[(int64_t)nslot * D + j] = z;
                kbuf[(int64_t)nslot * D + j] = kr[off + j];
            }
        }
    }
    for (int j = 0; j < D; j++) { /* an independent softmax per channel */
        float mx = -INFINITY;
        for (int sI = 0; sI < nslot; sI++) mx = fmaxf(mx, zbuf[(int64_t)sI * D + j]);
        double den = 0, acc = 0;
        for (int sI = 0; sI < nslot; sI++) {
            double e = exp((double)zbuf[(int64_t)sI * D + j] - mx);
            den += e;
            acc += e * kbuf[(int64_t)sI * D + j];
        }
        out[j] = (float)(acc / den);
    }
}

int dsv4_cpu_compress(dsv4_backend *be, dsv4_cmp_state *cs, const dsv4_buf *K, const dsv4_buf *Z,
                      const dsv4_tview *ape, const dsv4_tview *norm_w, float eps,
                      const dsv4_rope *rope, dsv4_qat qat, const dsv4_batch *b, dsv4_err *err) {
    if (!cs || cs->ratio <= 0 || cs->out_dim <= 0 || cs->cap < cs->ratio * (1 + cs->overlap))
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: compress: bad state (ratio, out_dim, cap)");
    int m = cs->ratio, D = cs->out_dim;
    int64_t cw = (int64_t)D * (cs->overlap ? 2 : 1);
    int rc = dsv4_cpu_check_f32(K, b->n_rows, cw, "compress K", err);
    if (!rc) rc = dsv4_cpu_check_f32(Z, b->n_rows, cw, "compress Z", err);
    if (!rc) rc = dsv4_cpu_check_vec(ape, (int64_t)m * cw, "compressor ape", err);
    if (!rc) rc = dsv4_cpu_check_vec(norm_w, D, "compressor norm", err);
    if (!rc) rc = dsv4_cpu_check_f32(&cs->kv, (int64_t)cs->n_slots * cs->cap, cw, "compressor kv ring", err);
    if (!rc) rc = dsv4_cpu_check_f32(&cs->score, (int64_t)cs->n_slots * cs->cap, cw, "compressor score ring", err);
    dsv4_cpu_kv_fmt rf;
    if (!rc) rc = dsv4_cpu_check_cmp_rows(cs, D, "compressed rows", err);
    if (!rc) rc = dsv4_cpu_kv_fmt_of(&cs->rows, -1, D, "compressed rows", &rf, err);
    if (rc) return rc;
    for (int t = 0; t < b->n_rows; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= cs->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "compress: slot %d out of range", b->slot[t]);
        if ((b->pos[t] + 1) % m == 0 && (b->pos[t] + 1) / m > cs->max_rows)
            return dsv4_err_set(err, DSV4_ERANGE, "compress: position %d beyond the state's %lld rows",
                                b->pos[t], (long long)cs->max_rows);
        if ((b->pos[t] + 1) % m == 0 && dsv4_cpu_cmp_index(cs, b->slot[t], b->pos[t] / m) < 0)
            return dsv4_err_set(err, DSV4_ERANGE, "compress: slot %d position %d: its page is not mapped",
                                b->slot[t], b->pos[t]);
    }
    int nslot = m * (cs->overlap ? 2 : 1);
    float *zbuf = malloc((size_t)nslot * D * sizeof(float)), *kbuf = malloc((size_t)nslot * D * sizeof(float));
    float *row = malloc((size_t)D * sizeof(float)); /* the emitted row, then coded into the store */
    if (!zbuf || !kbuf || !row) {
        free(zbuf);
        free(kbuf);
        free(row);
        return dsv4_err_set(err, DSV4_ENOMEM, "cpu: compress: out of memory");
    }
    int ref = be->numerics == DSV4_NUMERICS_REFERENCE;
    /* 1. Emit every window completed by a row of this batch. */
    for (int t = 0; t < b->n_rows; t++) {
        int64_t p = b->pos[t];
        if ((p + 1) % m) continue;
        int slot = b->slot[t];
        int64_t w = p / m, p0 = b->seq_pos0[b->seq_idx[t]];
        pool_window(cs, K->data, Z->data, ape, t, p, p0, slot, w, row, zbuf, kbuf);
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)row[j] * row[j];
        float r = (float)(1.0 / sqrt(ss / D + eps));
        for (int j = 0; j < D; j++) row[j] = row[j] * r * dsv4_cpu_load_f(norm_w->data, norm_w->dtype, j);
        dsv4_cpu_rope_row(row, D, rope, w * m, 0); /* at the window's first position */
        if (ref && qat == DSV4_QAT_FP8_NOPE) {
            int nope = D - rope->rope_dim; /* blocks of 64 (a shorter tail only in toy shapes) */
            for (int k = 0; k < nope; k += 64) dsv4_cpu_fp8_roundtrip(row + k, nope - k < 64 ? nope - k : 64);
        } else if (ref && qat == DSV4_QAT_HADAMARD_FP4) {
            dsv4_cpu_hadamard(row, D);
            for (int k = 0; k < D; k += 32) dsv4_cpu_fp4_roundtrip(row + k, 32);
        }
        dsv4_cpu_kv_store(&cs->rows, &rf, dsv4_cpu_cmp_index(cs, slot, w), row); /* mapped: checked above */
    }
    free(zbuf);
    free(kbuf);
    free(row);
    /* 2. Record the batch's (K, Z+ape) in the token ring, in row order. */
    for (int t = 0; t < b->n_rows; t++) {
        int64_t p = b->pos[t], r = (int64_t)b->slot[t] * cs->cap + p % cs->cap;
        const float *kr = (const float *)K->data + (int64_t)t * cw, *zr = (const float *)Z->data + (int64_t)t * cw;
        float *kd = (float *)cs->kv.data + r * cw, *zd = (float *)cs->score.data + r * cw;
        for (int64_t j = 0; j < cw; j++) {
            kd[j] = kr[j];
            zd[j] = zr[j] + dsv4_cpu_load_f(ape->data, ape->dtype, (p % m) * cw + j);
        }
    }
    return DSV4_OK;
}
