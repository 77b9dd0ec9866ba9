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
 * cJSON keeps only a double per number, so on its own a float written with
 * an integral value ("1.0", "1e5") would print as "1"/"100000" where Python
 * prints "1.0"/"100000.0", and integers beyond 2^53 would lose digits. A
 * dsv4_json_numbers table, built from the raw JSON text the tree was parsed
 * from, restores Python's text for every number node (see below).
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

/*
 * Python's text for each number node of a parsed tree (int literal -> its
 * digits, "-0" -> "0"; float literal, i.e. with '.', 'e' or 'E' -> repr of
 * the double). Build it from the exact text given to cJSON_Parse*: number
 * tokens in the text and number nodes in the tree are matched in document
 * order. Entries are keyed by node address (the tree must outlive the
 * table and not be modified).
 */
typedef struct dsv4_json_numbers {
    struct dsv4_json_num *e; /* sorted by node address */
    size_t n;
} dsv4_json_numbers;

/* Returns 0, or DSV4_EINVAL when text and tree do not match (the table is
 * then empty and numbers fall back to the double), DSV4_ENOMEM. */
int dsv4_json_numbers_build(const cJSON *root, const char *text, size_t len, dsv4_json_numbers *out);
void dsv4_json_numbers_free(dsv4_json_numbers *t);

/* Append the Python json.dumps(ensure_ascii=False) text of v to b; nums
 * (may be NULL) gives exact text for the number nodes it knows. */
void dsv4_pyjson_dump(const cJSON *v, const dsv4_json_numbers *nums, dsv4_sbuf *b);

/* Python repr() of a finite or non-finite double, e.g. "0.1", "1e-05", "1e+16". */
void dsv4_pyjson_float(double d, char *out, size_t cap);

#endif
