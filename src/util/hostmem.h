/*
 * Host memory for the CPU backend's KV pool (engine/model_runner.c), sized the
 * way vLLM's CPU backend sizes its KV cache: VLLM_CPU_KVCACHE_SPACE (whole GiB)
 * when set, else a bound derived from the machine's memory, and never a pool
 * that claims more than the machine has.
 *
 * Why here and not in the backend op table: the CPU backend keeps its state in
 * plain host memory, touched lazily, so nothing fails at allocation time; the
 * bound must come from what the kernel reports (/proc/meminfo, the cgroup's
 * limit), before the pool is allocated.
 */
#ifndef DSV4_UTIL_HOSTMEM_H
#define DSV4_UTIL_HOSTMEM_H

#include <stdint.h>

#include "dsv4/common.h"

/*
 * dsv4_hostmem_parse_meminfo — MemTotal and MemAvailable of a /proc/meminfo
 * text (lines "Name:   N kB"), in bytes. Errors: DSV4_EFORMAT naming the
 * field when either line is missing or malformed (kernels before 3.14 have no
 * MemAvailable).
 */
int dsv4_hostmem_parse_meminfo(const char *text, int64_t *total_bytes, int64_t *avail_bytes, dsv4_err *err);

/*
 * dsv4_hostmem_info — host memory now, in bytes: total = MemTotal and avail =
 * MemAvailable (/proc/meminfo: free memory plus what the kernel can reclaim
 * without swapping), both lowered to the memory cgroup's limit when one is set
 * (cgroup v2 memory.max less memory.current, or v1 memory.limit_in_bytes less
 * memory.usage_in_bytes, read at /sys/fs/cgroup); under strict overcommit
 * (vm.overcommit_memory = 2) avail is also at most CommitLimit - Committed_AS,
 * since an allocation beyond it fails even untouched. Errors: DSV4_EIO when
 * /proc/meminfo cannot be read, DSV4_EFORMAT as above.
 */
int dsv4_hostmem_info(int64_t *avail_bytes, int64_t *total_bytes, dsv4_err *err);

/*
 * dsv4_hostmem_kvcache_space — the VLLM_CPU_KVCACHE_SPACE value `s` (the
 * environment variable's text, or NULL when unset) in bytes: a whole number
 * of GiB, as vLLM reads it (int(...) * 2^30). NULL, "" and "0" mean unset
 * (*bytes = 0; vLLM before 0.11 documented 0 as "the default"). Errors:
 * DSV4_EINVAL naming the variable for anything else (negative, fractional,
 * trailing text, more than 2^20 GiB).
 */
int dsv4_hostmem_kvcache_space(const char *s, int64_t *bytes, dsv4_err *err);

/*
 * dsv4_hostmem_kv_budget — the CPU KV pool's default budget in bytes when
 * neither VLLM_CPU_KVCACHE_SPACE nor --kv-cache-memory-bytes /
 * --num-gpu-blocks-override is given: util (--gpu-memory-utilization, which
 * vLLM's CPU backend also reads as the fraction of host memory to use) of the
 * host memory available now less pending_bytes (weights mapped from the
 * checkpoint but not yet counted as used: their file pages are reclaimable, so
 * MemAvailable includes them, yet serving reads them all), shared by n_ranks
 * tensor-parallel ranks of one process. floor(util * (avail - pending) /
 * n_ranks), 0 when avail <= pending. Returns -1 for bad arguments (util
 * outside (0, 1], negative bytes, n_ranks < 1).
 */
int64_t dsv4_hostmem_kv_budget(int64_t avail_bytes, int64_t pending_bytes, double util, int n_ranks);

#endif
