/*
 * Test helper: write small safetensors files (8-byte LE header length, JSON
 * header, data) from C, so loader tests build their own inputs and their own
 * corrupted variants. Header-only; used by tests/unit/test_safetensors.c.
 */
#ifndef DSV4_TEST_ST_WRITE_H
#define DSV4_TEST_ST_WRITE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stw_tensor {
    const char *name, *dtype;
    int ndim;
    int64_t shape[4];
    size_t nbytes;
    uint8_t fill; /* data bytes are fill, fill+1, ... */
} stw_tensor;

/* Build a file image in memory: tensors laid out in the order given. Returns
 * malloc'd bytes and *size. */
static uint8_t *stw_build(const stw_tensor *t, int n, size_t *size) {
    char *hdr = malloc(65536);
    size_t hl = 0, off = 0;
    hl += (size_t)sprintf(hdr + hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        hl += (size_t)sprintf(hdr + hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            hl += (size_t)sprintf(hdr + hl, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        hl += (size_t)sprintf(hdr + hl, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    hdr[hl++] = '}';
    while (hl % 8) hdr[hl++] = ' ';
    *size = 8 + hl + off;
    uint8_t *buf = malloc(*size);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    size_t at = 8 + hl;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < t[i].nbytes; k++) buf[at++] = (uint8_t)(t[i].fill + k);
    free(hdr);
    return buf;
}

/* Image with a raw header text (for hand-made malformed headers) and
 * data_len data bytes. */
static uint8_t *stw_raw(const char *json, size_t data_len, size_t *size) {
    size_t hl = strlen(json);
    *size = 8 + hl + data_len;
    uint8_t *buf = calloc(1, *size);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    return buf;
}

static int stw_save(const char *path, const void *buf, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(buf, 1, size, f);
    fclose(f);
    return w == size ? 0 : -1;
}

static int stw_save_text(const char *path, const char *text) {
    return stw_save(path, text, strlen(text));
}
#endif
