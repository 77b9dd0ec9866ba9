/*
 * Padding decode / verify batches to the captured sizes (issue 7).
 *
 * Why: a CUDA graph is valid for one batch shape. Capturing every shape a
 * server meets at request time (the old per-shape cache) compiles during the
 * first requests; vLLM instead captures a fixed list of batch sizes at start
 * and pads each step up to the next one. The same here: a batch of s
 * sequences of r rows each (decode r = 1, verify r = k+1) runs as S >= s
 * sequences, the extra S - s being copies of one "pad" sequence.
 *
 * Why the pad rows cannot disturb real state: they live in a state slot the
 * runner reserves and never hands to a request (m->pad_slot, with its own
 * page when the state is paged), at positions 0 .. r-1, so everything they
 * write (window and compressor rings, emitted rows) is that slot's, and
 * everything they read is that slot's rows at positions <= theirs. Every op
 * is row- or segment-local (attention and indexer read their segment's slot;
 * linears, norms, MoE routing and expert sums are per row), so the real rows'
 * results do not depend on the pad rows; the pad sequences being identical,
 * their concurrent writes to the one slot write the same values. Their
 * outputs are never read back (dsv4_fwd_out.read_rows).
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

int dsv4_forward_padded(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                        dsv4_err *err) {
    int s = b->n_seqs, T = b->n_rows;
    if (!m->n_pad_sizes || m->in_pad || s < 1 || T < s || T % s) return 1;
    int r = T / s;
    if (r > DSV4_GRAPH_MAX_ROWS_PER_SEQ || !(m->pad_rows_mask >> r & 1u) || m->pad_slot < 0 || m->pad_slot >= st->n_slots) return 1;
    for (int i = 0; i < s; i++)
        if (b->cu_seqlens[i + 1] - b->cu_seqlens[i] != r) return 1; /* ragged: a mixed or uneven step */
    if (dsv4_fwd_n_logits(out) != T) return 1;
    for (int i = 0; i < T; i++)
        if (out->logit_rows[i] != i) return 1;
    int S = 0;
    for (int i = 0; i < m->n_pad_sizes && !S; i++)
        if (m->pad_sizes[i] >= s) S = m->pad_sizes[i];
    if (!S || S == s) return 1; /* beyond the largest size, or already a captured size */
    int P = S * r;
    int32_t *buf = malloc(sizeof(int32_t) * ((size_t)6 * P + 3 * (size_t)S + 1));
    if (!buf) return dsv4_err_set(err, DSV4_ENOMEM, "forward: out of memory padding %d rows to %d", T, P);
    int32_t *tok = buf, *pos = tok + P, *slot = pos + P, *sidx = slot + P, *lrows = sidx + P;
    int32_t *cu = lrows + P, *sslot = cu + S + 1, *spos0 = sslot + S;
    memcpy(tok, b->token, sizeof(int32_t) * (size_t)T);
    memcpy(pos, b->pos, sizeof(int32_t) * (size_t)T);
    memcpy(slot, b->slot, sizeof(int32_t) * (size_t)T);
    memcpy(sidx, b->seq_idx, sizeof(int32_t) * (size_t)T);
    memcpy(cu, b->cu_seqlens, sizeof(int32_t) * (size_t)(s + 1));
    memcpy(sslot, b->seq_slot, sizeof(int32_t) * (size_t)s);
    memcpy(spos0, b->seq_pos0, sizeof(int32_t) * (size_t)s);
    for (int q = s; q < S; q++) {
        for (int j = 0; j < r; j++) {
            int t = q * r + j;
            tok[t] = 0;
            pos[t] = j;
            slot[t] = m->pad_slot;
            sidx[t] = q;
        }
        cu[q + 1] = (q + 1) * r;
        sslot[q] = m->pad_slot;
        spos0[q] = 0;
    }
    for (int t = 0; t < P; t++) lrows[t] = t;
    dsv4_batch pb = {P, S, tok, pos, slot, sidx, cu, sslot, spos0};
    dsv4_fwd_out po = *out;
    po.logit_rows = lrows;
    po.n_logits = P;
    po.read_rows = T;
    m->in_pad = 1;
    m->n_padded++;
    int rc = dsv4_forward_ex(m, st, &pb, &po, err);
    m->in_pad = 0;
    free(buf);
    return rc;
}
