// The model folder's settings against the model this program runs (model.h). A folder of
// another model with tensors of the same shapes (all-MiniLM-L12-v2: six more layers; a CLS
// pooling; another epsilon or activation) would otherwise load and give wrong embeddings
// without a word.
#include "json_reader.h"
#include "kernels.h"
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { WANT_NUMBER, WANT_TEXT, WANT_TRUE, WANT_FALSE } want_kind;

// One top-level key of a settings file and the value the program needs. `required`: a file
// without it means the value of the library that wrote it (transformers' BertConfig, whose
// defaults are BERT-base's), not this model's.
typedef struct expectation {
  const char *key;
  want_kind kind;
  double number;
  const char *text;
  bool required;
} expectation;

static const expectation bert_config[] = {
    {"hidden_size", WANT_NUMBER, EMBED_HIDDEN, NULL, true},
    {"num_attention_heads", WANT_NUMBER, EMBED_HEADS, NULL, true},
    {"num_hidden_layers", WANT_NUMBER, EMBED_LAYERS, NULL, true},
    {"intermediate_size", WANT_NUMBER, EMBED_FFN, NULL, true},
    {"vocab_size", WANT_NUMBER, EMBED_VOCAB, NULL, true},
    {"max_position_embeddings", WANT_NUMBER, EMBED_POSITIONS, NULL, true},
    {"type_vocab_size", WANT_NUMBER, 2, NULL, true},
    {"layer_norm_eps", WANT_NUMBER, 1e-12, NULL, false},
    {"hidden_act", WANT_TEXT, 0, "gelu", false},
    {"position_embedding_type", WANT_TEXT, 0, "absolute", false},
    {"model_type", WANT_TEXT, 0, "bert", false},
};

static const expectation pooling_config[] = {
    {"word_embedding_dimension", WANT_NUMBER, EMBED_HIDDEN, NULL, false},
    {"pooling_mode_mean_tokens", WANT_TRUE, 0, NULL, true},
    {"pooling_mode_cls_token", WANT_FALSE, 0, NULL, false},
    {"pooling_mode_max_tokens", WANT_FALSE, 0, NULL, false},
    {"pooling_mode_mean_sqrt_len_tokens", WANT_FALSE, 0, NULL, false},
    {"pooling_mode_weightedmean_tokens", WANT_FALSE, 0, NULL, false},
    {"pooling_mode_lasttoken", WANT_FALSE, 0, NULL, false},
};

#define MAX_KEYS    16
#define MAX_MODULES 8

// What the walk of one file found.
typedef struct found {
  const expectation *expected;
  size_t count;
  json_type type[MAX_KEYS];
  double number[MAX_KEYS];
  char text[MAX_KEYS][32];
  bool seen[MAX_KEYS];
  // modules.json: the type of each module, in order
  char modules[MAX_MODULES][64];
  size_t module_count;
  size_t max_seq_length; // sentence_bert_config.json; 0 when absent
  bool max_seq_length_bad;
} found;

static const char *visit_setting(void *context, const json_item *item) {
  found *f = context;
  if (item->type == JSON_OBJECT_END) return NULL;
  if (strcmp(item->path, "[]") == 0 && strcmp(item->key, "type") == 0) { // modules.json
    if (f->module_count == MAX_MODULES) return "more modules than the model has";
    snprintf(f->modules[f->module_count++], sizeof f->modules[0], "%s", item->text);
    return NULL;
  }
  if (item->path[0]) return NULL; // only the top level's keys say anything here
  if (strcmp(item->key, "max_seq_length") == 0) {
    f->max_seq_length_bad = item->type != JSON_NUMBER || item->whole < 2;
    f->max_seq_length = f->max_seq_length_bad ? 0 : (size_t)item->whole;
  }
  for (size_t i = 0; i < f->count; i++) {
    if (strcmp(item->key, f->expected[i].key) != 0) continue;
    f->seen[i] = true;
    f->type[i] = item->type;
    f->number[i] = item->number;
    snprintf(f->text[i], sizeof f->text[i], "%s", item->text);
  }
  return NULL;
}

// Whether value i is what the model needs; its description in `have` when not.
static bool meets(const found *f, size_t i, char *have, size_t have_size) {
  const expectation *e = &f->expected[i];
  if (!f->seen[i]) {
    snprintf(have, have_size, "absent");
    return !e->required;
  }
  json_type type = f->type[i];
  switch (type) {
  case JSON_NUMBER:
    snprintf(have, have_size, "%.10g", f->number[i]);
    break;
  case JSON_STRING:
    snprintf(have, have_size, "\"%s\"", f->text[i]);
    break;
  default:
    snprintf(have, have_size, "%s",
             type == JSON_TRUE    ? "true"
             : type == JSON_FALSE ? "false"
                                  : "null or an object");
  }
  switch (e->kind) {
  case WANT_NUMBER: // the epsilon as a float32 kernel sees it; the sizes exactly
    return type == JSON_NUMBER && fabs(f->number[i] - e->number) <= fabs(e->number) * 1e-6;
  case WANT_TEXT:
    return type == JSON_STRING && strcmp(f->text[i], e->text) == 0;
  case WANT_TRUE:
    return type == JSON_TRUE;
  case WANT_FALSE:
    return type == JSON_FALSE;
  }
  return false;
}

static void describe_wanted(const expectation *e, char *out, size_t size) {
  if (e->kind == WANT_NUMBER)
    snprintf(out, size, "%.10g", e->number);
  else if (e->kind == WANT_TEXT)
    snprintf(out, size, "\"%s\"", e->text);
  else
    snprintf(out, size, "%s", e->kind == WANT_TRUE ? "true" : "false");
}

// Reads `dir`/`name` (absent: 1) into *f with the expectations given; 0, or -1 with err set.
static int read_settings(const char *dir, const char *name, const expectation *expected,
                         size_t count, found *f, char *err, size_t err_size) {
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
    snprintf(err, err_size, "model folder '%.200s...': path too long", dir);
    return -1;
  }
  *f = (found){.expected = expected, .count = count};
  char *text = NULL;
  size_t length = 0;
  int rc = embed_read_file(path, true, &text, &length, err, err_size);
  if (rc) return rc;
  rc = json_walk(text, length, path, visit_setting, f, err, err_size);
  free(text);
  if (rc) return rc;
  for (size_t i = 0; i < count; i++) {
    char have[64], want[64];
    if (meets(f, i, have, sizeof have)) continue;
    describe_wanted(&expected[i], want, sizeof want);
    snprintf(err, err_size,
             "%s: \"%s\" is %s; this program runs all-MiniLM-L6-v2, which has %s (another model "
             "would give wrong embeddings)",
             path, expected[i].key, have, want);
    return -1;
  }
  return 0;
}

int embed_model_check_settings(const char *dir, size_t *out_max_tokens, char *err,
                               size_t err_size) {
  *out_max_tokens = EMBED_MAX_TOKENS;
  found *f = malloc(sizeof *f);
  if (!f) {
    snprintf(err, err_size, "no memory to read the model's settings");
    return -1;
  }
  int rc = read_settings(dir, "config.json", bert_config,
                         sizeof bert_config / sizeof bert_config[0], f, err, err_size);
  if (rc != -1)
    rc = read_settings(dir, "1_Pooling/config.json", pooling_config,
                       sizeof pooling_config / sizeof pooling_config[0], f, err, err_size);
  if (rc != -1 && (rc = read_settings(dir, "modules.json", NULL, 0, f, err, err_size)) == 0) {
    // The modules sentence-transformers runs, in order: this program runs these three.
    static const char *const modules[] = {"sentence_transformers.models.Transformer",
                                          "sentence_transformers.models.Pooling",
                                          "sentence_transformers.models.Normalize"};
    bool same = f->module_count == 3;
    for (size_t i = 0; same && i < 3; i++) same = strcmp(f->modules[i], modules[i]) == 0;
    if (!same) {
      snprintf(err, err_size,
               "%s/modules.json: %zu modules (the first \"%s\"); this program runs "
               "Transformer, Pooling (mean), Normalize",
               dir, f->module_count, f->module_count ? f->modules[0] : "");
      rc = -1;
    }
  }
  if (rc != -1 &&
      (rc = read_settings(dir, "sentence_bert_config.json", NULL, 0, f, err, err_size)) == 0) {
    if (f->max_seq_length_bad || f->max_seq_length > EMBED_MAX_TOKENS) {
      snprintf(err, err_size,
               "%s/sentence_bert_config.json: max_seq_length must be a whole number from 2 to "
               "%d (the longest sequence this program runs)",
               dir, EMBED_MAX_TOKENS);
      rc = -1;
    } else if (f->max_seq_length) { // truncated where sentence-transformers truncates
      *out_max_tokens = f->max_seq_length;
    }
  }
  free(f);
  return rc == -1 ? -1 : 0;
}
