/* Host memory for the CPU KV pool (src/util/hostmem.h). */
#include "util/hostmem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of "name: N kB" in a meminfo text, in bytes; -1 when absent or malformed. */
static int64_t meminfo_field(const char *text, const char *name) {
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) || p[n] != ':') continue;
        char *end;
        errno = 0;
        long long v = strtoll(p + n + 1, &end, 10);
        if (errno || end == p + n + 1 || v < 0) return -1;
        while (*end == ' ' || *end == '\t') end++;
        if (strncmp(end, "kB", 2)) return -1;
        return (int64_t)v * 1024;
    }
    return -1;
}

int dsv4_hostmem_parse_meminfo(const char *text, int64_t *total_bytes, int64_t *avail_bytes, dsv4_err *err) {
    int64_t t = meminfo_field(text, "MemTotal"), a = meminfo_field(text, "MemAvailable");
    if (t < 0) return dsv4_err_set(err, DSV4_EFORMAT, "/proc/meminfo: no MemTotal line of kB");
    if (a < 0) return dsv4_err_set(err, DSV4_EFORMAT, "/proc/meminfo: no MemAvailable line of kB");
    *total_bytes = t;
    *avail_bytes = a;
    return DSV4_OK;
}

/* A cgroup file holding one byte count; -1 when absent, "max" or unreadable. */
static int64_t read_count(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || end == buf || v < 0) return -1;
    return (int64_t)v;
}

int dsv4_hostmem_info(int64_t *avail_bytes, int64_t *total_bytes, dsv4_err *err) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return dsv4_err_set(err, DSV4_EIO, "/proc/meminfo: %s", strerror(errno));
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    int64_t t = 0, a = 0; /* set by the parser on success (initialised for -O2 -Wmaybe-uninitialized) */
    int rc = dsv4_hostmem_parse_meminfo(text, &t, &a, err);
    if (rc) return rc;
    /* strict overcommit (vm.overcommit_memory = 2): an allocation beyond the commit limit fails
     * even while untouched, so what may still be committed bounds the pool too */
    int64_t mode = read_count("/proc/sys/vm/overcommit_memory");
    int64_t cl = meminfo_field(text, "CommitLimit"), cas = meminfo_field(text, "Committed_AS");
    if (mode == 2 && cl >= 0 && cas >= 0) {
        int64_t left = cl > cas ? cl - cas : 0;
        if (left < a) a = left;
    }
    /* a container's limit: the kernel reports the host's memory in /proc/meminfo */
    int64_t lim = read_count("/sys/fs/cgroup/memory.max"), use = read_count("/sys/fs/cgroup/memory.current");
    if (lim < 0) {
        lim = read_count("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        use = read_count("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    }
    if (lim > 0 && lim < t) {
        t = lim;
        int64_t left = use >= 0 && use < lim ? lim - use : 0;
        if (left < a) a = left;
    }
    *total_bytes = t;
    *avail_bytes = a < t ? a : t;
    return DSV4_OK;
}

int dsv4_hostmem_kvcache_space(const char *s, int64_t *bytes, dsv4_err *err) {
    *bytes = 0;
    if (!s || !*s) return DSV4_OK;
    const char *p = s;
    while (*p == ' ' || *p == '\t') p++; /* Python's int() allows surrounding blanks */
    if (*p == '+') p++;
    int64_t g = 0;
    const char *d0 = p;
    while (*p >= '0' && *p <= '9' && g <= (1 << 20)) g = g * 10 + (*p++ - '0');
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (p == d0 || *p || g > (1 << 20))
        return dsv4_err_set(err, DSV4_EINVAL,
                            "VLLM_CPU_KVCACHE_SPACE='%s': expected a whole number of GiB for the CPU KV cache (e.g. "
                            "VLLM_CPU_KVCACHE_SPACE=40), or unset it for the default bound",
                            s);
    *bytes = g << 30;
    return DSV4_OK;
}

int64_t dsv4_hostmem_kv_budget(int64_t avail_bytes, int64_t pending_bytes, double util, int n_ranks) {
    if (!(util > 0 && util <= 1) || avail_bytes < 0 || pending_bytes < 0 || n_ranks < 1) return -1;
    if (avail_bytes <= pending_bytes) return 0;
    return (int64_t)(util * (double)(avail_bytes - pending_bytes) / (double)n_ranks);
}
