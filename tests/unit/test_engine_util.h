/*
 * test_engine_util.h — one greedy generation through the engine, shared by
 * the tests that compare token streams (engine on a model, prefix cache,
 * dummy weights, tensor parallelism). Header-only: each test is its own
 * executable.
 */
#ifndef DSV4_TEST_ENGINE_UTIL_H
#define DSV4_TEST_ENGINE_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/model_runner.h"

/*
 * The backend these tests run on: the CPU reference unless DSV4_TEST_DEVICE
 * names another ("cuda" on a GPU machine; tests/gpu/run_single_h200.sh runs the
 * engine tests there so the same exact-equality assertions check the CUDA
 * kernels and graphs). A bad value exits 2 with the parser's message.
 */
static inline dsv4_device tu_test_device(void) {
    const char *dv = getenv("DSV4_TEST_DEVICE");
    dsv4_device d = DSV4_DEVICE_CPU;
    dsv4_err err = {0};
    if (dv && *dv && dsv4_device_parse(dv, &d, &err)) {
        fprintf(stderr, "DSV4_TEST_DEVICE: %s\n", err.msg);
        exit(2);
    }
    return d;
}

/*
 * Submit prompt p [n] at temperature 0 with ignore_eos, step the engine until
 * idle, and copy up to cap generated ids to out. *cached (may be NULL) gets
 * the request's prefix-cache hit in tokens. Returns the number of tokens, or
 * -1 when the engine refused the request (the message goes to stderr).
 */
static inline int tu_generate_greedy(dsv4_engine *e, const int32_t *p, int n, int max_tokens, int32_t *out, int cap,
                                     int *cached) {
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    dsv4_request *r;
    dsv4_err err = {0};
    if (dsv4_engine_submit(e, p, n, &gp, &r, &err)) {
        fprintf(stderr, "submit: %s\n", err.msg);
        return -1;
    }
    int rc;
    while ((rc = dsv4_engine_step(e, &err)) > 0) {}
    if (rc < 0) fprintf(stderr, "engine: %s\n", err.msg);
    dsv4_finish f;
    int got = dsv4_request_poll(r, out, cap, &f, 0);
    if (cached) *cached = dsv4_request_cached_tokens(r);
    dsv4_request_release(r);
    return got;
}

#endif
