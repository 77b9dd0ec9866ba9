/*
 * `dsv4 perf` on the tiny checkpoint, CPU backend, one step per shape: the
 * table has one line per (rows, batch) with T = batch·rows, a positive step
 * time, and a roofline column equal to the step-bytes model's total / 4.58
 * TB/s (the CPU's default; --hbm-tbps X: / X TB/s), once with every row's logits read back (out=full: T·vocab·4 bytes)
 * and once with the greedy ids only (out=ids: T·4 bytes); bad arguments are
 * refused with exit 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/step_bytes.h"
#include "test.h"

/* Run dsv4 perf with stdout captured into buf. */
static int run_perf(char **argv, int argc, char *buf, size_t cap) {
    char path[] = "/tmp/dsv4_perf_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -100;
    fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    int rc = dsv4_cmd_perf(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    return rc;
}

int main(void) {
    static char out[16384];
    char *argv[] = {"perf", "models/tiny-flash", "--device", "cpu", "--batch", "1,2", "--rows-per-seq", "1,3",
                    "--context", "20", "--steps", "1", "--warmup", "0"};
    int rc = run_perf(argv, (int)(sizeof argv / sizeof argv[0]), out, sizeof out);
    CHECK_EQ_INT(rc, 0);
    fputs(out, stderr);
    dsv4_config cfg;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_config_load("models/tiny-flash", &cfg, &err), 0);
    int want[4][2] = {{1, 1}, {2, 1}, {1, 3}, {2, 3}}, seen = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int B, R, T;
        double ms, tps, gb, roof, ratio, d2h;
        char mode[8];
        if (sscanf(line, "%d %d %d %lf %lf %lf %lf %lf %lf %7s", &B, &R, &T, &ms, &tps, &gb, &roof, &ratio, &d2h,
                   mode) != 10)
            continue;
        CHECK(seen < 8);
        if (seen >= 8) break;
        CHECK_EQ_INT(B, want[seen / 2][0]);
        CHECK_EQ_INT(R, want[seen / 2][1]);
        CHECK_STR(mode, seen % 2 ? "ids" : "full");
        CHECK_NEAR(d2h, (double)T * (seen % 2 ? 4.0 : 4.0 * cfg.vocab_size) / 1e6, 1e-4);
        CHECK_EQ_INT(T, B * R);
        CHECK(ms > 0);
        dsv4_step_bytes sb;
        CHECK_EQ_INT(dsv4_step_bytes_compute(&cfg, B, R, 20, 4, &sb, &err), 0);
        CHECK_NEAR(roof, sb.total / 4.58e12 * 1e3, 1e-5 * roof);
        CHECK_NEAR(ratio, ms / (sb.total / 4.58e12 * 1e3), 0.01 * ratio + 0.01);
        seen++;
    }
    CHECK_EQ_INT(seen, 8);
    /* --logits ids: only the ids lines */
    char *argv2[] = {"perf", "models/tiny-flash", "--device", "cpu", "--batch", "2", "--rows-per-seq", "3",
                     "--context", "20", "--steps", "1", "--warmup", "0", "--logits", "ids"};
    CHECK_EQ_INT(run_perf(argv2, (int)(sizeof argv2 / sizeof argv2[0]), out, sizeof out), 0);
    CHECK_CONTAINS(out, " ids\n");
    CHECK(!strstr(out, " full\n"));
    /* --hbm-tbps: the roofline column is the step's bytes at that bandwidth, and the header says so */
    char *argv3[] = {"perf", "models/tiny-flash", "--device", "cpu", "--batch", "2", "--rows-per-seq", "3", "--context",
                     "20", "--steps", "1", "--warmup", "0", "--logits", "ids", "--hbm-tbps", "2.5"};
    CHECK_EQ_INT(run_perf(argv3, (int)(sizeof argv3 / sizeof argv3[0]), out, sizeof out), 0);
    CHECK_CONTAINS(out, "/ 2.50 TB/s (--hbm-tbps)");
    {
        int n3 = 0;
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
            int B, R, T;
            double ms, tps, gb, roof, ratio, d2h;
            if (sscanf(line, "%d %d %d %lf %lf %lf %lf %lf %lf", &B, &R, &T, &ms, &tps, &gb, &roof, &ratio, &d2h) != 9)
                continue;
            dsv4_step_bytes sb;
            CHECK_EQ_INT(dsv4_step_bytes_compute(&cfg, B, R, 20, 4, &sb, &err), 0);
            CHECK_NEAR(roof, sb.total / 2.5e12 * 1e3, 1e-5 * roof);
            n3++;
        }
        CHECK_EQ_INT(n3, 1);
    }
    char *bad5[] = {"perf", "models/tiny-flash", "--hbm-tbps", "0"};
    CHECK_EQ_INT(run_perf(bad5, 4, out, sizeof out), 2);
    char *bad4[] = {"perf", "models/tiny-flash", "--logits", "some"};
    CHECK_EQ_INT(run_perf(bad4, 4, out, sizeof out), 2);
    /* chunked prefill: 100 tokens in chunks of 32 = 4 chunks; 37 tokens = 2 chunks; rate = tokens / total */
    char *pf[] = {"perf", "models/tiny-flash", "--device", "cpu", "--batch", "1", "--rows-per-seq", "1", "--steps",
                  "1", "--warmup", "0", "--prefill", "100,37", "--prefill-chunk", "32"};
    CHECK_EQ_INT(run_perf(pf, (int)(sizeof pf / sizeof pf[0]), out, sizeof out), 0);
    int want_pf[2][2] = {{100, 4}, {37, 2}}, n_pf = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int total, chunks, C;
        double ms, tps;
        if (sscanf(line, "prefill %d tokens in %d chunk%*[s] of <= %d: %lf ms, %lf tokens/s", &total, &chunks, &C, &ms,
                   &tps) != 5)
            continue;
        CHECK(n_pf < 2);
        if (n_pf >= 2) break;
        CHECK_EQ_INT(total, want_pf[n_pf][0]);
        CHECK_EQ_INT(chunks, want_pf[n_pf][1]);
        CHECK_EQ_INT(C, 32);
        CHECK(ms > 0);
        CHECK_NEAR(tps, total / (ms * 1e-3), 0.01 * tps);
        n_pf++;
    }
    CHECK_EQ_INT(n_pf, 2);
    char *bad[] = {"perf", "models/tiny-flash", "--batch", "0"};
    CHECK_EQ_INT(run_perf(bad, 4, out, sizeof out), 2);
    char *bad2[] = {"perf", "models/tiny-flash", "--device", "tpu"};
    CHECK_EQ_INT(run_perf(bad2, 4, out, sizeof out), 2);
    char *bad3[] = {"perf", "models/tiny-flash", "--prefill-chunk", "0"};
    CHECK_EQ_INT(run_perf(bad3, 4, out, sizeof out), 2);
    return TEST_REPORT();
}
