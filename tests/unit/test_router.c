/* Router: auth, routes, methods, validation and error shapes (spec/SERVING.md §3). */
#include <cjson/cJSON.h>

#include "cli/serve_args.h"
#include "server/server.h"
#include "test.h"

static dsv4_reply R;

static cJSON *call(dsv4_router *rt, const char *m, const char *p, const char *auth, const char *body) {
    dsv4_reply_free(&R);
    dsv4_router_handle(rt, m, p, auth, body ? body : "", body ? strlen(body) : 0, &R);
    return cJSON_ParseWithLength(R.body, R.len);
}

/* Check an error body's shape: {"error":{"message","type","param","code"}}. */
static void check_error(cJSON *j, int status, const char *type, const char *msg_part) {
    cJSON *e = cJSON_GetObjectItem(j, "error");
    CHECK_EQ_INT(R.status, status);
    CHECK(e != NULL);
    if (!e) return;
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(e, "type")), type);
    CHECK_EQ_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(e, "code")), status);
    CHECK(cJSON_GetObjectItem(e, "param") != NULL);
    CHECK_CONTAINS(cJSON_GetStringValue(cJSON_GetObjectItem(e, "message")), msg_part);
}

int main(void) {
    dsv4_server_opts o;
    dsv4_server_opts_default(&o);
    o.api_keys[0] = "sk-one";
    o.api_keys[1] = "sk-two";
    o.n_api_keys = 2;
    o.served_names[1] = "alias";
    o.n_served_names = 2;
    o.max_model_len = 4096;
    dsv4_router *rt = dsv4_router_create(&o);
    cJSON *j;

    /* /health is open and 503 until ready, then 200 */
    j = call(rt, "GET", "/health", NULL, NULL);
    check_error(j, 503, "ServiceUnavailableError", "loading");
    cJSON_Delete(j);
    /* so is /v1/models: its context length is only known once the model is loaded */
    j = call(rt, "GET", "/v1/models", "Bearer sk-two", NULL);
    check_error(j, 503, "ServiceUnavailableError", "loading");
    cJSON_Delete(j);
    dsv4_router_set_ready(rt, 1, "");
    j = call(rt, "GET", "/health", NULL, NULL);
    CHECK_EQ_INT(R.status, 200);
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(j, "status")), "ok");
    cJSON_Delete(j);

    /* auth: every other route needs one of the keys */
    j = call(rt, "GET", "/v1/models", NULL, NULL);
    check_error(j, 401, "UnauthorizedError", "API key");
    cJSON_Delete(j);
    j = call(rt, "GET", "/v1/models", "Bearer sk-on", NULL); /* a prefix of a key */
    check_error(j, 401, "UnauthorizedError", "API key");
    cJSON_Delete(j);
    j = call(rt, "GET", "/v1/models", "Bearer sk-one2", NULL);
    CHECK_EQ_INT(R.status, 401);
    cJSON_Delete(j);
    j = call(rt, "GET", "/v1/models", "sk-two", NULL); /* no Bearer */
    CHECK_EQ_INT(R.status, 401);
    cJSON_Delete(j);
    j = call(rt, "GET", "/v1/models", "Bearer sk-two", NULL);
    CHECK_EQ_INT(R.status, 200);
    cJSON *data = cJSON_GetObjectItem(j, "data");
    CHECK_EQ_INT(cJSON_GetArraySize(data), 2);
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 0), "id")),
              "deepseek-v4-flash-dspark");
    CHECK_EQ_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 1), "max_model_len")), 4096);
    cJSON_Delete(j);
    j = call(rt, "GET", "/v1/models/alias", "Bearer sk-one", NULL);
    CHECK_EQ_INT(R.status, 200);
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(j, "id")), "alias");
    cJSON_Delete(j);
    j = call(rt, "GET", "/v1/models/nope", "Bearer sk-one", NULL);
    check_error(j, 404, "NotFoundError", "Available: deepseek-v4-flash-dspark, alias");
    cJSON_Delete(j);

    /* routes and methods */
    j = call(rt, "GET", "/v1/unknown", "Bearer sk-one", NULL);
    check_error(j, 404, "NotFoundError", "/v1/unknown");
    cJSON_Delete(j);
    j = call(rt, "GET", "/v1/chat/completions", "Bearer sk-one", NULL);
    check_error(j, 405, "MethodNotAllowedError", "POST");
    cJSON_Delete(j);

    /* body validation before anything reaches the engine */
    const char *A = "Bearer sk-one";
    j = call(rt, "POST", "/v1/chat/completions", A, "{\"messages\": [1, 2,}");
    check_error(j, 400, "BadRequestError", "invalid JSON");
    CHECK_CONTAINS(R.body, "line 1, column");
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "{\"messages\": []} xyz");
    check_error(j, 400, "BadRequestError", "unexpected data after the JSON object");
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "{\"model\":\"alias\"} \r\n");
    CHECK(R.status != 400); /* trailing whitespace is fine */
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "");
    check_error(j, 400, "BadRequestError", "empty");
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "[1,2]");
    check_error(j, 400, "BadRequestError", "JSON object");
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "{\"model\":\"x\xff\"}");
    check_error(j, 400, "BadRequestError", "UTF-8");
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "{\"model\":\"\xed\xa0\x80\"}"); /* surrogate */
    check_error(j, 400, "BadRequestError", "UTF-8");
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "{\"model\":\"gpt-4\",\"messages\":[]}");
    check_error(j, 404, "NotFoundError", "The model `gpt-4` does not exist");
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "param")), "model");
    cJSON_Delete(j);
    j = call(rt, "POST", "/v1/chat/completions", A, "{\"model\":7}");
    check_error(j, 400, "BadRequestError", "must be a string");
    cJSON_Delete(j);

    /* not ready -> 503 on generation routes */
    dsv4_router_set_ready(rt, 0, "warming up");
    j = call(rt, "POST", "/v1/completions", A, "{\"prompt\":\"hi\"}");
    check_error(j, 503, "ServiceUnavailableError", "warming up");
    cJSON_Delete(j);

    /* no keys configured: everything open */
    dsv4_server_opts o2;
    dsv4_server_opts_default(&o2);
    dsv4_router *rt2 = dsv4_router_create(&o2);
    dsv4_router_set_ready(rt2, 1, "");
    j = call(rt2, "GET", "/v1/models", NULL, NULL);
    CHECK_EQ_INT(R.status, 200);
    cJSON_Delete(j);
    dsv4_router_free(rt2);

    /* serve flags: vLLM names, both spellings, multi-value, ignored flags, errors */
    dsv4_serve_args a;
    dsv4_err err = {0};
    char *argv1[] = {"serve", "/m", "--served-model-name", "a", "b", "--port=9000", "--host", "0.0.0.0",
                     "--tokenizer-mode", "deepseek_v4", "--enable-auto-tool-choice", "--max-model-len",
                     "65536", "--api-key", "k1", "k2", "--no-enable-prefix-caching", "-tp", "2"};
    CHECK_EQ_INT(dsv4_serve_args_parse(19, argv1, &a, &err), 0);
    CHECK_STR(a.model_dir, "/m");
    CHECK_EQ_INT(a.http.n_served_names, 2);
    CHECK_STR(a.http.served_names[1], "b");
    CHECK_EQ_INT(a.http.port, 9000);
    CHECK_STR(a.http.host, "0.0.0.0");
    CHECK_EQ_INT(a.http.max_model_len, 65536);
    CHECK_EQ_INT(a.http.n_api_keys, 2);
    CHECK_EQ_INT(a.enable_prefix_caching, 0);
    CHECK_EQ_INT(a.tensor_parallel_size, 2);
    CHECK_EQ_INT(a.n_ignored, 2);
    char *argv2[] = {"serve", "--bogus"};
    CHECK_EQ_INT(dsv4_serve_args_parse(2, argv2, &a, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "--bogus");
    char *argv3[] = {"serve", "--port", "99999"};
    CHECK_EQ_INT(dsv4_serve_args_parse(3, argv3, &a, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "--port");
    char *argv4[] = {"serve", "--kv-cache-dtype", "int3"};
    CHECK_EQ_INT(dsv4_serve_args_parse(3, argv4, &a, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "fp8_ds_mla");
    char *argv5[] = {"serve", "--max-model-len"};
    CHECK_EQ_INT(dsv4_serve_args_parse(2, argv5, &a, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "needs a value");
    char *argv7[] = {"serve", "--bogus", "--help"}; /* errors win over a later --help */
    CHECK_EQ_INT(dsv4_serve_args_parse(3, argv7, &a, &err), DSV4_EINVAL);
    char *argv8[] = {"serve", "--help"};
    CHECK_EQ_INT(dsv4_serve_args_parse(2, argv8, &a, &err), 0);
    CHECK_EQ_INT(a.help_shown, 1);
    char *argv6[] = {"serve"};
    CHECK_EQ_INT(dsv4_serve_args_parse(1, argv6, &a, &err), 0);
    CHECK_EQ_INT(a.help_shown, 0);
    CHECK_STR(a.http.host, "127.0.0.1");
    CHECK_EQ_INT(a.http.port, 8888);
    CHECK_STR(a.http.served_names[0], "deepseek-v4-flash-dspark");
    CHECK_STR(a.device, "auto");
    char *argv9[] = {"serve", "--device", "cuda"};
    CHECK_EQ_INT(dsv4_serve_args_parse(3, argv9, &a, &err), 0);
    CHECK_STR(a.device, "cuda");
    /* --max-model-len: not given = the model's maximum (max_model_len_given 0); auto / -1 = fit (vLLM) */
    CHECK_EQ_INT(a.max_model_len_given, 0);
    CHECK_EQ_INT(a.max_model_len_auto, 0);
    char *argv11[] = {"serve", "--max-model-len", "auto"};
    CHECK_EQ_INT(dsv4_serve_args_parse(3, argv11, &a, &err), 0);
    CHECK_EQ_INT(a.max_model_len_auto, 1);
    char *argv12[] = {"serve", "--max-model-len=-1"};
    CHECK_EQ_INT(dsv4_serve_args_parse(2, argv12, &a, &err), 0);
    CHECK_EQ_INT(a.max_model_len_auto, 1);
    char *argv13[] = {"serve", "--max-model-len", "-2"};
    CHECK_EQ_INT(dsv4_serve_args_parse(3, argv13, &a, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "--max-model-len");
    char *argv10[] = {"serve", "--device=tpu"};
    CHECK_EQ_INT(dsv4_serve_args_parse(2, argv10, &a, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "--device");

    dsv4_reply_free(&R);
    dsv4_router_free(rt);
    return TEST_REPORT();
}
