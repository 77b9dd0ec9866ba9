/*
 * dsv4/common.h — the error record and the few types every module shares.
 *
 * Why an error record instead of errno or exit(): library code never exits
 * (DESIGN.md "Rules"), and a user needs a message that names the file,
 * tensor, parameter or field at fault. Every fallible public function returns
 * an int status (0 = DSV4_OK) and, when given a non-NULL dsv4_err, fills it.
 */
#ifndef DSV4_COMMON_H
#define DSV4_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Keep them coarse: the message carries the detail. */
enum {
    DSV4_OK = 0,
    DSV4_EINVAL = 1,     /* bad argument / bad user input                   */
    DSV4_EIO = 2,        /* file missing, unreadable, truncated             */
    DSV4_EFORMAT = 3,    /* malformed file contents (header, JSON, ...)     */
    DSV4_ENOMEM = 4,     /* allocation failed                               */
    DSV4_EUNSUPPORTED = 5,/* valid input we do not handle                   */
    DSV4_EBIND = 6,      /* checkpoint tensor set does not match the model  */
    DSV4_ERANGE = 7,     /* request exceeds a limit (context length, ...)   */
    DSV4_EBACKEND = 8,   /* backend (CUDA, NCCL) failure                    */
    DSV4_EINTERNAL = 9,  /* a bug: an invariant did not hold                */
};

#define DSV4_ERR_MSG_MAX 1024

/* An error record: code plus a human-readable message. Zero-initialise it. */
typedef struct dsv4_err {
    int code;
    char msg[DSV4_ERR_MSG_MAX];
} dsv4_err;

/*
 * dsv4_err_set — record an error and return its code, so callers can write
 *   return dsv4_err_set(err, DSV4_EIO, "%s: truncated (%zu of %zu bytes)", ...);
 * err may be NULL (the code is still returned). The message is printf-style
 * and truncated to DSV4_ERR_MSG_MAX-1 bytes. Returns code.
 */
int dsv4_err_set(dsv4_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * dsv4_err_prefix — prepend context ("loading shard x: ") to an existing
 * message; no-op when err is NULL or holds no error. Returns err->code (or 0).
 */
int dsv4_err_prefix(dsv4_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* dsv4_err_clear — reset to DSV4_OK with an empty message. */
void dsv4_err_clear(dsv4_err *err);

/* Short name of a status code ("invalid argument", ...). Never NULL. */
const char *dsv4_status_name(int code);

/*
 * Element types of checkpoint tensors and of backend buffers
 * (spec/MODEL.md §2.1, §2.3). The safetensors dtype strings map 1:1.
 */
typedef enum dsv4_dtype {
    DSV4_DT_INVALID = 0,
    DSV4_DT_F32,       /* "F32"                                        */
    DSV4_DT_BF16,      /* "BF16"                                       */
    DSV4_DT_F16,       /* "F16"  (accepted on read, never produced)    */
    DSV4_DT_F8_E4M3,   /* "F8_E4M3"  float8_e4m3fn                      */
    DSV4_DT_F8_E8M0,   /* "F8_E8M0"  float8_e8m0fnu (scales)            */
    DSV4_DT_I8,        /* "I8"  (packed FP4 E2M1 pairs, low nibble first) */
    DSV4_DT_U8,        /* "U8"                                         */
    DSV4_DT_I32,       /* "I32"                                        */
    DSV4_DT_I64,       /* "I64"  (tid2eid)                              */
    DSV4_DT_COUNT
} dsv4_dtype;

/* Bytes per element (1 for I8-packed FP4: one byte holds two values). 0 for INVALID. */
size_t dsv4_dtype_size(dsv4_dtype dt);
/* safetensors dtype string ("BF16") <-> enum. Unknown string -> DSV4_DT_INVALID. */
const char *dsv4_dtype_name(dsv4_dtype dt);
dsv4_dtype dsv4_dtype_from_name(const char *name);

/* Logging to stderr, with a level prefix. Library code may log; it never exits. */
typedef enum { DSV4_LOG_DEBUG = 0, DSV4_LOG_INFO, DSV4_LOG_WARN, DSV4_LOG_ERROR } dsv4_log_level;
void dsv4_log_set_level(dsv4_log_level lvl);
void dsv4_log(dsv4_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
