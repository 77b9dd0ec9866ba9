/*
 * text/encoder_json.h — JSON text exactly as Python's
 * json.dumps(value, ensure_ascii=False) writes it (spec/SERVING.md §1.6).
 *
 * Why: the encoder serialises tool schemas, non-string tool arguments and
 * response_format with Python's json module; the C server must reproduce it
 * byte for byte or prompt_tokens and the model's view of the tools differ.
 *
 * Rules: separators ", " and ": "; no indentation; object keys in received
 * order, a duplicated key keeps its first position and its last value (as
 * json.loads builds a dict); strings escape only '"', '\\' and C0 controls
 * (\n \r \t \b \f, others \u00xx), never '/', DEL, non-ASCII or U+2028/9;
 * numbers: integral values within 2^53 print as integers, others with
 * Python float repr (shortest round-trip, exponent form "1e-05"/"1e+16" when
 * the exponent is < -4 or >= 16, "inf"-like values as Infinity/NaN).
 * Known limit: cJSON keeps only a double, so a float written by the client
 * with an integral value ("1.0", "1e5") prints as "1"/"100000" where Python
 * prints "1.0"/"100000.0", and integers beyond 2^53 lose precision.
 */
#ifndef DSV4_TEXT_ENCODER_JSON_H
#define DSV4_TEXT_ENCODER_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Growable byte buffer; oom is sticky (check once at the end). */
typedef struct dsv4_sbuf {
    char *p;
    size_t len, cap;
    int oom;
} dsv4_sbuf;

void dsv4_sbuf_put(dsv4_sbuf *b, const char *s, size_t n);
void dsv4_sbuf_puts(dsv4_sbuf *b, const char *s);
void dsv4_sbuf_free(dsv4_sbuf *b);

/* Append the Python json.dumps(ensure_ascii=False) text of v to b. */
void dsv4_pyjson_dump(const cJSON *v, dsv4_sbuf *b);

/* Python repr() of a finite or non-finite double, e.g. "0.1", "1e-05", "1e+16". */
void dsv4_pyjson_float(double d, char *out, size_t cap);

#endif
