/*
 * Minimal unit-test harness: CHECK* macros count passes and failures; each
 * test program ends with TEST_REPORT(), which prints "N passed, N failed"
 * (the plain closing line CI reads) and returns the exit status.
 */
#ifndef DSV4_TEST_H
#define DSV4_TEST_H
#include <math.h>
#include <stdio.h>
#include <string.h>

static int t_pass, t_fail;

#define CHECK(cond) do { if (cond) t_pass++; else { t_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { if (cond) t_pass++; else { t_fail++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_EQ_INT(a, b) do { long long _a = (long long)(a), _b = (long long)(b); \
    if (_a == _b) t_pass++; else { t_fail++; fprintf(stderr, "%s:%d: %s == %s: %lld != %lld\n", \
    __FILE__, __LINE__, #a, #b, _a, _b); } } while (0)
#define CHECK_STR(a, b) do { const char *_a = (a), *_b = (b); \
    if (_a && _b && !strcmp(_a, _b)) t_pass++; else { t_fail++; fprintf(stderr, \
    "%s:%d: %s == %s: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a, #b, _a ? _a : "(null)", \
    _b ? _b : "(null)"); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double _a = (a), _b = (b); \
    if (fabs(_a - _b) <= (tol)) t_pass++; else { t_fail++; fprintf(stderr, \
    "%s:%d: |%s - %s| = |%g - %g| > %g\n", __FILE__, __LINE__, #a, #b, _a, _b, (double)(tol)); } } while (0)
/* A substring check, handy for error messages that must name a file or tensor. */
#define CHECK_CONTAINS(hay, needle) do { const char *_h = (hay), *_n = (needle); \
    if (_h && _n && strstr(_h, _n)) t_pass++; else { t_fail++; fprintf(stderr, \
    "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, _h ? _h : "(null)", _n ? _n : "(null)"); } } while (0)

#define TEST_REPORT() (printf("%d passed, %d failed\n", t_pass, t_fail), t_fail ? 1 : 0)
#endif
