/* logit_top on the CUDA backend (cuda_logit_top.cu; backend.h logit_top). Not a public header. */
#ifndef DSV4_CUDA_LOGIT_TOP_H
#define DSV4_CUDA_LOGIT_TOP_H

#include "backend/backend.h"

int cu_be_logit_top(dsv4_backend *be, const dsv4_buf *x, dsv4_buf *ids, dsv4_buf *lp, dsv4_err *err);

#endif
