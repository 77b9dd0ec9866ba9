/*
 * text/encoder_tokens.c — rendered prompt -> token ids, honouring who wrote
 * each byte (spec/SERVING.md §1.2 "Decision"; contract in encoder.h).
 *
 * Why runs, not segments: BPE pre-tokenization looks across a markup/content
 * boundary (`name="` + `city`), so encoding each segment alone would give
 * different ids from the reference on the whole string. Special tokens split
 * pre-tokenization anyway, so cutting only at SPECIAL segments reproduces
 * the reference ids exactly whenever client content holds no special text.
 */
#include "text/encoder.h"

int dsv4_prompt_tokenize(const dsv4_prompt *p, const dsv4_tokenizer *tok, int special_in_content,
                         dsv4_tokvec *out, dsv4_err *err)
{
    if (special_in_content) return dsv4_tokenizer_encode(tok, p->text, p->len, 1, out, err);
    size_t i = 0;
    while (i < p->nsegs) {
        const dsv4_prompt_seg *s = &p->segs[i];
        if (s->kind == DSV4_SEG_SPECIAL) {
            char tokstr[64];
            if (s->len >= sizeof tokstr)
                return dsv4_err_set(err, DSV4_EINTERNAL, "prompt: special segment of %zu bytes", s->len);
            for (size_t k = 0; k < s->len; k++) tokstr[k] = p->text[s->off + k];
            tokstr[s->len] = '\0';
            int32_t id = dsv4_tokenizer_special_id(tok, tokstr);
            if (id < 0)
                return dsv4_err_set(err, DSV4_EFORMAT, "tokenizer has no added token \"%s\" (spec/SERVING.md §1.1)",
                                    tokstr);
            int rc = dsv4_tokvec_push(out, id);
            if (rc) return dsv4_err_set(err, rc, "out of memory");
            i++;
            continue;
        }
        size_t off = s->off, len = 0;
        while (i < p->nsegs && p->segs[i].kind != DSV4_SEG_SPECIAL) len += p->segs[i++].len;
        int rc = dsv4_tokenizer_encode(tok, p->text + off, len, 0, out, err);
        if (rc) return rc;
    }
    return DSV4_OK;
}
