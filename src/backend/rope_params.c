/*
 * RoPE frequency table with YaRN (spec/MODEL.md §3.4.3). Shared by every
 * backend: the table is computed once on the host, in double precision, and
 * stored as fp32 (the official code precomputes a complex fp32 table).
 */
#include "backend/backend.h"

#include <math.h>

/* YaRN correction dimension: the pair index whose wavelength spans n rotations. */
static double yarn_corr_dim(double n, int dim, double orig_max, double theta) {
    return dim * log(orig_max / (n * 2.0 * M_PI)) / (2.0 * log(theta));
}

int dsv4_rope_init(dsv4_rope *r, int rope_dim, double theta, double yarn_factor,
                   double orig_max_pos, double beta_fast, double beta_slow, dsv4_err *err) {
    if (rope_dim <= 0 || rope_dim % 2 || rope_dim > 2 * DSV4_ROPE_MAX_PAIRS)
        return dsv4_err_set(err, DSV4_EINVAL, "rope: rope_dim %d must be even and in 2..%d",
                            rope_dim, 2 * DSV4_ROPE_MAX_PAIRS);
    if (!(theta > 1.0))
        return dsv4_err_set(err, DSV4_EINVAL, "rope: theta %g must be > 1", theta);
    r->rope_dim = rope_dim;
    int half = rope_dim / 2;
    double lo = 0, hi = 0;
    int yarn = yarn_factor > 1.0;
    if (yarn) {
        lo = floor(yarn_corr_dim(beta_fast, rope_dim, orig_max_pos, theta));
        hi = ceil(yarn_corr_dim(beta_slow, rope_dim, orig_max_pos, theta));
        if (lo < 0) lo = 0;
        if (hi > rope_dim - 1) hi = rope_dim - 1;
        if (lo == hi) hi = lo + 0.001;
    }
    for (int i = 0; i < DSV4_ROPE_MAX_PAIRS; i++) r->freq[i] = 0.0f;
    for (int i = 0; i < half; i++) {
        double f = pow(theta, -2.0 * i / rope_dim);
        if (yarn) {
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double keep = 1.0 - ramp; /* 1 = keep the original frequency */
            f = f / yarn_factor * (1.0 - keep) + f * keep;
        }
        r->freq[i] = (float)f;
    }
    return DSV4_OK;
}
