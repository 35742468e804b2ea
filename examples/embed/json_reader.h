// A JSON reader just big enough for the model folder's settings (tokenizer.json,
// config.json): it walks a document and hands each scalar, and each object's end, to a
// visitor with the path of its container. MIT licence, part of devbuf.
#ifndef EMBED_JSON_READER_H
#define EMBED_JSON_READER_H

#include <stdbool.h>
#include <stddef.h>

// Reads a whole regular file into memory, NUL-terminated (free it). Returns 0, 1 when it does
// not exist (and missing_ok), or -1 with a message naming the path in err (a FIFO, a folder
// or a device is refused without blocking).
int embed_read_file(const char *path, bool missing_ok, char **out, size_t *out_len, char *err,
                    size_t err_size);

typedef enum json_type {
  JSON_STRING,
  JSON_NUMBER,
  JSON_TRUE,
  JSON_FALSE,
  JSON_NULL,
  JSON_OBJECT_END
} json_type;

typedef struct json_item {
  // The container: "" at the top level, keys joined by '.', "[]" for an array's elements:
  // "model", "added_tokens[]", "post_processor.single[].SpecialToken".
  const char *path;
  const char *key; // the member's key; "" in an array and for JSON_OBJECT_END
  bool key_cut;    // the key had more than 255 bytes: what follows them is dropped
  json_type type;
  const char *text; // a string, unescaped ("" for other types)
  bool text_cut;    // the string had more than 1023 bytes: what follows them is dropped
  double number;    // a number's value
  long long whole;  // a number without fraction or exponent (capped near 10^12), else -1
} json_item;

// What a visitor says: NULL to go on, or a message that ends the walk as its error.
typedef const char *(*json_visit_fn)(void *context, const json_item *item);

// Walks `len` bytes of `text`, one document (64 levels deep at most). Returns 0, or -1 with
// "NAME: line N: problem" in err: malformed JSON, or the visitor's message.
int json_walk(const char *text, size_t len, const char *name, json_visit_fn visit, void *context,
              char *err, size_t err_size);

#endif
