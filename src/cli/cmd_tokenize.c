/*
 * dsv4 tokenize — print token ids for text, or text for ids, with a model's
 * tokenizer.json (spec/SERVING.md §1.1-1.2). A debugging aid: what the
 * server would feed the model for a string, and what ids mean.
 *
 * Why no fallback to the Python package's tokenizer.json: nothing is looked
 * up or fetched at run time (PREAMBLE rules); scripts/setup.sh places the
 * tokenizer in the embedded default model, or the user names one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "text/encoder.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 tokenize [MODEL_DIR | --tokenizer FILE] [--ids] [--no-special]\n"
            "                     [--no-add-special-tokens] TEXT...\n"
            "       dsv4 tokenize [MODEL_DIR | --tokenizer FILE] [--skip-special] --decode IDS\n"
            "\n"
            "Print the token ids of TEXT (several TEXT arguments are joined with one space;\n"
            "'-' reads the text from stdin; options may also follow TEXT; put -- before TEXT\n"
            "that starts with '-': every argument after -- is text), or the\n"
            "text of IDS (comma- or space-separated; '-' reads them from stdin). The ids are\n"
            "those the server's POST /tokenize gives for {\"prompt\": TEXT}: BOS first.\n"
            "\n"
            "  MODEL_DIR          use MODEL_DIR/tokenizer.json, as serve/run/check take it: the\n"
            "                     first argument, when it names a directory (default: the\n"
            "                     embedded default model, %s)\n"
            "  --model DIR        the same as MODEL_DIR\n"
            "  --tokenizer FILE   use this tokenizer.json\n"
            "  --ids              print only the ids, comma-separated on one line\n"
            "                     (default: one line per token: id, then its text)\n"
            "  --no-add-special-tokens\n"
            "                     no BOS first (/tokenize's \"add_special_tokens\": false);\n"
            "                     by default BOS is added unless TEXT starts with it\n"
            "  --no-special       tokenize special-token text (<｜User｜>, </think>, ...) as\n"
            "                     ordinary text, as the server does for client content\n"
            "                     (default: it becomes the special id, as for encoder output)\n"
            "  --decode IDS       print the text of IDS instead\n"
            "  --skip-special     with --decode: drop special tokens (BOS, EOS, ...)\n"
            "  --batch-hex        for scripts and tests: read lines of hex-encoded text bytes\n"
            "                     from stdin; print per line the comma-separated ids (the\n"
            "                     tokenizer's alone: no BOS), a tab, and the hex of\n"
            "                     decode(ids); with --stats, print encode time and\n"
            "                     throughput to stderr\n",
            dsv4_default_model_dir());
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            char *nb = realloc(b, cap * 2);
            if (!nb) { free(b); return NULL; }
            b = nb;
            cap *= 2;
        }
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* Print bytes with control characters and invalid UTF-8 escaped. */
static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else if (c < 0x80) putchar(c);
        else {
            size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0, k = 1;
            while (l && k < l && i + k < n && ((unsigned char)s[i + k] & 0xC0) == 0x80) k++;
            if (l && k == l) { fwrite(s + i, 1, l, stdout); i += l - 1; }
            else printf("\\x%02x", c);
        }
    }
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* --batch-hex: one case per stdin line (hex of the text's bytes). Encode time
 * is measured around dsv4_tokenizer_encode only (not load, not I/O). */
static int batch_hex(dsv4_tokenizer *tok, int allow_special, int stats) {
    size_t len;
    char *all = read_all(stdin, &len);
    if (!all) { fprintf(stderr, "dsv4 tokenize: cannot read stdin\n"); return 1; }
    double enc_s = 0;
    size_t bytes = 0, tokens = 0;
    int status = 0;
    dsv4_err err = {0};
    for (char *line = all, *next; line && *line && !status; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t hl = strcspn(line, "\r"), n = hl / 2;
        char *text = malloc(n + 1);
        if (!text) { status = 1; break; }
        for (size_t i = 0; i < n; i++) {
            int hi = hexval(line[2 * i]), lo = hexval(line[2 * i + 1]);
            if (hi < 0 || lo < 0 || hl % 2) { fprintf(stderr, "dsv4 tokenize: --batch-hex: bad hex\n"); status = 2; break; }
            text[i] = (char)(hi * 16 + lo);
        }
        dsv4_tokvec v = {0};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (!status && dsv4_tokenizer_encode(tok, text, n, allow_special, &v, &err)) {
            fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
            status = 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        enc_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        bytes += n;
        tokens += v.n;
        char *out = NULL;
        size_t ol = 0;
        if (!status && dsv4_tokenizer_decode(tok, v.ids, v.n, 0, &out, &ol, &err)) {
            fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
            status = 1;
        }
        if (!status) {
            for (size_t i = 0; i < v.n; i++) printf(i ? ",%d" : "%d", (int)v.ids[i]);
            putchar('\t');
            for (size_t i = 0; i < ol; i++) printf("%02x", (unsigned char)out[i]);
            putchar('\n');
        }
        free(out);
        free(text);
        dsv4_tokvec_free(&v);
    }
    free(all);
    if (stats && !status)
        fprintf(stderr, "encode: %zu bytes -> %zu tokens in %.6f s: %.0f tokens/s, %.2f MB/s\n", bytes, tokens, enc_s,
                enc_s > 0 ? (double)tokens / enc_s : 0.0, enc_s > 0 ? (double)bytes / enc_s / 1e6 : 0.0);
    return status;
}

static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) { free(v); return -1; }
        if (k == cap) {
            int32_t *nv = realloc(v, cap * 2 * sizeof *nv);
            if (!nv) { free(v); return -1; }
            v = nv;
            cap *= 2;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int dsv4_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *decode = NULL;
    int ids_only = 0, no_special = 0, skip_special = 0, batch = 0, stats = 0, add_special = 1;
    /* TEXT arguments in order. Options are read wherever they stand, before or after TEXT
     * (`dsv4 tokenize DIR "Hello" --ids`, as vLLM-style command lines put them); only
     * arguments after -- are text whatever they look like. */
    int n_text = 0, dashdash = 0;
    const char **texts = calloc((size_t)argc + 1, sizeof *texts);
    if (!texts) { fprintf(stderr, "dsv4 tokenize: out of memory\n"); return 1; }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (dashdash) { texts[n_text++] = a; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { free(texts); usage(stdout); return 0; }
        else if (!strcmp(a, "--model") && i + 1 < argc) {
            if (model) { fprintf(stderr, "dsv4 tokenize: the model directory is given twice\n"); free(texts); return 2; }
            model = argv[++i];
        }
        else if (!strcmp(a, "--tokenizer") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(a, "--decode") && i + 1 < argc) decode = argv[++i];
        else if (!strcmp(a, "--ids")) ids_only = 1;
        else if (!strcmp(a, "--no-special")) no_special = 1;
        else if (!strcmp(a, "--no-add-special-tokens")) add_special = 0;
        else if (!strcmp(a, "--skip-special")) skip_special = 1;
        else if (!strcmp(a, "--batch-hex")) batch = 1;
        else if (!strcmp(a, "--stats")) stats = 1;
        else if (!strcmp(a, "--")) dashdash = 1;
        else if (!strcmp(a, "--model") || !strcmp(a, "--tokenizer") || !strcmp(a, "--decode")) {
            fprintf(stderr, "dsv4 tokenize: %s needs a value\n", a); /* the last argument: the others took theirs */
            free(texts);
            return 2;
        }
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dsv4 tokenize: unknown or incomplete option %s (put -- before TEXT that starts with '-')\n",
                    a);
            usage(stderr);
            free(texts);
            return 2;
        }
        /* The positional model directory of serve/run/check: the first
         * non-option argument, when it names a directory and no model or
         * tokenizer was named yet; options may follow it. */
        else if (!n_text && !model && !file && is_dir(a)) model = a;
        else texts[n_text++] = a;
    }
    if (model && file) {
        fprintf(stderr, "dsv4 tokenize: give MODEL_DIR (or --model) or --tokenizer, not both\n");
        free(texts);
        return 2;
    }
    if (!decode && !batch && !n_text) { usage(stderr); free(texts); return 2; }
    if (decode && n_text) {
        fprintf(stderr, "dsv4 tokenize: --decode takes no TEXT (got '%s')\n", texts[0]);
        free(texts);
        return 2;
    }

    int status = 0;
    char *text = NULL;
    size_t tl = 0;
    dsv4_tokenizer *tok = NULL;
    char path[4096];
    if (file) snprintf(path, sizeof path, "%s", file);
    else snprintf(path, sizeof path, "%s/tokenizer.json", model ? model : dsv4_default_model_dir());
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        if (!file && !model)
            fprintf(stderr,
                    "dsv4 tokenize: the default model has no tokenizer (%s: %s); run scripts/setup.sh or pass "
                    "--tokenizer FILE / MODEL_DIR\n", path, strerror(errno));
        else fprintf(stderr, "dsv4 tokenize: %s: %s\n", path, strerror(errno));
        status = 1;
        goto done;
    }
    fclose(probe);
    dsv4_err err = {0};
    if (dsv4_tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
        status = 1;
        goto done;
    }

    if (batch) {
        status = batch_hex(tok, !no_special, stats);
        goto done;
    }
    if (decode) {
        char *src = NULL;
        size_t srclen;
        if (!strcmp(decode, "-") && !(src = read_all(stdin, &srclen))) {
            fprintf(stderr, "dsv4 tokenize: cannot read stdin\n");
            status = 1;
            goto done;
        }
        int32_t *ids;
        size_t n;
        if (parse_ids(src ? src : decode, &ids, &n)) {
            fprintf(stderr, "dsv4 tokenize: --decode: expected non-negative integers separated by commas\n");
            status = 2;
        } else {
            char *text;
            size_t tl;
            if (dsv4_tokenizer_decode(tok, ids, n, skip_special, &text, &tl, &err)) {
                fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
                status = 1;
            } else {
                fwrite(text, 1, tl, stdout);
                putchar('\n');
                free(text);
            }
            free(ids);
        }
        free(src);
        goto done;
    }

    /* Gather the text: args joined by one space; "-" is stdin. */
    for (int i = 0; i < n_text; i++) {
        const char *piece = texts[i];
        char *in = NULL;
        size_t pl;
        if (!strcmp(piece, "-")) {
            if (!(in = read_all(stdin, &pl))) { status = 1; break; }
            piece = in;
        } else {
            pl = strlen(piece);
        }
        char *nt = realloc(text, tl + pl + 2);
        if (!nt) { free(in); status = 1; break; }
        text = nt;
        if (i > 0) text[tl++] = ' ';
        memcpy(text + tl, piece, pl);
        tl += pl;
        text[tl] = 0;
        free(in);
    }
    if (status) {
        fprintf(stderr, "dsv4 tokenize: out of memory or cannot read stdin\n");
    } else {
        dsv4_tokvec v = {0};
        if (dsv4_text_prompt_tokenize(tok, text, tl, !no_special, add_special, &v, &err)) {
            fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
            status = 1;
        } else if (ids_only) {
            for (size_t i = 0; i < v.n; i++) printf(i ? ",%d" : "%d", (int)v.ids[i]);
            putchar('\n');
        } else {
            for (size_t i = 0; i < v.n; i++) {
                size_t bl;
                const char *b = dsv4_tokenizer_token_bytes(tok, v.ids[i], &bl);
                printf("%d\t", (int)v.ids[i]);
                print_escaped(b, bl);
                printf(dsv4_tokenizer_is_added(tok, v.ids[i]) ? "\t(added%s)\n" : "\n",
                       dsv4_tokenizer_is_special(tok, v.ids[i]) ? ", special" : "");
            }
            printf("%zu tokens\n", v.n);
        }
        dsv4_tokvec_free(&v);
    }
done:
    free(text);
    free(texts);
    if (tok) dsv4_tokenizer_free(tok);
    return status;
}
