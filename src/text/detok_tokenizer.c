/* Adapter: text/tokenizer.h -> dsv4_detok_vocab (text/detok.h). */
#include "text/detok.h"
#include "text/tokenizer.h"

static int tok_piece(void *ctx, int32_t id, const char **bytes, size_t *len, int *special) {
    const dsv4_tokenizer *tok = ctx;
    const char *b = dsv4_tokenizer_token_bytes(tok, id, len);
    if (!b) return 1;
    *bytes = b;
    *special = dsv4_tokenizer_is_added(tok, id);
    return 0;
}

dsv4_detok_vocab dsv4_detok_vocab_from_tokenizer(const struct dsv4_tokenizer *tok) {
    dsv4_detok_vocab v = {(void *)tok, tok_piece};
    return v;
}
