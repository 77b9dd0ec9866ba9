/* Capture sizes and rows per sequence (src/engine/graph_sizes.h). */
#include "engine/graph_sizes.h"
#include "model/forward.h" /* DSV4_GRAPH_MAX_ROWS_PER_SEQ */

static int add_sorted(int *out, int n, int v) {
    int at = n;
    while (at > 0 && out[at - 1] > v) at--;
    if (at > 0 && out[at - 1] == v) return n;
    for (int i = n; i > at; i--) out[i] = out[i - 1];
    out[at] = v;
    return n + 1;
}

int dsv4_graph_sizes_resolve(const int *given, int n_given, int max_size, int max_num_seqs, int *out, int cap,
                             dsv4_err *err) {
    if (max_size < 0) return dsv4_err_set(err, DSV4_EINVAL, "max_cudagraph_capture_size %d must be >= 0", max_size), -1;
    if (max_num_seqs < 1) return dsv4_err_set(err, DSV4_EINVAL, "max_num_seqs %d", max_num_seqs), -1;
    int n = 0;
    if (n_given > 0) {
        int largest = 0;
        for (int i = 0; i < n_given; i++) {
            if (given[i] < 1)
                return dsv4_err_set(err, DSV4_EINVAL, "cudagraph_capture_sizes: %d is not a positive batch size",
                                    given[i]), -1;
            if (given[i] > largest) largest = given[i];
        }
        if (max_size > 0 && max_size != largest)
            return dsv4_err_set(err, DSV4_EINVAL,
                                "max_cudagraph_capture_size %d must equal the largest of cudagraph_capture_sizes (%d); "
                                "give one of the two", max_size, largest), -1;
        for (int i = 0; i < n_given; i++) {
            if (given[i] > max_num_seqs) continue;
            if (n == cap) return dsv4_err_set(err, DSV4_EINVAL, "cudagraph_capture_sizes: more than %d sizes", cap), -1;
            n = add_sorted(out, n, given[i]);
        }
        return n;
    }
    int mx = max_size > 0 ? max_size : (2 * max_num_seqs < 512 ? 2 * max_num_seqs : 512);
    for (int v = 1; v <= mx && v <= max_num_seqs; v = v < 4 ? 2 * v : v < 8 ? 8 : v < 256 ? v + 8 : v + 16) {
        if (n == cap) return dsv4_err_set(err, DSV4_EINVAL, "CUDA graph capture sizes: more than %d", cap), -1;
        out[n++] = v;
    }
    if (max_size == 0 && (n == 0 || out[n - 1] < max_num_seqs)) {
        if (n == cap) return dsv4_err_set(err, DSV4_EINVAL, "CUDA graph capture sizes: more than %d", cap), -1;
        out[n++] = max_num_seqs;
    }
    return n;
}

int dsv4_graph_rows_plan(int spec_k, const int (*schedule)[3], int n_schedule, int max_num_seqs, const int *sizes,
                         int n_sizes, int *rows, int *max_seqs, int cap) {
    if (cap < 1 || n_sizes < 1) return 0;
    int n = 1;
    rows[0] = 1;
    max_seqs[0] = 0; /* every size */
    for (int running = 1; running <= max_num_seqs; running++) {
        int k = spec_k; /* as dsv4_engine_step picks it */
        for (int i = 0; i < n_schedule; i++)
            if (running >= schedule[i][0] && running <= schedule[i][1]) k = schedule[i][2];
        if (k <= 0 || k + 1 > DSV4_GRAPH_MAX_ROWS_PER_SEQ) continue; /* no graph holds it: eager (forward.h) */
        int S = sizes[n_sizes - 1]; /* the size a batch of `running` sequences pads to */
        for (int i = n_sizes - 1; i >= 0 && sizes[i] >= running; i--) S = sizes[i];
        int j = 0;
        while (j < n && rows[j] != k + 1) j++;
        if (j == n) {
            if (n == cap) continue;
            rows[n] = k + 1;
            max_seqs[n++] = S;
        } else if (j > 0 && max_seqs[j] < S) {
            max_seqs[j] = S;
        }
    }
    return n;
}
