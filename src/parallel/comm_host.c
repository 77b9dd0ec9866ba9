/*
 * Host staging for the local and tcp communicators (comm_host.h): the BF16
 * widening / rounding and the rank-order fp32 sum both must share bit for bit.
 */
#include "parallel/comm_host.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int dsv4_comm_host_grow(const char *who, void **p, size_t *cap, size_t need, dsv4_err *err) {
    if (need <= *cap) return 0;
    void *q = realloc(*p, need);
    if (!q) return dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory (%zu bytes)", who, need);
    *p = q;
    *cap = need;
    return 0;
}

int dsv4_comm_host_read(dsv4_comm_stage *st, dsv4_backend *be, const dsv4_buf *buf, float **dst,
                        size_t *dst_cap, dsv4_err *err) {
    size_t n = (size_t)buf->rows * (size_t)buf->cols;
    if (buf->dtype != DSV4_DT_F32 && buf->dtype != DSV4_DT_BF16)
        return dsv4_err_set(err, DSV4_EINVAL, "%s: dtype %s not supported (F32, BF16)", st->who,
                            dsv4_dtype_name(buf->dtype));
    void *d = *dst;
    int rc = dsv4_comm_host_grow(st->who, &d, dst_cap, (n ? n : 1) * sizeof(float), err);
    *dst = d;
    if (rc || !n) return rc;
    if (buf->dtype == DSV4_DT_F32) return be->buf_read(be, buf, *dst, err);
    if ((rc = dsv4_comm_host_grow(st->who, &st->raw, &st->raw_cap, n * 2, err))) return rc;
    if ((rc = be->buf_read(be, buf, st->raw, err))) return rc;
    const uint16_t *h = st->raw;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&(*dst)[i], &u, 4);
    }
    return 0;
}

int dsv4_comm_host_write(dsv4_comm_stage *st, dsv4_backend *be, dsv4_buf *buf, const float *v,
                         dsv4_err *err) {
    size_t n = (size_t)buf->rows * (size_t)buf->cols;
    if (!n) return 0;
    if (buf->dtype == DSV4_DT_F32) return be->buf_write(be, buf, v, err);
    int rc = dsv4_comm_host_grow(st->who, &st->raw, &st->raw_cap, n * 2, err);
    if (rc) return rc;
    uint16_t *h = st->raw;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu))
            h[i] = (uint16_t)((u >> 16) | 0x40); /* NaN */
        else
            h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return be->buf_write(be, buf, h, err);
}

void dsv4_comm_host_accumulate(float *acc, const float *part, size_t n) {
    for (size_t i = 0; i < n; i++)
        acc[i] += part[i];
}
