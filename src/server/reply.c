/* Replies and OpenAI-shaped error bodies (spec/SERVING.md §3.8). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/server.h"

void dsv4_reply_free(dsv4_reply *r) {
    if (!r) return;
    free(r->body);
    r->body = NULL;
    r->len = 0;
    if (r->stream.close) r->stream.close(r->stream.ctx); /* never handed to the HTTP layer */
    memset(&r->stream, 0, sizeof r->stream);
}

/* "type" is the status phrase in CamelCase + "Error" (vLLM convention, §3.8). */
static const char *error_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "UnauthorizedError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 413: return "RequestEntityTooLargeError";
    case 429: return "TooManyRequestsError";
    case 431: return "RequestHeaderFieldsTooLargeError";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
    }
}

int dsv4_reply_error(dsv4_reply *r, int status, const char *param, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->status = status;
    r->content_type = "application/json";
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNumberToObject(e, "code", status);
    r->body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!r->body) {
        static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                       "\"InternalServerError\",\"param\":null,\"code\":500}}";
        r->status = 500;
        r->body = strdup(fallback);
        r->len = r->body ? strlen(r->body) : 0;
        return DSV4_ENOMEM;
    }
    r->len = strlen(r->body);
    return 0;
}

void dsv4_reply_json(dsv4_reply *r, int status, cJSON *obj) {
    r->status = status;
    r->content_type = "application/json";
    r->body = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!r->body) {
        dsv4_reply_error(r, 500, NULL, "out of memory");
        return;
    }
    r->len = strlen(r->body);
}
