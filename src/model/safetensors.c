/*
 * safetensors reader over mmap (model/safetensors.h; spec/MODEL.md §2.1).
 *
 * Layout of one file: u64 little-endian N, N bytes of UTF-8 JSON, then the
 * data region. The format (huggingface/safetensors, "Format" section) also
 * requires the tensors to tile the data region exactly, with no holes and no
 * overlaps; the reference library rejects files that do not, and so do we —
 * a file that passes here is one the Python `safetensors` package would read
 * byte for byte the same way, and any truncation shows up as a tensor that
 * ends past the end of the file.
 */
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a small open-addressing string -> index map ----------------------- */

typedef struct strmap {
    size_t cap;      /* power of two                         */
    uint32_t *slot;  /* index + 1, 0 = empty                 */
} strmap;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int map_init(strmap *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 1) cap <<= 1;
    m->cap = cap;
    m->slot = calloc(cap, sizeof *m->slot);
    return m->slot ? 0 : -1;
}

/* Find `name` among keys[]; returns its index or -1. */
static long map_find(const strmap *m, const char *const *keys, const char *name) {
    if (!m->slot) return -1;
    size_t mask = m->cap - 1, i = (size_t)hash_str(name) & mask;
    for (;;) {
        uint32_t s = m->slot[i];
        if (!s) return -1;
        if (!strcmp(keys[s - 1], name)) return (long)(s - 1);
        i = (i + 1) & mask;
    }
}

/* Insert index idx (keys[idx] is its name). Returns the existing index if
 * the name is already present (nothing inserted), else -1. */
static long map_insert(strmap *m, const char *const *keys, uint32_t idx) {
    size_t mask = m->cap - 1, i = (size_t)hash_str(keys[idx]) & mask;
    for (;;) {
        uint32_t s = m->slot[i];
        if (!s) {
            m->slot[i] = idx + 1;
            return -1;
        }
        if (!strcmp(keys[s - 1], keys[idx])) return (long)(s - 1);
        i = (i + 1) & mask;
    }
}

/* ---- one file ---------------------------------------------------------- */

struct dsv4_st_file {
    size_t n;
    dsv4_tview *v;
    char **names;     /* owned copies; v[i].name == names[i] */
};

void dsv4_st_free(dsv4_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free(f->names[i]);
    free(f->names);
    free(f->v);
    free(f);
}

size_t dsv4_st_count(const dsv4_st_file *f) { return f ? f->n : 0; }
const dsv4_tview *dsv4_st_at(const dsv4_st_file *f, size_t i) {
    return (f && i < f->n) ? &f->v[i] : NULL;
}

int64_t dsv4_tview_numel(const dsv4_tview *v) {
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    return n;
}

/* A JSON number that is a non-negative integer no larger than 2^53. */
static int json_u53(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double d = j->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

typedef struct range_ix {
    uint64_t b, e;
    size_t i;
} range_ix;

static int cmp_range(const void *a, const void *b) {
    const range_ix *x = a, *y = b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return 0;
}

int dsv4_st_parse(const void *buf, size_t size, const char *label, dsv4_st_file **out,
                  dsv4_err *err) {
    *out = NULL;
    const uint8_t *p = buf;
    if (!label) label = "(safetensors)";
    if (size < 8)
        return dsv4_err_set(err, DSV4_EIO, "%s: truncated: %zu bytes, no 8-byte header length",
                            label, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > size - 8)
        return dsv4_err_set(err, DSV4_EIO,
                            "%s: truncated or corrupt: header length %llu exceeds file size %zu",
                            label, (unsigned long long)hlen, size);
    if (hlen < 2)
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: corrupt header: length %llu", label,
                            (unsigned long long)hlen);
    const uint8_t *data = p + 8 + hlen;
    uint64_t dsize = size - 8 - hlen;

    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: corrupt header: not a JSON object", label);
    }
    int rc = DSV4_OK;
    size_t cap = 0;
    for (cJSON *e = root->child; e; e = e->next) cap++;
    dsv4_st_file *f = calloc(1, sizeof *f);
    range_ix *rg = NULL;
    strmap map = {0};
    if (!f || !(f->v = calloc(cap + 1, sizeof *f->v)) ||
        !(f->names = calloc(cap + 1, sizeof *f->names)) || !(rg = calloc(cap + 1, sizeof *rg)) ||
        map_init(&map, cap) != 0) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory parsing header", label);
        goto done;
    }
    for (cJSON *e = root->child; e; e = e->next) {
        const char *nm = e->string ? e->string : "";
        if (!strcmp(nm, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: __metadata__ is not an object", label);
                goto done;
            }
            continue;
        }
        if (!cJSON_IsObject(e)) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s': entry is not an object", label, nm);
            goto done;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo)) {
            rc = dsv4_err_set(err, DSV4_EFORMAT,
                              "%s: tensor '%s': missing or wrong-typed dtype/shape/data_offsets",
                              label, nm);
            goto done;
        }
        dsv4_tview v = {0};
        v.dtype = dsv4_dtype_from_name(jd->valuestring);
        if (v.dtype == DSV4_DT_INVALID) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s': unknown dtype '%.32s'", label, nm,
                              jd->valuestring);
            goto done;
        }
        int nd = cJSON_GetArraySize(js);
        if (nd > DSV4_MAX_DIMS) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s': %d dims (at most %d)", label, nm,
                              nd, DSV4_MAX_DIMS);
            goto done;
        }
        uint64_t numel = 1;
        int d = 0;
        for (const cJSON *x = js->child; x; x = x->next, d++) {
            uint64_t dim;
            if (json_u53(x, &dim) != 0 || dim > INT64_MAX ||
                __builtin_mul_overflow(numel, dim, &numel)) {
                rc = dsv4_err_set(err, DSV4_EFORMAT,
                                  "%s: tensor '%s': bad shape (negative, non-integer or overflowing dim)",
                                  label, nm);
                goto done;
            }
            v.shape[d] = (int64_t)dim;
        }
        v.ndim = nd;
        uint64_t b, en, nbytes;
        if (cJSON_GetArraySize(jo) != 2 || json_u53(jo->child, &b) != 0 ||
            json_u53(jo->child->next, &en) != 0) {
            rc = dsv4_err_set(err, DSV4_EFORMAT,
                              "%s: tensor '%s': data_offsets must be two non-negative integers",
                              label, nm);
            goto done;
        }
        if (b > en) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu",
                              label, nm, (unsigned long long)b, (unsigned long long)en);
            goto done;
        }
        if (en > dsize) {
            rc = dsv4_err_set(err, DSV4_EIO,
                              "%s: truncated: tensor '%s' ends at data byte %llu, data region has %llu",
                              label, nm, (unsigned long long)en, (unsigned long long)dsize);
            goto done;
        }
        if (__builtin_mul_overflow(numel, (uint64_t)dsv4_dtype_size(v.dtype), &nbytes) ||
            nbytes != en - b) {
            rc = dsv4_err_set(err, DSV4_EFORMAT,
                              "%s: tensor '%s': %llu bytes in data_offsets, shape x %s needs %llu",
                              label, nm, (unsigned long long)(en - b), dsv4_dtype_name(v.dtype),
                              (unsigned long long)nbytes);
            goto done;
        }
        v.data = data + b;
        v.nbytes = (size_t)nbytes;
        size_t i = f->n;
        if (!(f->names[i] = strdup(nm))) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", label);
            goto done;
        }
        v.name = f->names[i];
        f->v[i] = v;
        f->n++;
        if (map_insert(&map, (const char *const *)f->names, (uint32_t)i) >= 0) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s' appears twice in the header", label,
                              nm);
            goto done;
        }
        rg[i] = (range_ix){b, en, i};
    }
    /* The tensors must tile [0, dsize): sorted, each begins where the last
     * ended (no overlap, no hole), and the last ends at the end of the file. */
    qsort(rg, f->n, sizeof *rg, cmp_range);
    uint64_t at = 0;
    for (size_t k = 0; k < f->n; k++) {
        if (rg[k].b < at) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s' overlaps tensor '%s'", label,
                              f->names[rg[k].i], f->names[rg[k - 1].i]);
            goto done;
        }
        if (rg[k].b > at) {
            rc = dsv4_err_set(err, DSV4_EFORMAT,
                              "%s: hole in data region before tensor '%s' (bytes %llu..%llu unused)",
                              label, f->names[rg[k].i], (unsigned long long)at,
                              (unsigned long long)rg[k].b);
            goto done;
        }
        at = rg[k].e;
    }
    if (at != dsize) {
        rc = dsv4_err_set(err, DSV4_EFORMAT,
                          "%s: data region has %llu bytes but tensors cover %llu (trailing bytes)",
                          label, (unsigned long long)dsize, (unsigned long long)at);
        goto done;
    }
done:
    cJSON_Delete(root);
    free(rg);
    free(map.slot);
    if (rc != DSV4_OK) {
        dsv4_st_free(f);
        return rc;
    }
    *out = f;
    return DSV4_OK;
}

/* ---- a checkpoint directory -------------------------------------------- */

typedef struct shard {
    char *fname;        /* file name within dir */
    void *map;
    size_t size;
    dsv4_st_file *st;
} shard;

struct dsv4_ckpt {
    char *dir;
    size_t n_shards;
    shard *shards;
    size_t n;
    dsv4_tview *v;      /* all tensors, contiguous */
    const char **names; /* v[i].name */
    uint32_t *file_of;  /* shard index of v[i] */
    strmap map;
    uint64_t total_bytes;
    size_t n_copies;
    void **copies;      /* aligned copies of tensors misaligned in their file */
};

void dsv4_ckpt_free(dsv4_ckpt *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_shards; i++) {
        dsv4_st_free(c->shards[i].st);
        if (c->shards[i].map) munmap(c->shards[i].map, c->shards[i].size);
        free(c->shards[i].fname);
    }
    free(c->shards);
    free(c->v);
    free(c->names);
    free(c->file_of);
    free(c->map.slot);
    for (size_t i = 0; i < c->n_copies; i++) free(c->copies[i]);
    free(c->copies);
    free(c->dir);
    free(c);
}

const dsv4_tview *dsv4_ckpt_find(const dsv4_ckpt *c, const char *name) {
    if (!c || !name) return NULL;
    long i = map_find(&c->map, c->names, name);
    return i < 0 ? NULL : &c->v[i];
}
size_t dsv4_ckpt_count(const dsv4_ckpt *c) { return c ? c->n : 0; }
const dsv4_tview *dsv4_ckpt_at(const dsv4_ckpt *c, size_t i) {
    return (c && i < c->n) ? &c->v[i] : NULL;
}
size_t dsv4_ckpt_index_of(const dsv4_ckpt *c, const dsv4_tview *v) {
    if (!c || !v || v < c->v || v >= c->v + c->n) return (size_t)-1;
    return (size_t)(v - c->v);
}
const char *dsv4_ckpt_file_of(const dsv4_ckpt *c, const dsv4_tview *v) {
    size_t i = dsv4_ckpt_index_of(c, v);
    return i == (size_t)-1 ? "?" : c->shards[c->file_of[i]].fname;
}
const char *dsv4_ckpt_dir(const dsv4_ckpt *c) { return c ? c->dir : ""; }
size_t dsv4_ckpt_num_files(const dsv4_ckpt *c) { return c ? c->n_shards : 0; }
uint64_t dsv4_ckpt_total_bytes(const dsv4_ckpt *c) { return c ? c->total_bytes : 0; }

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Interrupted hub downloads leave "<file>.incomplete" next to the file or
 * under <dir>/.cache/huggingface/download/. */
static int check_incomplete(const char *dir, dsv4_err *err) {
    char sub[4096];
    const char *dirs[2] = {dir, sub};
    snprintf(sub, sizeof sub, "%s/.cache/huggingface/download", dir);
    for (int k = 0; k < 2; k++) {
        DIR *d = opendir(dirs[k]);
        if (!d) {
            if (k == 0)
                return dsv4_err_set(err, DSV4_EIO, "%s: cannot open directory: %s", dir,
                                    strerror(errno));
            continue;
        }
        struct dirent *de;
        while ((de = readdir(d)))
            if (ends_with(de->d_name, ".incomplete")) {
                int rc = dsv4_err_set(err, DSV4_EIO,
                                      "%s/%s: partial download (*.incomplete); finish or delete "
                                      "the download first",
                                      dirs[k], de->d_name);
                closedir(d);
                return rc;
            }
        closedir(d);
    }
    return DSV4_OK;
}

static int map_shard(const char *dir, shard *s, const char *why, dsv4_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, s->fname);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsv4_err_set(err, DSV4_EIO, "%s: shard missing or unreadable%s: %s", path, why,
                            strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dsv4_err_set(err, DSV4_EIO, "%s: not a regular file", path);
    }
    s->size = (size_t)st.st_size;
    if (s->size < 8) {
        close(fd);
        return dsv4_err_set(err, DSV4_EIO, "%s: truncated: %zu bytes, no 8-byte header length",
                            s->fname, s->size);
    }
    void *m = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return dsv4_err_set(err, DSV4_EIO, "%s: mmap failed: %s", path, strerror(errno));
    s->map = m;
    return dsv4_st_parse(m, s->size, s->fname, &s->st, err);
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = (n + 65536 + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Collect all tensors of all shards into c->v and build the name map. */
static int gather(dsv4_ckpt *c, dsv4_err *err) {
    size_t n = 0;
    for (size_t i = 0; i < c->n_shards; i++) n += dsv4_st_count(c->shards[i].st);
    if (n >= UINT32_MAX) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "%s: too many tensors", c->dir);
    c->v = calloc(n + 1, sizeof *c->v);
    c->names = calloc(n + 1, sizeof *c->names);
    c->file_of = calloc(n + 1, sizeof *c->file_of);
    if (!c->v || !c->names || !c->file_of || map_init(&c->map, n) != 0)
        return dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", c->dir);
    for (size_t i = 0; i < c->n_shards; i++) {
        const dsv4_st_file *st = c->shards[i].st;
        for (size_t k = 0; k < dsv4_st_count(st); k++) {
            c->v[c->n] = *dsv4_st_at(st, k);
            c->names[c->n] = c->v[c->n].name;
            c->file_of[c->n] = (uint32_t)i;
            c->total_bytes += c->v[c->n].nbytes;
            long prev = map_insert(&c->map, c->names, (uint32_t)c->n);
            if (prev >= 0)
                return dsv4_err_set(err, DSV4_EFORMAT, "tensor '%s' is in both %s and %s",
                                    c->names[c->n], c->shards[c->file_of[prev]].fname,
                                    c->shards[i].fname);
            c->n++;
        }
    }
    /* Alignment: the format does not require a tensor to start at a multiple
     * of its element size (a writer that lays tensors out by name, like
     * tools/gen_checkpoints.py, puts F32/I64 tensors at odd offsets), but
     * consumers read views as float / int64_t arrays. Copy the few misaligned
     * tensors once into aligned memory owned by the checkpoint, so every view
     * handed out is aligned to its element size. */
    for (size_t i = 0; i < c->n; i++) {
        dsv4_tview *v = &c->v[i];
        size_t es = dsv4_dtype_size(v->dtype);
        if (es <= 1 || v->nbytes == 0 || (uintptr_t)v->data % es == 0) continue;
        if (c->n_copies % 64 == 0) {
            void **nc = realloc(c->copies, (c->n_copies + 64) * sizeof *nc);
            if (!nc) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            c->copies = nc;
        }
        void *m = aligned_alloc(64, (v->nbytes + 63) / 64 * 64);
        if (!m)
            return dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory aligning tensor '%s'",
                                c->shards[c->file_of[i]].fname, v->name);
        memcpy(m, v->data, v->nbytes);
        c->copies[c->n_copies++] = m;
        v->data = m;
    }
    return DSV4_OK;
}

static int open_indexed(dsv4_ckpt *c, const char *ipath, dsv4_err *err) {
    const char *iname = "model.safetensors.index.json";
    size_t len = 0;
    char *text = read_text(ipath, &len);
    if (!text) return dsv4_err_set(err, DSV4_EIO, "%s: cannot read: %s", ipath, strerror(errno));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = DSV4_OK;
    strmap fmap = {0}, imap = {0};
    const char **fnames = NULL, **inames = NULL;
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!root || !cJSON_IsObject(root)) {
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: not a JSON object", iname);
        goto done;
    }
    if (!cJSON_IsObject(wm)) {
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: missing or wrong-typed \"weight_map\" object", iname);
        goto done;
    }
    size_t n_entries = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        n_entries++;
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
            !strcmp(e->valuestring, "..") || !strcmp(e->valuestring, ".")) {
            rc = dsv4_err_set(err, DSV4_EFORMAT,
                              "%s: bad entry for tensor '%s': value must be a shard file name",
                              iname, e->string ? e->string : "");
            goto done;
        }
    }
    if (n_entries == 0) {
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: \"weight_map\" is empty", iname);
        goto done;
    }
    /* distinct shard names, in order of first appearance */
    fnames = calloc(n_entries, sizeof *fnames);
    inames = calloc(n_entries, sizeof *inames);
    c->shards = calloc(n_entries, sizeof *c->shards);
    if (!fnames || !inames || !c->shards || map_init(&fmap, n_entries) != 0 ||
        map_init(&imap, n_entries) != 0) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        goto done;
    }
    {
        size_t k = 0;
        for (const cJSON *e = wm->child; e; e = e->next, k++) {
            inames[k] = e->string ? e->string : "";
            if (map_insert(&imap, inames, (uint32_t)k) >= 0) {
                rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s' is listed twice", iname,
                                  inames[k]);
                goto done;
            }
        }
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        fnames[c->n_shards] = e->valuestring;
        if (map_insert(&fmap, fnames, (uint32_t)c->n_shards) < 0) {
            shard *s = &c->shards[c->n_shards++];
            if (!(s->fname = strdup(e->valuestring))) {
                rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
                goto done;
            }
            char why[600];
            snprintf(why, sizeof why, " (%s maps tensor '%.400s' to it)", iname, e->string);
            if ((rc = map_shard(c->dir, s, why, err)) != DSV4_OK) goto done;
        }
    }
    if ((rc = gather(c, err)) != DSV4_OK) goto done;
    /* index -> shards: every listed tensor is in the shard the index names */
    for (const cJSON *e = wm->child; e; e = e->next) {
        const dsv4_tview *v = dsv4_ckpt_find(c, e->string);
        if (!v) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s' is listed in %s but absent from it",
                              e->valuestring, e->string, iname);
            goto done;
        }
        const char *in = dsv4_ckpt_file_of(c, v);
        if (strcmp(in, e->valuestring) != 0) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s maps tensor '%s' to %s, but it is in %s", iname,
                              e->string, e->valuestring, in);
            goto done;
        }
    }
    /* shards -> index: every tensor of a shard is listed */
    for (size_t i = 0; i < c->n; i++)
        if (map_find(&imap, inames, c->names[i]) < 0) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s' is not listed in %s",
                              c->shards[c->file_of[i]].fname, c->names[i], iname);
            goto done;
        }
    /* shards present -> index: a *.safetensors file the index does not name is a
     * leftover of another download (or the index is stale) */
    {
        DIR *dd = opendir(c->dir);
        struct dirent *de;
        while (dd && (de = readdir(dd)))
            if (ends_with(de->d_name, ".safetensors") && map_find(&fmap, fnames, de->d_name) < 0) {
                rc = dsv4_err_set(err, DSV4_EFORMAT,
                                  "%s is present but %s maps no tensor to it (stale index or "
                                  "leftover file)", de->d_name, iname);
                break;
            }
        if (dd) closedir(dd);
        if (rc) goto done;
    }
done:
    free(fnames);
    free(inames);
    free(fmap.slot);
    free(imap.slot);
    cJSON_Delete(root);
    return rc;
}

int dsv4_ckpt_open(const char *dir, dsv4_ckpt **out, dsv4_err *err) {
    *out = NULL;
    if (!dir) return dsv4_err_set(err, DSV4_EINVAL, "no checkpoint directory given");
    int rc = check_incomplete(dir, err);
    if (rc) return rc;
    dsv4_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    char ipath[4096];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    struct stat st;
    if (stat(ipath, &st) == 0) {
        rc = open_indexed(c, ipath, err);
    } else {
        snprintf(ipath, sizeof ipath, "%s/model.safetensors", dir);
        if (stat(ipath, &st) != 0) {
            rc = dsv4_err_set(err, DSV4_EIO,
                              "%s: no model.safetensors.index.json and no model.safetensors", dir);
        } else if (!(c->shards = calloc(1, sizeof *c->shards)) ||
                   !(c->shards[0].fname = strdup("model.safetensors"))) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        } else {
            c->n_shards = 1;
            rc = map_shard(dir, &c->shards[0], "", err);
            if (!rc) rc = gather(c, err);
        }
    }
    if (rc) {
        dsv4_ckpt_free(c);
        return rc;
    }
    *out = c;
    return DSV4_OK;
}

int dsv4_ckpt_from_views(const char *label, const dsv4_tview *v, size_t n, dsv4_ckpt **out, dsv4_err *err) {
    *out = NULL;
    if (n >= UINT32_MAX) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "%s: too many tensors", label);
    dsv4_ckpt *c = calloc(1, sizeof *c);
    int rc = DSV4_OK;
    if (!c || !(c->dir = strdup(label)) || !(c->shards = calloc(1, sizeof *c->shards)) ||
        !(c->shards[0].fname = strdup(label)) || !(c->v = calloc(n + 1, sizeof *c->v)) ||
        !(c->names = calloc(n + 1, sizeof *c->names)) || !(c->file_of = calloc(n + 1, sizeof *c->file_of)) ||
        map_init(&c->map, n) != 0) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", label);
        goto done;
    }
    c->n_shards = 1;
    for (size_t i = 0; i < n; i++) {
        if (!v[i].name) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor %zu has no name", label, i);
            goto done;
        }
        c->v[i] = v[i];
        c->names[i] = v[i].name;
        c->total_bytes += v[i].nbytes;
        c->n = i + 1;
        if (map_insert(&c->map, c->names, (uint32_t)i) >= 0) {
            rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: tensor '%s' is listed twice", label, v[i].name);
            goto done;
        }
    }
done:
    if (rc) {
        dsv4_ckpt_free(c);
        return rc;
    }
    *out = c;
    return DSV4_OK;
}
