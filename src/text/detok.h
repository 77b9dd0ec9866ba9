/*
 * text/detok.h — incremental detokenizer (spec/SERVING.md §3.5 "Deltas never
 * split a UTF-8 character", §6.1 "incomplete UTF-8 sequences are held back").
 *
 * Why a separate stage: byte-level BPE tokens are byte strings, and a single
 * character (CJK, emoji) is often split over two or three tokens. A stream that
 * forwarded raw token bytes would hand clients half characters. This stage
 * turns a stream of token ids into text deltas that always end on a character
 * boundary, and reports special tokens (BOS, EOS, </think>, ｜DSML｜, ...) as
 * *events* so the output parser can act on them without matching their text
 * (§1.1: their ids come from the tokenizer, never from output text).
 *
 * Contract (tested in tests/unit/test_detok.c):
 *  - the concatenation of all text deltas (plus special-token text at the
 *    event positions) equals the lossy UTF-8 decode of the concatenated token
 *    bytes, where every maximal ill-formed subpart is replaced by one U+FFFD
 *    (Unicode §3.9 "U+FFFD substitution of maximal subparts"; what Python's
 *    bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy, and
 *    therefore the `tokenizers` decode, do);
 *  - a delta never contains part of a multi-byte character; bytes that may
 *    still become a valid character are held until they complete or prove
 *    invalid;
 *  - a special token ends any pending partial character (it is replaced by
 *    U+FFFD before the event, as the full decode would do, since the special
 *    token's text follows those bytes);
 *  - dsv4_detok_flush() at end of generation turns a trailing incomplete
 *    sequence into one U+FFFD.
 *
 * The id -> bytes mapping is a callback (dsv4_detok_vocab) so this file does
 * not depend on the tokenizer's internals; the tokenizer supplies an adapter.
 */
#ifndef DSV4_TEXT_DETOK_H
#define DSV4_TEXT_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * What a special (added) token means to the output parser. Classified from
 * the token's text (SERVING.md §1.1 table), so no id table is needed here.
 */
typedef enum dsv4_special_kind {
    DSV4_SPECIAL_NONE = 0,     /* ordinary text token                          */
    DSV4_SPECIAL_BOS,          /* <｜begin▁of▁sentence｜>                       */
    DSV4_SPECIAL_EOS,          /* <｜end▁of▁sentence｜>                         */
    DSV4_SPECIAL_PAD,          /* <｜▁pad▁｜>                                   */
    DSV4_SPECIAL_THINK_OPEN,   /* <think>                                      */
    DSV4_SPECIAL_THINK_CLOSE,  /* </think>                                     */
    DSV4_SPECIAL_DSML,         /* ｜DSML｜ (part of tool-call markup, §1.7)      */
    DSV4_SPECIAL_ROLE,         /* <｜User｜> <｜Assistant｜> <｜latest_reminder｜> */
    DSV4_SPECIAL_OTHER         /* any other added token (quick-task, image...) */
} dsv4_special_kind;

/*
 * dsv4_special_kind_of — classify a special token by its exact text
 * (UTF-8, len bytes). Unknown text -> DSV4_SPECIAL_OTHER. Follows §1.1.
 */
dsv4_special_kind dsv4_special_kind_of(const char *text, size_t len);

/* Human-readable name of a kind ("eos", "think_close", ...). Never NULL. */
const char *dsv4_special_kind_name(dsv4_special_kind k);

/*
 * The id -> bytes adapter. piece(ctx, id, &bytes, &len, &special) returns 0
 * and sets bytes/len to the token's raw bytes (byte-level BPE already mapped
 * back to bytes; for special tokens their UTF-8 text) and *special to nonzero
 * for added special tokens. It returns nonzero for an unknown id. The bytes
 * must stay valid until the next call of piece.
 */
typedef struct dsv4_detok_vocab {
    void *ctx;
    int (*piece)(void *ctx, int32_t id, const char **bytes, size_t *len, int *special);
} dsv4_detok_vocab;

struct dsv4_tokenizer; /* text/tokenizer.h */

/*
 * dsv4_detok_vocab_from_tokenizer — the adapter for our BPE tokenizer
 * (text/tokenizer.h): bytes from dsv4_tokenizer_token_bytes; every added
 * token (tokenizer.json `added_tokens`, whether flagged "special" or not:
 * <think>, </think>, ｜DSML｜ and the role markers are not) is reported as a
 * special token, so the parser acts on ids, never on text (§1.1, §5.4).
 * tok must outlive every detok using the returned vocab.
 */
dsv4_detok_vocab dsv4_detok_vocab_from_tokenizer(const struct dsv4_tokenizer *tok);

/* Result of pushing one token. Pointers stay valid until the next call on the same detok. */
typedef struct dsv4_detok_out {
    const char *text;          /* complete UTF-8 text released by this token (may be empty) */
    size_t len;                /* bytes of text                                            */
    dsv4_special_kind special; /* != NONE: the token was special; text (if any) precedes it */
    const char *special_text;  /* the special token's own text (not part of `text`)        */
    size_t special_len;
} dsv4_detok_out;

typedef struct dsv4_detok dsv4_detok;

/*
 * dsv4_detok_create — one per request. vocab may be NULL if only
 * dsv4_detok_push_bytes is used; otherwise it is copied (its ctx must outlive
 * the detok). Returns NULL on allocation failure (err set).
 */
dsv4_detok *dsv4_detok_create(const dsv4_detok_vocab *vocab, dsv4_err *err);
void dsv4_detok_free(dsv4_detok *d);

/*
 * dsv4_detok_push — feed one token id. Fills *out (see dsv4_detok_out).
 * Errors: DSV4_EINVAL for an id the vocab does not know (out is empty),
 * DSV4_ENOMEM. Never aborts.
 */
int dsv4_detok_push(dsv4_detok *d, int32_t id, dsv4_detok_out *out, dsv4_err *err);

/*
 * dsv4_detok_push_bytes — the same for a token given directly as bytes
 * (special != 0 marks a special token whose text is `bytes`). Used by the
 * vocab path and by tests that build token streams from text.
 */
int dsv4_detok_push_bytes(dsv4_detok *d, const char *bytes, size_t len, int special,
                          dsv4_detok_out *out, dsv4_err *err);

/*
 * dsv4_detok_flush — end of stream: a trailing incomplete sequence becomes
 * one U+FFFD (documented behaviour, matches the lossy full decode). Fills
 * *out with that text (empty when nothing was pending).
 */
int dsv4_detok_flush(dsv4_detok *d, dsv4_detok_out *out, dsv4_err *err);

/*
 * dsv4_utf8_lossy — the reference full decode used by the contract above:
 * writes the lossy decode of in[0..n) to a malloc'ed NUL-terminated string
 * (*out, length *out_len). Returns DSV4_OK or DSV4_ENOMEM.
 */
int dsv4_utf8_lossy(const char *in, size_t n, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
