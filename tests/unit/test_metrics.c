/* Prometheus metrics: vLLM names, label order, histograms (spec/SERVING.md §3.9). */
#include <stdlib.h>

#include "server/metrics.h"
#include "test.h"

int main(void) {
    dsv4_metrics *m = dsv4_metrics_create("dsv4-test", 5);
    dsv4_engine_stats st;
    memset(&st, 0, sizeof st);
    st.running = 2;
    st.prompt_tokens = 1234;
    st.generation_tokens = 99;
    st.spec_drafts = 10;
    st.spec_draft_tokens = 50;
    st.spec_accepted_tokens = 31;
    st.spec_accepted_per_pos[0] = 9;
    st.spec_accepted_per_pos[4] = 2;
    st.spec_draft_per_pos[0] = 10;
    st.spec_draft_per_pos[4] = 7;
    st.spec_draft_seconds = 1.5;
    st.spec_verify_seconds = 2.25;
    dsv4_metrics_observe_request(m, 0.03, 1.5, 0.0005, 12, 40, 64, "stop");
    dsv4_metrics_observe_request(m, -1, 70, 0.2, 5000, 1, 1, "length");
    dsv4_metrics_observe_request(m, 0.5, 2, 0.1, 12, 3, 8, "tool_calls");
    char *t = dsv4_metrics_render(m, &st);
    CHECK(t != NULL);
    CHECK_CONTAINS(t, "vllm:num_requests_running{model_name=\"dsv4-test\",engine=\"0\"} 2\n");
    CHECK_CONTAINS(t, "vllm:prompt_tokens_total{model_name=\"dsv4-test\",engine=\"0\"} 1234\n");
    CHECK_CONTAINS(t, "vllm:generation_tokens_total{model_name=\"dsv4-test\",engine=\"0\"} 99\n");
    CHECK_CONTAINS(t, "vllm:spec_decode_num_accepted_tokens_total{model_name=\"dsv4-test\",engine=\"0\"} 31\n");
    CHECK_CONTAINS(t, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"dsv4-test\",engine=\"0\","
                      "position=\"0\"} 9\n");
    CHECK_CONTAINS(t, "position=\"4\"} 2\n");
    CHECK(strstr(t, "position=\"5\"") == NULL);
    CHECK_CONTAINS(t, "dsv4:spec_decode_num_draft_tokens_per_pos_total{model_name=\"dsv4-test\",engine=\"0\","
                      "position=\"4\"} 7\n");
    CHECK_CONTAINS(t, "dsv4:spec_decode_draft_seconds_total{model_name=\"dsv4-test\",engine=\"0\"} 1.5\n");
    CHECK_CONTAINS(t, "dsv4:spec_decode_verify_seconds_total{model_name=\"dsv4-test\",engine=\"0\"} 2.25\n");
    CHECK_CONTAINS(t, "vllm:request_success_total{model_name=\"dsv4-test\",engine=\"0\",finished_reason=\"stop\"} 2\n");
    CHECK_CONTAINS(t, "finished_reason=\"length\"} 1\n");
    /* TTFT: 0.03 and 0.5 observed (-1 = none): cumulative buckets */
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{model_name=\"dsv4-test\",engine=\"0\",le=\"0.02\"} 0\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{model_name=\"dsv4-test\",engine=\"0\",le=\"0.04\"} 1\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_bucket{model_name=\"dsv4-test\",engine=\"0\",le=\"+Inf\"} 2\n");
    CHECK_CONTAINS(t, "vllm:time_to_first_token_seconds_count{model_name=\"dsv4-test\",engine=\"0\"} 2\n");
    /* e2e 70 s lands only in +Inf */
    CHECK_CONTAINS(t, "vllm:e2e_request_latency_seconds_bucket{model_name=\"dsv4-test\",engine=\"0\",le=\"60\"} 2\n");
    CHECK_CONTAINS(t, "vllm:e2e_request_latency_seconds_bucket{model_name=\"dsv4-test\",engine=\"0\",le=\"+Inf\"} 3\n");
    CHECK(strstr(t, "_created") == NULL);
    /* every sample line starts with a metric name followed by the model_name label first */
    int bad = 0;
    for (char *line = t; *line; line = strchr(line, '\n') + 1) {
        if (*line != '#') {
            char *brace = strchr(line, '{');
            bad += !brace || strncmp(brace, "{model_name=\"dsv4-test\",engine=\"0\"", 34) != 0;
        }
        if (!strchr(line, '\n')) break;
    }
    CHECK_EQ_INT(bad, 0);
    free(t);
    /* speculation off: the spec counters still exist, at 0 */
    dsv4_metrics *m0 = dsv4_metrics_create("x", 0);
    t = dsv4_metrics_render(m0, NULL);
    CHECK_CONTAINS(t, "vllm:spec_decode_num_drafts_total{model_name=\"x\",engine=\"0\"} 0\n");
    CHECK_CONTAINS(t, "vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted");
    CHECK_CONTAINS(t, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"x\",engine=\"0\","
                      "position=\"4\"} 0\n"); /* present at 0 over the block of 5, SERVING §9 item 19 */
    CHECK_CONTAINS(t, "dsv4:spec_decode_draft_seconds_total{model_name=\"x\",engine=\"0\"} 0\n");
    free(t);
    dsv4_metrics_free(m0);
    dsv4_metrics_free(m);
    return TEST_REPORT();
}
