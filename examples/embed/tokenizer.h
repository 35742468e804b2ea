// BERT WordPiece tokenizer for the embed example: the same ids as Hugging Face `tokenizers`
// gives with a BertNormalizer + BertPreTokenizer + WordPiece tokenizer.json (all-MiniLM-L6-v2).
// Unicode properties come from utf8proc. MIT licence, part of devbuf.
#ifndef EMBED_TOKENIZER_H
#define EMBED_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct embed_tokenizer embed_tokenizer_t;

// Loads `model_dir`/vocab.txt (one token a line, the line number is the id). When
// `model_dir`/tokenizer.json exists, its settings are checked and used: the normalizer flags,
// the pre-tokenizer, the WordPiece unk token, prefix and max_input_chars_per_word, the added
// tokens, the [CLS] A [SEP] template, and that its vocab gives every token the id vocab.txt
// gives; anything this tokenizer cannot reproduce is refused. Its truncation and padding are
// ignored: the caller's max_len decides, and nothing is padded. Without tokenizer.json the
// BERT uncased defaults apply. Returns 0 and *out (free it with embed_tokenizer_free), or -1
// with a message naming the file, line and problem in err (when err_size > 0).
int embed_tokenizer_load(const char *model_dir, embed_tokenizer_t **out, char *err,
                         size_t err_size);

// Encodes `len` bytes of UTF-8 `text` (one line; '\n' is treated as any other whitespace)
// into [CLS] tokens... [SEP], keeping the first max_len - 2 tokens when there are more.
// Writes *out_count (at most max_len) ids into `ids`, which holds max_len. Invalid UTF-8
// decodes as Python's bytes.decode('utf-8', errors='replace') does. Any length of input is
// fine: the work stops once max_len ids are known. Safe to call from several threads on one
// tokenizer. Returns 0, or -1 with a message in err (bad arguments, max_len < 2, no memory).
int embed_tokenizer_encode(const embed_tokenizer_t *tok, const char *text, size_t len, int32_t *ids,
                           size_t max_len, size_t *out_count, char *err, size_t err_size);

// How many ids the tokenizer can give: one past the largest (vocab.txt's lines, and any added
// token's id beyond them). The model's embedding matrix must have that many rows.
size_t embed_tokenizer_id_count(const embed_tokenizer_t *tok);

// Frees the tokenizer; NULL is fine.
void embed_tokenizer_free(embed_tokenizer_t *tok);

#endif
