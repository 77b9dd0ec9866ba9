/*
 * KV pool sizing from a device's memory (vLLM --gpu-memory-utilization):
 * dsv4_pool_pages_for_memory, the budget the model runner caps the pool at
 * on a backend with mem_info (engine/model_runner.c). The expected counts are
 * worked by hand from the definition: floor((util * total - (total - free) -
 * reserve) / page_bytes), 0 when negative.
 */
#include "engine/model_runner.h"
#include "test.h"

#define GiB (1024LL * 1024 * 1024)
#define MiB (1024LL * 1024)

int main(void) {
    /* an H200-like device: 140 GiB, 91 GiB in use after the weights, 0.9, 4 GiB reserve:
     * 126 - 91 - 4 = 31 GiB of 1.5 MiB pages = 21162 pages (31 * 1024 / 1.5 = 21162.67) */
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(49 * GiB, 140 * GiB, 0.9, 4 * GiB, 3 * MiB / 2), 21162);
    /* the same with utilisation 1.0: 140 - 91 - 4 = 45 GiB -> 30720 pages */
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(49 * GiB, 140 * GiB, 1.0, 4 * GiB, 3 * MiB / 2), 30720);
    /* more in use than the utilisation allows: nothing fits (0, not negative) */
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(10 * GiB, 140 * GiB, 0.9, 4 * GiB, MiB), 0);
    /* less than one page left: 0 */
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(100 * MiB, 1000 * MiB, 1.0, 0, 200 * MiB), 0);
    /* exactly one page */
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(200 * MiB, 1000 * MiB, 1.0, 0, 200 * MiB), 1);
    /* the reserve counts: without it two pages fit, with 100 MiB one */
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(400 * MiB, 1000 * MiB, 1.0, 0, 200 * MiB), 2);
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(400 * MiB, 1000 * MiB, 1.0, 100 * MiB, 200 * MiB), 1);
    /* bad arguments: -1 */
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(1, 2, 0.9, 0, 0), -1);
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(1, 2, 0.0, 0, 1), -1);
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(1, 2, 1.5, 0, 1), -1);
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(3, 2, 0.9, 0, 1), -1);
    CHECK_EQ_INT((int)dsv4_pool_pages_for_memory(1, 2, 0.9, -1, 1), -1);
    return TEST_REPORT();
}
