/*
 * The CPU backend's KV pool bounded by host memory, as vLLM's CPU backend
 * sizes its KV cache (src/util/hostmem.h, engine/model_runner.c size_pool):
 *  1. the pure pieces: /proc/meminfo parsing, VLLM_CPU_KVCACHE_SPACE (whole
 *     GiB, as vLLM's int(...) * GiB_bytes), the default budget
 *     floor(util * (avail - pending) / ranks) — expected values worked by hand;
 *  2. a runner on tiny-flash (CPU): VLLM_CPU_KVCACHE_SPACE=1 gives exactly
 *     floor(2^30 / page bytes) pages (before: every slot at max_len, 4 pages),
 *     --num-gpu-blocks-override and --kv-cache-memory-bytes win over it, a bad
 *     value is refused naming the variable, and one that cannot hold one
 *     max_len request is refused with vLLM's "estimated maximum model length";
 *  3. the default bound (gpu_mem_util of the host memory available): it caps
 *     a pool that would hold every slot at max_len, leaves one that fits alone,
 *     and refuses (not an OOM kill later) when one max_len request does not
 *     fit, unless fit_len (--max-model-len auto) keeps the smaller pool.
 * The default-bound cases pick the utilisation that leaves ~80 MiB of the host
 * memory available just before (read by the same helper), so they hold on any
 * machine with that much free.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/model_runner.h"
#include "test.h"
#include "test_models.h"
#include "util/hostmem.h"

#define GiB (1024LL * 1024 * 1024)
#define MiB (1024LL * 1024)

static char dir[700];

static int open_runner(dsv4_model_runner_opts *mo, dsv4_model_runner **mr, dsv4_err *err) {
    memset(err, 0, sizeof *err);
    *mr = NULL;
    return dsv4_model_runner_open(dir, mo, mr, err);
}

static void pure_pieces(void) {
    /* meminfo: values in kB, bytes out */
    int64_t t = 0, a = 0;
    dsv4_err err = {0};
    const char *mi = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   15000000 kB\n";
    CHECK_EQ_INT(dsv4_hostmem_parse_meminfo(mi, &t, &a, &err), 0);
    CHECK_EQ_INT(t, 24000000LL * 1024);
    CHECK_EQ_INT(a, 15000000LL * 1024);
    CHECK_EQ_INT(dsv4_hostmem_parse_meminfo("MemTotal: 10 kB\nMemFree: 5 kB\n", &t, &a, &err), DSV4_EFORMAT);
    CHECK_CONTAINS(err.msg, "MemAvailable");
    CHECK_EQ_INT(dsv4_hostmem_parse_meminfo("MemTotal: x kB\nMemAvailable: 5 kB\n", &t, &a, &err), DSV4_EFORMAT);
    CHECK_CONTAINS(err.msg, "MemTotal");
    /* the machine's own: something, and no more available than in total */
    CHECK_EQ_INT(dsv4_hostmem_info(&a, &t, &err), 0);
    CHECK(t > 0 && a >= 0 && a <= t);

    /* VLLM_CPU_KVCACHE_SPACE: whole GiB; unset / "" / "0" = not given */
    int64_t b = -1;
    CHECK_EQ_INT(dsv4_hostmem_kvcache_space("40", &b, &err), 0);
    CHECK_EQ_INT(b, 40 * GiB);
    CHECK_EQ_INT(dsv4_hostmem_kvcache_space(" 2 ", &b, &err), 0);
    CHECK_EQ_INT(b, 2 * GiB);
    CHECK_EQ_INT(dsv4_hostmem_kvcache_space(NULL, &b, &err), 0);
    CHECK_EQ_INT(b, 0);
    CHECK_EQ_INT(dsv4_hostmem_kvcache_space("", &b, &err), 0);
    CHECK_EQ_INT(b, 0);
    CHECK_EQ_INT(dsv4_hostmem_kvcache_space("0", &b, &err), 0);
    CHECK_EQ_INT(b, 0);
    const char *bad[] = {"-1", "1.5", "4G", "abc", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        CHECK_EQ_INT(dsv4_hostmem_kvcache_space(bad[i], &b, &err), DSV4_EINVAL);
        CHECK_CONTAINS(err.msg, "VLLM_CPU_KVCACHE_SPACE");
    }

    /* default budget: 0.9 * (20 - 2) GiB = 16.2 GiB; over 2 ranks 8.1 GiB */
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(20 * GiB, 2 * GiB, 0.9, 1), (int64_t)(0.9 * 18.0 * (double)GiB));
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(20 * GiB, 2 * GiB, 0.9, 2), (int64_t)(0.45 * 18.0 * (double)GiB));
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(10 * GiB, 0, 0.5, 1), 5 * GiB);
    /* the weights need more than is available: nothing for the pool */
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(2 * GiB, 3 * GiB, 0.9, 1), 0);
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(2 * GiB, 0, 0.0, 1), -1);
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(2 * GiB, 0, 1.5, 1), -1);
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(-1, 0, 0.9, 1), -1);
    CHECK_EQ_INT(dsv4_hostmem_kv_budget(2 * GiB, 0, 0.9, 0), -1);
}

static void env_space(void) {
    dsv4_model_runner_opts mo = {.n_slots = 2, .max_len = 512, .numerics = DSV4_NUMERICS_REFERENCE};
    dsv4_model_runner *mr;
    dsv4_err err;
    /* before: the env var was ignored and the pool held every slot at max_len (2 x 2 pages) */
    setenv("VLLM_CPU_KVCACHE_SPACE", "1", 1);
    CHECK_MSG(open_runner(&mo, &mr, &err) == 0, "%s", err.msg);
    if (mr) {
        dsv4_runner r = dsv4_model_runner_iface(mr);
        CHECK(r.page_bytes > 0);
        CHECK_EQ_INT(r.n_pages, GiB / r.page_bytes);
        int64_t pb = r.page_bytes;
        dsv4_model_runner_free(mr);
        /* the flags win: --num-gpu-blocks-override, --kv-cache-memory-bytes */
        mo.n_pages = 7;
        CHECK_MSG(open_runner(&mo, &mr, &err) == 0, "%s", err.msg);
        if (mr) CHECK_EQ_INT(dsv4_model_runner_iface(mr).n_pages, 7);
        dsv4_model_runner_free(mr);
        mo.n_pages = 0;
        mo.kv_cache_bytes = 10 * pb + 5;
        CHECK_MSG(open_runner(&mo, &mr, &err) == 0, "%s", err.msg);
        if (mr) CHECK_EQ_INT(dsv4_model_runner_iface(mr).n_pages, 10);
        dsv4_model_runner_free(mr);
        mo.kv_cache_bytes = 0;
        /* 1 GiB holds floor(2^30 / pb) pages; a max_len needing more is refused, naming the variable */
        int64_t fit = GiB / pb;
        mo.max_len = (int)((fit + 1) * 256);
        CHECK_EQ_INT(open_runner(&mo, &mr, &err), DSV4_ENOMEM);
        CHECK(mr == NULL);
        CHECK_CONTAINS(err.msg, "VLLM_CPU_KVCACHE_SPACE=1");
        CHECK_CONTAINS(err.msg, "to serve at least one request");
        char want[96];
        snprintf(want, sizeof want, "estimated maximum model length is %lld", (long long)fit * 256);
        CHECK_CONTAINS(err.msg, want);
        /* ... unless fit_len (--max-model-len auto) */
        mo.fit_len = 1;
        CHECK_MSG(open_runner(&mo, &mr, &err) == 0, "%s", err.msg);
        if (mr) CHECK_EQ_INT(dsv4_model_runner_iface(mr).n_pages, fit);
        dsv4_model_runner_free(mr);
        mo.fit_len = 0;
        mo.max_len = 512;
    }
    /* a bad value is refused, naming the variable */
    setenv("VLLM_CPU_KVCACHE_SPACE", "1.5", 1);
    CHECK_EQ_INT(open_runner(&mo, &mr, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "VLLM_CPU_KVCACHE_SPACE='1.5'");
    /* more than the machine has: refused at open, as vLLM does */
    setenv("VLLM_CPU_KVCACHE_SPACE", "1048576", 1);
    CHECK_EQ_INT(open_runner(&mo, &mr, &err), DSV4_ENOMEM);
    CHECK_CONTAINS(err.msg, "available");
    unsetenv("VLLM_CPU_KVCACHE_SPACE");
}

static void default_bound(void) {
    int64_t avail = 0, total = 0;
    dsv4_err err = {0};
    if (dsv4_hostmem_info(&avail, &total, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    dsv4_model_runner *mr;
    /* a pool that fits: every slot at max_len, as before (4 slots x 16 pages of 256 = 8 MiB vs 0.01 of RAM) */
    dsv4_model_runner_opts mo = {.n_slots = 4, .max_len = 4096, .numerics = DSV4_NUMERICS_REFERENCE,
                                 .gpu_mem_util = 0.9};
    CHECK_MSG(open_runner(&mo, &mr, &err) == 0, "%s", err.msg);
    if (mr) CHECK_EQ_INT(dsv4_model_runner_iface(mr).n_pages, 4 * 16);
    int64_t pb = mr ? dsv4_model_runner_iface(mr).page_bytes : 0;
    dsv4_model_runner_free(mr);
    if (pb <= 0) return;
    /* capped: 64 slots x 16 pages would need 1024 pages (~129 MiB); a utilisation that leaves ~80 MiB of
     * the memory available now (less the 64 slots' rings, ~12 MiB) holds fewer, but more than one request */
    double util = 80.0 * MiB / (double)avail;
    if (util > 1) {
        printf("skip: less than 80 MiB of host memory available\n");
        return;
    }
    mo.n_slots = 64;
    mo.gpu_mem_util = util;
    CHECK_MSG(open_runner(&mo, &mr, &err) == 0, "%s", err.msg);
    if (mr) {
        int64_t np = dsv4_model_runner_iface(mr).n_pages;
        CHECK_MSG(np >= 16 && np < 1024, "%lld pages", (long long)np);
        CHECK_MSG((double)np * (double)pb <= 1.1 * 80.0 * MiB, "%lld pages of %lld bytes", (long long)np, (long long)pb);
    }
    dsv4_model_runner_free(mr);
    /* one request of 1M tokens (4096 pages, ~516 MiB on tiny-flash) in that budget: refused at open with the
     * length that would fit, instead of a pool that the OOM killer finds later */
    mo.n_slots = 2;
    mo.max_len = 1 << 20;
    CHECK_EQ_INT(open_runner(&mo, &mr, &err), DSV4_ENOMEM);
    CHECK(mr == NULL);
    CHECK_CONTAINS(err.msg, "to serve at least one request of max_model_len 1048576");
    CHECK_CONTAINS(err.msg, "estimated maximum model length is");
    CHECK_CONTAINS(err.msg, "VLLM_CPU_KVCACHE_SPACE");
    CHECK_CONTAINS(err.msg, "--max-model-len");
    /* --max-model-len auto: the smaller pool is kept */
    mo.fit_len = 1;
    CHECK_MSG(open_runner(&mo, &mr, &err) == 0, "%s", err.msg);
    if (mr) {
        int64_t np = dsv4_model_runner_iface(mr).n_pages;
        CHECK_MSG(np >= 1 && np < 4096, "%lld pages", (long long)np);
    }
    dsv4_model_runner_free(mr);
}

int main(void) {
    const char *need[] = {"tiny-flash"};
    char models[600];
    tm_find_models(models, sizeof models, need, 1);
    snprintf(dir, sizeof dir, "%s/tiny-flash", models);
    unsetenv("VLLM_CPU_KVCACHE_SPACE");
    pure_pieces();
    env_space();
    default_bound();
    return TEST_REPORT();
}
