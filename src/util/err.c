/* Error record and logging (include/dsv4/common.h). */
#include "dsv4/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int dsv4_err_set(dsv4_err *err, int code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int dsv4_err_prefix(dsv4_err *err, const char *fmt, ...) {
    if (!err || err->code == DSV4_OK) return err ? err->code : 0;
    char pre[DSV4_ERR_MSG_MAX], old[DSV4_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    /* Build "pre + old" by hand: truncation is intended, and this keeps
     * -Wformat-truncation quiet without a pragma. */
    memcpy(old, err->msg, sizeof old);
    size_t np = strnlen(pre, sizeof pre - 1), no = strnlen(old, sizeof old - 1);
    if (np > sizeof err->msg - 1) np = sizeof err->msg - 1;
    if (no > sizeof err->msg - 1 - np) no = sizeof err->msg - 1 - np;
    memcpy(err->msg, pre, np);
    memcpy(err->msg + np, old, no);
    err->msg[np + no] = '\0';
    return err->code;
}

void dsv4_err_clear(dsv4_err *err) {
    if (!err) return;
    err->code = DSV4_OK;
    err->msg[0] = '\0';
}

const char *dsv4_status_name(int code) {
    switch (code) {
    case DSV4_OK: return "ok";
    case DSV4_EINVAL: return "invalid argument";
    case DSV4_EIO: return "I/O error";
    case DSV4_EFORMAT: return "format error";
    case DSV4_ENOMEM: return "out of memory";
    case DSV4_EUNSUPPORTED: return "unsupported";
    case DSV4_EBIND: return "weight binding error";
    case DSV4_ERANGE: return "out of range";
    case DSV4_EBACKEND: return "backend error";
    case DSV4_EINTERNAL: return "internal error";
    default: return "unknown error";
    }
}

static const struct { const char *name; size_t size; } dtype_info[DSV4_DT_COUNT] = {
    [DSV4_DT_INVALID] = {"INVALID", 0}, [DSV4_DT_F32] = {"F32", 4},
    [DSV4_DT_BF16] = {"BF16", 2},       [DSV4_DT_F16] = {"F16", 2},
    [DSV4_DT_F8_E4M3] = {"F8_E4M3", 1}, [DSV4_DT_F8_E8M0] = {"F8_E8M0", 1},
    [DSV4_DT_I8] = {"I8", 1},           [DSV4_DT_U8] = {"U8", 1},
    [DSV4_DT_I32] = {"I32", 4},         [DSV4_DT_I64] = {"I64", 8},
};

size_t dsv4_dtype_size(dsv4_dtype dt) {
    return (dt > DSV4_DT_INVALID && dt < DSV4_DT_COUNT) ? dtype_info[dt].size : 0;
}

const char *dsv4_dtype_name(dsv4_dtype dt) {
    return (dt >= DSV4_DT_INVALID && dt < DSV4_DT_COUNT) ? dtype_info[dt].name : "INVALID";
}

dsv4_dtype dsv4_dtype_from_name(const char *name) {
    if (!name) return DSV4_DT_INVALID;
    for (int i = 1; i < DSV4_DT_COUNT; i++)
        if (strcmp(name, dtype_info[i].name) == 0) return (dsv4_dtype)i;
    return DSV4_DT_INVALID;
}

static dsv4_log_level g_log_level = DSV4_LOG_INFO;

void dsv4_log_set_level(dsv4_log_level lvl) { g_log_level = lvl; }

void dsv4_log(dsv4_log_level lvl, const char *fmt, ...) {
    if (lvl < g_log_level) return;
    static const char *tag[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%H:%M:%S", &tm);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s %s dsv4: ", ts, tag[lvl]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
