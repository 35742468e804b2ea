// BERT WordPiece tokenizer, written to give the ids Hugging Face `tokenizers` gives
// (checked by tests/embed/check_tokens.py). MIT licence, part of devbuf.
//
// Pipeline, in HF's order: split out added tokens ([CLS], [MASK]...) on the raw text; then
// for each piece in between, BertNormalizer (clean_text, spaces around CJK ideographs, NFD
// and drop Mn when stripping accents, lowercase), BertPreTokenizer (split on whitespace,
// isolate punctuation), WordPiece. Every stage takes one code point at a time, so a line
// of any length costs time linear in what is read and memory bounded by one word, and the
// work stops as soon as the token budget is full.
#include "tokenizer.h"

#include "json_reader.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_ADDED      64     // added tokens a tokenizer.json may declare
#define MAX_PREFIX     16     // bytes of the continuing-subword prefix ("##")
#define MAX_WORD_CHARS 100000 // refuse larger max_input_chars_per_word: it sizes a buffer

typedef struct {
  uint32_t off;  // of the token's bytes in arena
  uint32_t len;  // bytes
  uint32_t hash; // hash_more of the token
  int32_t id;    // -1: empty slot
} vocab_slot;

typedef struct {
  char *text; // content, NUL-terminated UTF-8, never empty
  size_t len;
  int32_t id;
} added_token;

struct embed_tokenizer {
  char *arena;            // every vocab.txt line, back to back
  vocab_slot *slots;      // open addressing, linear probing, power-of-two size
  size_t mask;            // slots - 1
  size_t n_tokens;        // vocab.txt lines
  size_t max_token_bytes; // longest token: no longer piece can match
  int32_t unk_id, cls_id, sep_id;
  added_token added[MAX_ADDED];
  size_t n_added;
  uint8_t added_first[32]; // bitmap of the first bytes of added tokens
  char prefix[MAX_PREFIX];
  size_t prefix_len;
  size_t max_word_chars; // longer words become [UNK]
  bool clean_text, chinese, strip_accents, lowercase;
};

static void set_err(char *err, size_t size, const char *fmt, ...) {
  if (!err || size == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, size, fmt, ap);
  va_end(ap);
}

/* ---- vocabulary hash table ----------------------------------------------------------- */

// FNV-1a, fed the prefix then the piece, so "##" + piece needs no concatenated copy.
static uint32_t hash_more(uint32_t h, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

static int32_t vocab_find(const embed_tokenizer_t *t, const char *pre, size_t pre_len,
                          const char *s, size_t n) {
  uint32_t h = hash_more(hash_more(2166136261u, pre, pre_len), s, n);
  for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
    const vocab_slot *e = &t->slots[i];
    if (e->id < 0) return -1;
    if (e->hash == h && e->len == pre_len + n && memcmp(t->arena + e->off, pre, pre_len) == 0 &&
        memcmp(t->arena + e->off + pre_len, s, n) == 0)
      return e->id;
  }
}

// A repeated line takes the later id, as HF's HashMap insert does.
static void vocab_insert(embed_tokenizer_t *t, uint32_t off, uint32_t len, int32_t id) {
  uint32_t h = hash_more(2166136261u, t->arena + off, len);
  for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
    vocab_slot *e = &t->slots[i];
    if (e->id < 0 ||
        (e->hash == h && e->len == len && memcmp(t->arena + e->off, t->arena + off, len) == 0)) {
      *e = (vocab_slot){.off = off, .len = len, .hash = h, .id = id};
      return;
    }
  }
}

static int32_t vocab_id(const embed_tokenizer_t *t, const char *s) {
  return vocab_find(t, "", 0, s, strlen(s));
}

/* ---- UTF-8 decoding ------------------------------------------------------------------ */

// One code point from s[0..n), n > 0. Invalid input gives U+FFFD for each maximal subpart
// of an ill-formed sequence (Unicode's recommended practice, which Python follows): a lead
// byte takes only continuation bytes in its allowed range, so an ASCII or lead byte always
// starts the next code point. Returns the bytes used.
static size_t utf8_next(const unsigned char *s, size_t n, int32_t *cp) {
  unsigned b = s[0], lo = 0x80, hi = 0xBF;
  size_t need;
  int32_t c;
  if (b < 0x80) {
    *cp = (int32_t)b;
    return 1;
  }
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
    c = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    c = b & 0x0F;
    if (b == 0xE0)
      lo = 0xA0; // overlong
    else if (b == 0xED)
      hi = 0x9F; // surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    c = b & 0x07;
    if (b == 0xF0)
      lo = 0x90; // overlong
    else if (b == 0xF4)
      hi = 0x8F; // above U+10FFFF
  } else {
    *cp = 0xFFFD;
    return 1;
  }
  size_t i = 1;
  for (; i <= need; i++) {
    if (i >= n || s[i] < lo || s[i] > hi) {
      *cp = 0xFFFD;
      return i;
    }
    c = (c << 6) | (s[i] & 0x3F);
    lo = 0x80, hi = 0xBF;
  }
  *cp = c;
  return i;
}

/* ---- character classes, as HF's BertNormalizer and BertPreTokenizer define them ------ */

enum { HF_SPACE, HF_DROP, HF_PUNCT, HF_PLAIN };
#include "unicode_overrides.h"

// The category `tokenizers` gives c. Its tables are of an older Unicode than utf8proc's, so a
// few hundred code points added or recategorised since (unicode_overrides.h) belong to
// another class there; each is given a category of that class.
static utf8proc_category_t category_of(int32_t c) {
  utf8proc_category_t k = utf8proc_category(c);
  size_t lo = 0, hi = sizeof unicode_overrides / sizeof unicode_overrides[0];
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c < unicode_overrides[mid].first)
      hi = mid;
    else if (c > unicode_overrides[mid].last)
      lo = mid + 1;
    else {
      switch (unicode_overrides[mid].hf_class) {
      case HF_SPACE:
        return UTF8PROC_CATEGORY_ZS;
      case HF_DROP: // a mark is stripped with the accents, anything else dropped as a control
        return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME ? UTF8PROC_CATEGORY_MN
                                                                      : UTF8PROC_CATEGORY_CF;
      case HF_PUNCT:
        return UTF8PROC_CATEGORY_PO;
      default:
        return UTF8PROC_CATEGORY_LO;
      }
    }
  }
  return k;
}

// Rust's char::is_whitespace (the White_Space property): the Zs, Zl, Zp categories plus
// the C0 controls \t..\r and U+0085.
static bool is_space(int32_t c) {
  if (c < 0x80) return c == ' ' || (c >= '\t' && c <= '\r');
  if (c == 0x85) return true;
  utf8proc_category_t k = category_of(c);
  return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

// HF's is_control: Cc, Cf, Co (and Cs, which decoding never yields) except \t \n \r, which
// count as whitespace. Unassigned code points (Cn) are kept: HF's category tables list no
// Cn ranges, so it never classifies a code point as Cn.
static bool is_control(int32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  if (c < 0x80) return c < 0x20 || c == 0x7F;
  utf8proc_category_t k = category_of(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO ||
         k == UTF8PROC_CATEGORY_CS;
}

// HF's is_chinese_char: exactly the ranges of tokenizers/src/normalizers/bert.rs (the CJK
// Unified Ideographs blocks and extensions A-E, and the compatibility ideographs).
static bool is_chinese(int32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertPreTokenizer's is_bert_punc: every ASCII punctuation character (which includes the
// symbols $ + < = > ^ ` | ~) or a Unicode P* category.
static bool is_punct(int32_t c) {
  if (c < 0x80)
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126);
  utf8proc_category_t k = category_of(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* ---- encoding state ------------------------------------------------------------------ */

typedef struct {
  const embed_tokenizer_t *tok;
  int32_t *ids;  // ids[0] is [CLS]
  size_t n;      // ids written
  size_t budget; // n may reach this; one place stays for [SEP]
  bool full;     // n == budget: everything after is truncated away
  bool failed;   // out of memory
  char *word;    // bytes of the word being collected: max_word_chars code points
  size_t word_len;
  size_t word_chars; // may pass max_word_chars; then the bytes stop growing
  int32_t *pieces;   // a word's WordPiece ids, kept until the whole word is known good
  int32_t *marks;    // NFD: combining marks (ccc > 0) that canonical ordering may move
  size_t n_marks, cap_marks;
} encoder;

static void emit(encoder *e, int32_t id) {
  e->ids[e->n++] = id;
  if (e->n == e->budget) e->full = true;
}

// WordPiece: greedy longest match from the left, prefix on all but the first piece; a word
// with a part no token matches becomes one [UNK], as does a word over max_word_chars.
static void word_end(encoder *e) {
  const embed_tokenizer_t *t = e->tok;
  size_t len = e->word_len, chars = e->word_chars;
  e->word_len = e->word_chars = 0;
  if (chars == 0) return;
  if (chars > t->max_word_chars) {
    emit(e, t->unk_id);
    return;
  }
  const char *w = e->word;
  size_t n = 0;
  for (size_t start = 0; start < len;) {
    size_t pre = start ? t->prefix_len : 0;
    size_t room = t->max_token_bytes > pre ? t->max_token_bytes - pre : 0;
    size_t end = len - start > room ? start + room : len;
    int32_t id = -1;
    for (;;) { // end always on a code point boundary: w is valid UTF-8
      while (end > start && end < len && ((unsigned char)w[end] & 0xC0) == 0x80) end--;
      if (end == start) break;
      if ((id = vocab_find(t, t->prefix, pre, w + start, end - start)) >= 0) break;
      end--;
    }
    if (id < 0) {
      emit(e, t->unk_id);
      return;
    }
    e->pieces[n++] = id;
    start = end;
  }
  for (size_t i = 0; i < n && !e->full; i++) emit(e, e->pieces[i]);
}

// BertPreTokenizer on normalized code points, then into the current word.
static void pretok(encoder *e, int32_t c) {
  if (e->full) return;
  if (is_space(c)) {
    word_end(e);
    return;
  }
  bool punct = is_punct(c);
  if (punct) word_end(e);
  if (e->full) return;
  if (++e->word_chars <= e->tok->max_word_chars)
    e->word_len += (size_t)utf8proc_encode_char(c, (utf8proc_uint8_t *)e->word + e->word_len);
  if (punct) word_end(e);
}

// Lowercase as Rust's char::to_lowercase: the simple mapping, except U+0130, whose full
// lowercase is two code points.
static void lower(encoder *e, int32_t c) {
  if (!e->tok->lowercase) {
    pretok(e, c);
    return;
  }
  if (c < 0x80) {
    pretok(e, c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (c == 0x130) {
    pretok(e, 'i');
    pretok(e, 0x307);
    return;
  }
  pretok(e, utf8proc_tolower(c));
}

// Canonical ordering for the marks that survive accent stripping: a stable sort by
// combining class, done as one pass per class present (at most 255), so linear in the run.
static void marks_flush(encoder *e) {
  size_t n = e->n_marks;
  e->n_marks = 0;
  for (int prev = 0;;) {
    int next = 256;
    for (size_t i = 0; i < n; i++) {
      int k = utf8proc_get_property(e->marks[i])->combining_class;
      if (k > prev && k < next) next = k;
    }
    if (next == 256) return;
    for (size_t i = 0; i < n; i++)
      if (utf8proc_get_property(e->marks[i])->combining_class == next) lower(e, e->marks[i]);
    prev = next;
  }
}

static void marks_push(encoder *e, int32_t c) {
  if (e->n_marks == e->cap_marks) {
    size_t cap = e->cap_marks ? 2 * e->cap_marks : 16;
    int32_t *m = realloc(e->marks, cap * sizeof *m);
    if (!m) {
      e->failed = e->full = true;
      return;
    }
    e->marks = m, e->cap_marks = cap;
  }
  e->marks[e->n_marks++] = c;
}

// NFD (canonical decomposition and ordering), dropping Mn marks when stripping accents.
// Only marks with a combining class above 0 are reordered; a class-0 code point (even an
// Mn one that is then dropped) ends the run, as in NFD itself.
static void nfd(encoder *e, int32_t c) {
  if (!e->tok->strip_accents || c < 0x80) { // ASCII decomposes to itself, class 0
    if (e->n_marks) marks_flush(e);
    lower(e, c);
    return;
  }
  utf8proc_int32_t d[32];
  int last = 0;
  utf8proc_ssize_t n = utf8proc_decompose_char(c, d, 32, UTF8PROC_DECOMPOSE, &last);
  if (n < 1 || n > 32) d[0] = c, n = 1; // cannot happen for a valid code point
  for (utf8proc_ssize_t i = 0; i < n && !e->full; i++) {
    const utf8proc_property_t *p = utf8proc_get_property(d[i]);
    bool mn = category_of(d[i]) == UTF8PROC_CATEGORY_MN;
    if (p->combining_class == 0) {
      if (e->n_marks) marks_flush(e);
      if (!mn) lower(e, d[i]);
    } else if (!mn) {
      marks_push(e, d[i]);
    }
  }
}

// clean_text and handle_chinese_chars.
static void clean(encoder *e, int32_t c) {
  const embed_tokenizer_t *t = e->tok;
  if (t->clean_text) {
    if (c == 0 || c == 0xFFFD || is_control(c)) return;
    if (is_space(c)) c = ' ';
  }
  if (t->chinese && c >= 0x3400 && is_chinese(c)) {
    nfd(e, ' ');
    nfd(e, c);
    nfd(e, ' ');
    return;
  }
  nfd(e, c);
}

static void segment_end(encoder *e) {
  if (e->n_marks) marks_flush(e);
  if (!e->full) word_end(e);
}

// The added token (longest, as HF's leftmost-longest match) starting at s, or NULL. Added
// tokens are valid UTF-8 and matched on the raw bytes, before any normalization; that is
// the same as matching the decoded text, since decoding never lets an invalid sequence
// swallow an ASCII or lead byte.
static const added_token *added_at(const embed_tokenizer_t *t, const char *s, size_t n) {
  unsigned b = (unsigned char)s[0];
  if (!(t->added_first[b >> 3] & (1u << (b & 7)))) return NULL;
  const added_token *best = NULL;
  for (size_t i = 0; i < t->n_added; i++) {
    const added_token *a = &t->added[i];
    if (a->len <= n && memcmp(s, a->text, a->len) == 0 && (!best || a->len > best->len)) best = a;
  }
  return best;
}

int embed_tokenizer_encode(const embed_tokenizer_t *tok, const char *text, size_t len, int32_t *ids,
                           size_t max_len, size_t *out_count, char *err, size_t err_size) {
  if (!tok || (!text && len) || !ids || !out_count) {
    set_err(err, err_size, "embed_tokenizer_encode: NULL tokenizer, text, ids or out_count");
    return -1;
  }
  if (max_len < 2) {
    set_err(err, err_size, "embed_tokenizer_encode: max_len %zu leaves no room for [CLS] and [SEP]",
            max_len);
    return -1;
  }
  encoder e = {.tok = tok, .ids = ids, .budget = max_len - 1};
  e.word = malloc(tok->max_word_chars * 4 + 4);
  e.pieces = malloc((tok->max_word_chars + 1) * sizeof *e.pieces);
  if (!e.word || !e.pieces) goto oom;
  emit(&e, tok->cls_id);
  const unsigned char *s = (const unsigned char *)text;
  for (size_t i = 0; i < len && !e.full;) {
    const added_token *a = tok->n_added ? added_at(tok, text + i, len - i) : NULL;
    if (a) {
      segment_end(&e);
      if (!e.full) emit(&e, a->id);
      i += a->len;
      continue;
    }
    int32_t c;
    i += utf8_next(s + i, len - i, &c);
    clean(&e, c);
  }
  segment_end(&e);
  if (e.failed) goto oom;
  ids[e.n++] = tok->sep_id;
  *out_count = e.n;
  free(e.word), free(e.pieces), free(e.marks);
  return 0;
oom:
  free(e.word), free(e.pieces), free(e.marks);
  set_err(err, err_size, "embed_tokenizer_encode: out of memory");
  return -1;
}

/* ---- loading ------------------------------------------------------------------------- */

static bool valid_utf8(const char *s, size_t n) {
  utf8proc_int32_t c;
  for (size_t i = 0; i < n;) {
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) return false;
    i += (size_t)k;
  }
  return true;
}

static int load_vocab(embed_tokenizer_t *t, const char *path, char *err, size_t err_size) {
  size_t len;
  if (embed_read_file(path, false, &t->arena, &len, err, err_size)) return -1;
  if (len > UINT32_MAX) {
    set_err(err, err_size, "%s: larger than 4 GiB", path);
    return -1;
  }
  size_t lines = 0;
  for (size_t i = 0; i < len; i++) lines += t->arena[i] == '\n';
  if (len && t->arena[len - 1] != '\n') lines++;
  if (lines == 0 || lines > INT32_MAX / 2) {
    set_err(err, err_size, "%s: %zu lines, expected one token a line", path, lines);
    return -1;
  }
  size_t slots = 16;
  while (slots < 2 * lines) slots *= 2;
  t->slots = malloc(slots * sizeof *t->slots);
  if (!t->slots) {
    set_err(err, err_size, "%s: out of memory", path);
    return -1;
  }
  for (size_t i = 0; i < slots; i++) t->slots[i].id = -1;
  t->mask = slots - 1;
  t->n_tokens = lines;
  size_t start = 0;
  for (size_t line = 0; line < lines; line++) {
    const char *nl = memchr(t->arena + start, '\n', len - start);
    size_t end = nl ? (size_t)(nl - t->arena) : len, next = end + 1;
    if (end > start && t->arena[end - 1] == '\r') end--; // a CRLF file
    if (!valid_utf8(t->arena + start, end - start)) {
      set_err(err, err_size, "%s: line %zu: invalid UTF-8", path, line + 1);
      return -1;
    }
    vocab_insert(t, (uint32_t)start, (uint32_t)(end - start), (int32_t)line);
    if (end - start > t->max_token_bytes) t->max_token_bytes = end - start;
    start = next;
  }
  return 0;
}

// The ids the template writes for one special token.
typedef struct special_token {
  char name[64];
  long long id; // the first
  size_t ids;
} special_token;

// What the walk of tokenizer.json found (json_reader.h walks it).
typedef struct {
  embed_tokenizer_t *t;
  size_t vocab_seen;
  char bad_vocab[64]; // the first model.vocab entry vocab.txt disagrees with
  long long bad_vocab_id;
  char norm_type[32], pretok_type[32], model_type[32], pp_type[32], unk[64], tmpl[160];
  int flags[4];        // clean_text, handle_chinese_chars, strip_accents, lowercase:
                       // 1 true, 0 false, -1 null, 2 anything else
  long long max_chars; // -1 when not a whole number
  char prefix[64];
  added_token cur;          // the added token being read
  bool cur_bad;             // it sets lstrip, rstrip, single_word or normalized
  special_token special[4]; // post_processor.special_tokens
  size_t special_count;
} json;

static bool path_is(const json_item *item, const char *p) { return strcmp(item->path, p) == 0; }

static void copy(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src); }

static const char *added_end(json *j) {
  const char *refused = j->cur_bad ? "an added token sets lstrip, rstrip, single_word or normalized"
                        : !j->cur.text || !j->cur.len ? "an added token without content"
                        : j->t->n_added == MAX_ADDED  ? "too many added_tokens"
                                                      : NULL;
  if (!refused) {
    j->t->added[j->t->n_added++] = j->cur;
    j->cur.text = NULL;
  }
  free(j->cur.text);
  j->cur = (added_token){.id = -1};
  j->cur_bad = false;
  return refused;
}

// Copies a name the tokenizer keeps; false when it does not fit (a cut name could be another
// token's).
static bool keep(char *dst, size_t cap, const json_item *item) {
  if (item->text_cut || strlen(item->text) >= cap) return false;
  copy(dst, cap, item->text);
  return true;
}

// Whether `path` is "post_processor.special_tokens.NAME.ids[]"; the NAME into `name`.
static bool special_ids_of(const char *path, char *name, size_t name_size) {
  const char *prefix = "post_processor.special_tokens.", *suffix = ".ids[]";
  size_t length = strlen(path), before = strlen(prefix), after = strlen(suffix);
  if (length <= before + after || strncmp(path, prefix, before) != 0 ||
      strcmp(path + length - after, suffix) != 0)
    return false;
  snprintf(name, name_size, "%.*s", (int)(length - before - after), path + before);
  return true;
}

static const char *json_value(void *context, const json_item *item) {
  json *j = context;
  const char *key = item->key, *v = item->text;
  json_type type = item->type;
  long long num = item->whole;
  bool t = type == JSON_TRUE, f = type == JSON_FALSE;
  char name[192];
  if (item->key_cut) return "a key longer than 255 bytes";
  if (type == JSON_OBJECT_END) {
    if (path_is(item, "added_tokens[]")) return added_end(j);
  } else if (path_is(item, "model.vocab")) { // one token: its id must be its vocab.txt line
    j->vocab_seen++;
    if ((type != JSON_NUMBER || vocab_id(j->t, key) != num) && !j->bad_vocab[0])
      copy(j->bad_vocab, sizeof j->bad_vocab, key), j->bad_vocab_id = num;
  } else if (path_is(item, "normalizer")) {
    static const char *const names[4] = {"clean_text", "handle_chinese_chars", "strip_accents",
                                         "lowercase"};
    if (strcmp(key, "type") == 0) copy(j->norm_type, sizeof j->norm_type, v);
    for (int i = 0; i < 4; i++)
      if (strcmp(key, names[i]) == 0) j->flags[i] = t ? 1 : f ? 0 : type == JSON_NULL ? -1 : 2;
  } else if (path_is(item, "pre_tokenizer")) {
    if (strcmp(key, "type") == 0) copy(j->pretok_type, sizeof j->pretok_type, v);
  } else if (path_is(item, "model")) {
    if (strcmp(key, "type") == 0)
      copy(j->model_type, sizeof j->model_type, v);
    else if (strcmp(key, "unk_token") == 0 && !keep(j->unk, sizeof j->unk, item))
      return "model.unk_token is longer than 63 bytes";
    else if (strcmp(key, "continuing_subword_prefix") == 0)
      copy(j->prefix, sizeof j->prefix, v);
    else if (strcmp(key, "max_input_chars_per_word") == 0)
      j->max_chars = type == JSON_NUMBER ? num : -1;
  } else if (path_is(item, "added_tokens[]")) {
    if (strcmp(key, "content") == 0 && type == JSON_STRING && !j->cur.text) {
      if (item->text_cut) return "an added token longer than 1023 bytes";
      j->cur.len = strlen(v);
      if (!(j->cur.text = malloc(j->cur.len + 1))) return "out of memory";
      memcpy(j->cur.text, v, j->cur.len + 1);
    } else if (strcmp(key, "id") == 0 && type == JSON_NUMBER && num >= 0 && num <= INT32_MAX) {
      j->cur.id = (int32_t)num;
    } else if (!f && (strcmp(key, "lstrip") == 0 || strcmp(key, "rstrip") == 0 ||
                      strcmp(key, "single_word") == 0 || strcmp(key, "normalized") == 0)) {
      j->cur_bad = true;
    }
  } else if (path_is(item, "post_processor")) {
    if (strcmp(key, "type") == 0) copy(j->pp_type, sizeof j->pp_type, v);
  } else if ((path_is(item, "post_processor.single[].SpecialToken") ||
              path_is(item, "post_processor.single[].Sequence")) &&
             strcmp(key, "type_id") == 0) {
    if (type != JSON_NUMBER || num != 0)
      return "post_processor.single gives a type id other than 0 (the model embeds type 0)";
  } else if (special_ids_of(item->path, name, sizeof name)) {
    size_t at = 0;
    while (at < j->special_count && strcmp(j->special[at].name, name) != 0) at++;
    if (at == j->special_count) {
      if (at == sizeof j->special / sizeof j->special[0] ||
          strlen(name) >= sizeof j->special[0].name)
        return "post_processor.special_tokens: more than 4, or a name over 63 bytes";
      memcpy(j->special[at].name, name, strlen(name) + 1); // fits: measured above
      j->special_count++;
    }
    j->special[at].id = type == JSON_NUMBER ? num : -1;
    j->special[at].ids++;
  } else if ((path_is(item, "post_processor.single[].SpecialToken") ||
              path_is(item, "post_processor.single[].Sequence")) &&
             strcmp(key, "id") == 0) {
    size_t n = strlen(j->tmpl);
    if (item->text_cut || strlen(v) > 63 || n + 1 + strlen(v) >= sizeof j->tmpl)
      return "post_processor.single names a token longer than 63 bytes, or too many";
    snprintf(j->tmpl + n, sizeof j->tmpl - n, "%s%s", n ? " " : "", v);
  }
  return NULL;
}

// The first special token of the template whose ids are not the one id vocab.txt gives it
// (the template writes its ids, the tokenizer writes vocab.txt's), or NULL.
static const special_token *special_disagrees(const json *j) {
  for (size_t i = 0; i < j->special_count; i++)
    if (j->special[i].ids != 1 || j->special[i].id != vocab_id(j->t, j->special[i].name))
      return &j->special[i];
  return NULL;
}

// Returns 0, 1 when there is no tokenizer.json, or -1.
static int load_json(embed_tokenizer_t *t, const char *path, char *err, size_t err_size) {
  char *text;
  size_t len;
  int rc = embed_read_file(path, true, &text, &len, err, err_size);
  if (rc) return rc;
  json *j = malloc(sizeof *j);
  if (!j) {
    free(text);
    set_err(err, err_size, "%s: out of memory", path);
    return -1;
  }
  *j = (json){.t = t, .flags = {1, 1, -1, 1}, .max_chars = 100, .prefix = "##", .cur = {.id = -1}};
  bool walked = json_walk(text, len, path, json_value, j, err, err_size) == 0;
  free(j->cur.text);
  char cls[64] = "", mid[8] = "", sep[64] = "", extra[2];
  int parts = sscanf(j->tmpl, "%63s %7s %63s %1s", cls, mid, sep, extra);
  rc = -1;
  const special_token *bad_special = NULL;
  if (!walked) {
    // err names the line
  } else if (strcmp(j->norm_type, "BertNormalizer") != 0) {
    set_err(err, err_size, "%s: normalizer is \"%s\"; only BertNormalizer is supported", path,
            j->norm_type);
  } else if (j->flags[0] < 0 || j->flags[1] < 0 || j->flags[3] < 0 || j->flags[0] > 1 ||
             j->flags[1] > 1 || j->flags[2] > 1 || j->flags[3] > 1) {
    set_err(err, err_size,
            "%s: normalizer.clean_text, handle_chinese_chars and lowercase must be "
            "true or false, strip_accents true, false or null",
            path);
  } else if (strcmp(j->pretok_type, "BertPreTokenizer") != 0) {
    set_err(err, err_size, "%s: pre_tokenizer is \"%s\"; only BertPreTokenizer is supported", path,
            j->pretok_type);
  } else if (strcmp(j->model_type, "WordPiece") != 0) {
    set_err(err, err_size, "%s: model is \"%s\"; only WordPiece is supported", path, j->model_type);
  } else if (j->max_chars < 1 || j->max_chars > MAX_WORD_CHARS) {
    set_err(err, err_size, "%s: model.max_input_chars_per_word must be 1..%d", path,
            MAX_WORD_CHARS);
  } else if (strlen(j->prefix) >= MAX_PREFIX) {
    set_err(err, err_size, "%s: model.continuing_subword_prefix is over %d bytes", path,
            MAX_PREFIX - 1);
  } else if (j->bad_vocab[0] || j->vocab_seen != t->n_tokens) {
    if (j->bad_vocab[0])
      set_err(err, err_size,
              "%s: model.vocab disagrees with vocab.txt: \"%s\" has id %lld there (-1: not a "
              "whole number) and %d in vocab.txt (-1: absent)",
              path, j->bad_vocab, j->bad_vocab_id, (int)vocab_id(t, j->bad_vocab));
    else
      set_err(err, err_size, "%s: model.vocab disagrees with vocab.txt: %zu tokens for %zu lines",
              path, j->vocab_seen, t->n_tokens);
  } else if (strcmp(j->pp_type, "TemplateProcessing") != 0 || parts != 3 || strcmp(mid, "A") != 0) {
    set_err(err, err_size,
            "%s: post_processor must be a TemplateProcessing whose single is "
            "\"special A special\" (found \"%s\", \"%s\")",
            path, j->pp_type, j->tmpl);
  } else if ((t->cls_id = vocab_id(t, cls)) < 0 || (t->sep_id = vocab_id(t, sep)) < 0 ||
             (t->unk_id = vocab_id(t, j->unk)) < 0) {
    set_err(err, err_size, "%s: \"%s\", \"%s\" or \"%s\" is not in vocab.txt", path, cls, sep,
            j->unk);
  } else if ((bad_special = special_disagrees(j)) != NULL) {
    set_err(err, err_size,
            "%s: post_processor.special_tokens gives \"%s\" %zu ids, the first %lld; vocab.txt "
            "gives it the one id %d",
            path, bad_special->name, bad_special->ids, bad_special->id,
            (int)vocab_id(t, bad_special->name));
  } else {
    t->clean_text = j->flags[0], t->chinese = j->flags[1], t->lowercase = j->flags[3];
    t->strip_accents = j->flags[2] < 0 ? t->lowercase : j->flags[2]; // None follows lowercase
    t->max_word_chars = (size_t)j->max_chars;
    t->prefix_len = strlen(j->prefix);
    memcpy(t->prefix, j->prefix, t->prefix_len + 1);
    rc = 0;
  }
  free(j);
  free(text);
  return rc;
}

static int add_default_tokens(embed_tokenizer_t *t, char *err, size_t err_size) {
  static const char *const names[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int32_t id = vocab_id(t, names[i]);
    if (id < 0) continue;
    added_token *a = &t->added[t->n_added];
    a->len = strlen(names[i]);
    if (!(a->text = malloc(a->len + 1))) {
      set_err(err, err_size, "out of memory");
      return -1;
    }
    memcpy(a->text, names[i], a->len + 1);
    a->id = id;
    t->n_added++;
  }
  t->unk_id = vocab_id(t, "[UNK]"), t->cls_id = vocab_id(t, "[CLS]"),
  t->sep_id = vocab_id(t, "[SEP]");
  if (t->unk_id < 0 || t->cls_id < 0 || t->sep_id < 0) {
    set_err(err, err_size,
            "vocab.txt lacks [UNK], [CLS] or [SEP] (and there is no tokenizer.json)");
    return -1;
  }
  return 0;
}

int embed_tokenizer_load(const char *model_dir, embed_tokenizer_t **out, char *err,
                         size_t err_size) {
  if (!model_dir || !out) {
    set_err(err, err_size, "embed_tokenizer_load: NULL model_dir or out");
    return -1;
  }
  *out = NULL;
  size_t dir_len = strlen(model_dir);
  char *path = malloc(dir_len + sizeof "/tokenizer.json");
  embed_tokenizer_t *t = calloc(1, sizeof *t);
  if (!path || !t) {
    free(path), free(t);
    set_err(err, err_size, "embed_tokenizer_load: out of memory");
    return -1;
  }
  *t = (embed_tokenizer_t){.max_word_chars = 100,
                           .prefix = "##",
                           .prefix_len = 2,
                           .clean_text = true,
                           .chinese = true,
                           .strip_accents = true,
                           .lowercase = true};
  snprintf(path, dir_len + sizeof "/tokenizer.json", "%s/vocab.txt", model_dir);
  int rc = load_vocab(t, path, err, err_size);
  if (rc == 0) {
    snprintf(path, dir_len + sizeof "/tokenizer.json", "%s/tokenizer.json", model_dir);
    rc = load_json(t, path, err, err_size);
    if (rc == 1) rc = add_default_tokens(t, err, err_size); // no tokenizer.json
  }
  for (size_t i = 0; rc == 0 && i < t->n_added; i++) {
    unsigned b = (unsigned char)t->added[i].text[0];
    t->added_first[b >> 3] |= (uint8_t)(1u << (b & 7));
    if (!valid_utf8(t->added[i].text, t->added[i].len) || t->added[i].id < 0) {
      set_err(err, err_size, "%s: added token \"%s\" is not valid UTF-8 or has no id", path,
              t->added[i].text);
      rc = -1;
    }
  }
  free(path);
  if (rc) {
    embed_tokenizer_free(t);
    return -1;
  }
  *out = t;
  return 0;
}

size_t embed_tokenizer_id_count(const embed_tokenizer_t *tok) {
  size_t count = tok->n_tokens;
  for (size_t i = 0; i < tok->n_added; i++)
    if ((size_t)tok->added[i].id >= count) count = (size_t)tok->added[i].id + 1;
  return count;
}

void embed_tokenizer_free(embed_tokenizer_t *tok) {
  if (!tok) return;
  for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].text);
  free(tok->slots);
  free(tok->arena);
  free(tok);
}
