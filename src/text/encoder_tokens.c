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

#include <string.h>

int dsv4_text_prompt_tokenize(const dsv4_tokenizer *tok, const char *text, size_t len, int allow_special,
                              int add_special, dsv4_tokvec *out, dsv4_err *err) {
    static const char bos_text[] = DSV4_TOK_BOS;
    int32_t bos = dsv4_tokenizer_special_id(tok, bos_text);
    int starts_with_bos = allow_special && len >= sizeof bos_text - 1 && !memcmp(text, bos_text, sizeof bos_text - 1);
    if (add_special && bos >= 0 && !starts_with_bos && dsv4_tokvec_push(out, bos))
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    return dsv4_tokenizer_encode(tok, text, len, allow_special, out, err);
}

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

void dsv4_encoder_config_init(dsv4_encoder_config *cfg, dsv4_effort_profile profile)
{
    memset(cfg, 0, sizeof *cfg);
    dsv4_thinking_defaults_init(&cfg->thinking, profile);
    cfg->render_response_format = 1;
}

int dsv4_encoder_build_chat(const cJSON *body, const char *raw, size_t raw_len, const dsv4_encoder_config *cfg,
                            const dsv4_tokenizer *tok, dsv4_thinking *th, dsv4_prompt *prompt, dsv4_tokvec *ids,
                            dsv4_err *err)
{
    memset(prompt, 0, sizeof *prompt);
    int rc = dsv4_thinking_resolve(body, &cfg->thinking, th, err);
    if (rc) return rc;
    dsv4_encode_opts o;
    dsv4_encode_opts_init(&o, th, cfg->thinking.profile);
    if ((rc = dsv4_encode_opts_from_request(&o, body, err))) return rc;
    o.developer_as_system = cfg->developer_as_system;
    o.tool_schema_client_order = cfg->tool_schema_client_order;
    o.render_response_format = cfg->render_response_format;
    o.escape_dsml_param_terminator = cfg->escape_dsml_param_terminator;
    o.escape_tool_result_terminator = cfg->escape_tool_result_terminator;
    dsv4_json_numbers nums = {0};
    if (raw && raw_len) {
        rc = dsv4_json_numbers_build(body, raw, raw_len, &nums);
        if (rc == DSV4_ENOMEM) return dsv4_err_set(err, rc, "out of memory");
        if (rc) dsv4_log(DSV4_LOG_WARN, "request body: number table does not match the parsed tree; "
                         "numbers print from their double value");
        o.numbers = &nums;
    }
    rc = dsv4_encoder_render(cJSON_GetObjectItemCaseSensitive(body, "messages"), &o, prompt, err);
    dsv4_json_numbers_free(&nums);
    if (rc) return rc;
    if (tok && ids) {
        rc = dsv4_prompt_tokenize(prompt, tok, cfg->special_tokens_in_content, ids, err);
        if (rc) dsv4_prompt_free(prompt);
    }
    return rc;
}
