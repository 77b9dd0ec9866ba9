/*
 * text/tokenizer.h — byte-level BPE tokenizer driven by a Hugging Face
 * `tokenizer.json` (spec/SERVING.md §1.1-1.2).
 *
 * Why our own: the server must turn rendered prompts into ids and ids back
 * into bytes without Python. The reference is the Hugging Face `tokenizers`
 * library loading the same file; ids must be identical
 * (tests/unit/test_tokenizer_goldens.c, tests/py/test_tokenizer_live.py).
 *
 * What a tokenizer.json may contain (anything else is refused at load time
 * with an error naming the file and the JSON field):
 *   model          type "BPE", vocab object, merges as "a b" strings or
 *                  ["a","b"] arrays, dropout null, no unk/continuing/suffix
 *                  prefixes, byte_fallback and ignore_merges false
 *   added_tokens   content/id/special/normalized; lstrip, rstrip and
 *                  single_word must be false
 *   normalizer     null or an empty Sequence
 *   pre_tokenizer  Sequence of Split{Regex or String, Isolated|Removed,
 *                  invert false}
 *                  ending in ByteLevel{add_prefix_space false, use_regex false}
 *                  (regexes are Oniguruma syntax; run with PCRE2 in UTF+UCP
 *                  mode after a small translation, see tokenizer_regex.c)
 *   post_processor null or ByteLevel (adds no tokens)
 *   decoder        ByteLevel
 *
 * Thread safety: a loaded tokenizer is immutable; every function below may be
 * called from any number of threads at once (the internal BPE cache takes a
 * mutex).
 */
#ifndef DSV4_TEXT_TOKENIZER_H
#define DSV4_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_tokenizer dsv4_tokenizer;

/* A growable id vector. Zero-initialise; encode appends; free with
 * dsv4_tokvec_free. ids are int32 token ids in [0, vocab_size). */
typedef struct dsv4_tokvec {
    int32_t *ids;
    size_t n, cap;
} dsv4_tokvec;

/* Free the ids and reset to empty (reusable). NULL is a no-op. */
void dsv4_tokvec_free(dsv4_tokvec *v);
/* Append one id (grows the vector). Returns DSV4_OK or DSV4_ENOMEM. */
int dsv4_tokvec_push(dsv4_tokvec *v, int32_t id);

/*
 * dsv4_tokenizer_load — read and compile a tokenizer.json file.
 * On success *out owns the tokenizer (free with dsv4_tokenizer_free).
 * Errors: DSV4_EIO (cannot read `path`), DSV4_EFORMAT (bad JSON, missing or
 * mistyped field: the message names path and field, e.g.
 * "tokenizer.json: model.merges[17]: ..."), DSV4_EUNSUPPORTED (a valid
 * feature this implementation does not handle, named), DSV4_ENOMEM.
 */
int dsv4_tokenizer_load(const char *path, dsv4_tokenizer **out, dsv4_err *err);

/*
 * dsv4_tokenizer_load_json — same from an in-memory JSON text of `len` bytes;
 * `name` is used in error messages in place of the file path.
 */
int dsv4_tokenizer_load_json(const char *json, size_t len, const char *name,
                             dsv4_tokenizer **out, dsv4_err *err);

/* Free a tokenizer (NULL is a no-op). No other call may be using it. */
void dsv4_tokenizer_free(dsv4_tokenizer *tok);

/*
 * dsv4_tokenizer_encode — tokenize `len` bytes of `text` and APPEND the ids
 * to `out` (so a caller can encode a prompt segment by segment).
 *
 * allow_special = 1: every added token's string (special or not: BOS/EOS,
 *   <｜User｜>, <think>, ｜DSML｜, ...) found in the text becomes its id,
 *   exactly as `tokenizers.Tokenizer.encode(text)` does (leftmost-longest,
 *   non-normalized tokens first, then normalized ones). Use for text the
 *   prompt encoder itself produced.
 * allow_special = 0: added-token strings are tokenized as ordinary text (the
 *   model's BPE alone). Use for client-supplied content: SERVING.md §1.2
 *   "Decision" (no prompt injection through pasted special-token text).
 *
 * No BOS/EOS is ever added. Invalid UTF-8 in `text` is not an error: each
 * maximal ill-formed subsequence (Unicode §3.9 / W3C "maximal subpart", the
 * policy of Python's bytes.decode('utf-8','replace') and Rust's
 * String::from_utf8_lossy) is replaced by U+FFFD before tokenizing, so the
 * ids equal `tokenizers` on the Python-decoded string. Embedded NUL bytes are
 * ordinary characters. text may be NULL when len is 0.
 * Errors: DSV4_ENOMEM; DSV4_ERANGE for a single pre-token (a run without
 * any break the pre-tokenizer splits on) over 256 MiB; DSV4_EINTERNAL if the
 * regex engine fails (message says why). On error, `out` keeps the ids appended before the failure.
 */
int dsv4_tokenizer_encode(const dsv4_tokenizer *tok, const char *text, size_t len,
                          int allow_special, dsv4_tokvec *out, dsv4_err *err);

/*
 * dsv4_tokenizer_decode — bytes for `n` ids, concatenated, into a malloc'd
 * NUL-terminated buffer *out (length *out_len, not counting the NUL).
 * This is the ByteLevel decoder applied token by token (identical to
 * tokenizers' decode for any ids whose bytes form valid UTF-8; where they do
 * not, e.g. half of a multi-byte character, we return the raw bytes and
 * tokenizers returns U+FFFD). skip_special = 1 drops added tokens flagged
 * "special" in tokenizer.json (tokenizers' skip_special_tokens).
 * Errors: DSV4_EINVAL (an id outside [0, vocab_size) or an unused id; the
 * message names its position), DSV4_ENOMEM.
 */
int dsv4_tokenizer_decode(const dsv4_tokenizer *tok, const int32_t *ids, size_t n,
                          int skip_special, char **out, size_t *out_len, dsv4_err *err);

/*
 * dsv4_tokenizer_token_bytes — the decoded bytes of one id (what decode
 * produces for [id]); *len receives their count. Returns NULL for an id out
 * of range or unused. The pointer lives as long as the tokenizer. For the
 * incremental detokenizer (no allocation per token).
 */
const char *dsv4_tokenizer_token_bytes(const dsv4_tokenizer *tok, int32_t id, size_t *len);

/*
 * dsv4_tokenizer_id_to_token — the token's vocabulary string (byte-level
 * form, e.g. "Ġthe"; added tokens as written, e.g. "<｜User｜>"),
 * NUL-terminated, owned by the tokenizer. NULL for an id out of range/unused.
 */
const char *dsv4_tokenizer_id_to_token(const dsv4_tokenizer *tok, int32_t id);

/*
 * dsv4_tokenizer_token_to_id — id of a vocabulary string (model vocab or
 * added token, same form as id_to_token returns), or -1 if absent.
 */
int32_t dsv4_tokenizer_token_to_id(const dsv4_tokenizer *tok, const char *token);

/*
 * dsv4_tokenizer_special_id — id of an added token whose content is exactly
 * `text` (e.g. "<｜User｜>" -> 128803, "</think>" -> 128822; SERVING.md §1.1),
 * or -1 if `text` is not an added token. Use at startup to resolve and check
 * the role markers.
 */
int32_t dsv4_tokenizer_special_id(const dsv4_tokenizer *tok, const char *text);

/* 1 if id is an added token (from added_tokens), else 0. */
int dsv4_tokenizer_is_added(const dsv4_tokenizer *tok, int32_t id);
/* 1 if id is an added token flagged "special": true, else 0. */
int dsv4_tokenizer_is_special(const dsv4_tokenizer *tok, int32_t id);

/* Vocabulary size including added tokens: highest id + 1 (129280 for the
 * DeepSeek-V4 tokenizer; = tokenizers' get_vocab_size(with_added_tokens=True)). */
int32_t dsv4_tokenizer_vocab_size(const dsv4_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif
