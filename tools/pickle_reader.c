// The restricted unpickler of pickle_reader.h. One loop over the opcodes, a stack of value
// pointers with a stack of marks (the fence below which an opcode may not pop), a memo
// array, and an arena that owns every value: nothing recurses and nothing is freed before
// the whole tree. Where an accepted pickle is concerned, what it builds is what CPython's
// _pickle.c builds with snapshot_to_trace.py's find_class (a class becomes an inert
// dictionary: REDUCE gives it "__args__", BUILD "__state__", NEWOBJ leaves it empty).
#include "pickle_reader.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the arena: chunks of at least 64 KiB, charged to the tree's budget -------------------

typedef struct arena_chunk {
  struct arena_chunk *next;
  size_t used, capacity; // bytes of data
  _Alignas(16) unsigned char data[];
} arena_chunk;

struct devbuf_pickle {
  arena_chunk *chunks; // newest first
  size_t memory;       // bytes taken: chunks, stack, memo (at most `budget`)
  size_t budget;
};

typedef struct reader {
  const uint8_t *data;
  size_t size, at;       // input and the next byte to read
  size_t op_offset;      // where the current opcode starts
  uint8_t opcode;        // the current opcode
  devbuf_pickle *pickle; // the tree's owner
  devbuf_pickle_value **stack;
  size_t depth, stack_capacity;
  size_t marks[DEVBUF_PICKLE_MAX_MARKS]; // stack depths at each open MARK
  size_t mark_count;
  devbuf_pickle_value **memo;       // NULL where no value is stored
  size_t memo_capacity, memo_count; // entries; entries set (MEMOIZE stores at memo_count)
  char *message;
  size_t message_capacity;
} reader;

// Shared by every tree: never changed once made (only containers change).
static devbuf_pickle_value none_value = {.kind = DEVBUF_PICKLE_NONE, .hashable = true};
static devbuf_pickle_value true_value = {
    .kind = DEVBUF_PICKLE_BOOL, .hashable = true, .as.integer = 1};
static devbuf_pickle_value false_value = {.kind = DEVBUF_PICKLE_BOOL, .hashable = true};

static const char *const opcode_names[256] = {
    ['('] = "MARK",
    ['.'] = "STOP",
    ['0'] = "POP",
    ['1'] = "POP_MARK",
    ['2'] = "DUP",
    ['F'] = "FLOAT",
    ['I'] = "INT",
    ['J'] = "BININT",
    ['K'] = "BININT1",
    ['L'] = "LONG",
    ['M'] = "BININT2",
    ['N'] = "NONE",
    ['P'] = "PERSID",
    ['Q'] = "BINPERSID",
    ['R'] = "REDUCE",
    ['S'] = "STRING",
    ['T'] = "BINSTRING",
    ['U'] = "SHORT_BINSTRING",
    ['V'] = "UNICODE",
    ['X'] = "BINUNICODE",
    ['a'] = "APPEND",
    ['b'] = "BUILD",
    ['c'] = "GLOBAL",
    ['d'] = "DICT",
    ['}'] = "EMPTY_DICT",
    ['e'] = "APPENDS",
    ['g'] = "GET",
    ['h'] = "BINGET",
    ['i'] = "INST",
    ['j'] = "LONG_BINGET",
    ['l'] = "LIST",
    [']'] = "EMPTY_LIST",
    ['o'] = "OBJ",
    ['p'] = "PUT",
    ['q'] = "BINPUT",
    ['r'] = "LONG_BINPUT",
    ['s'] = "SETITEM",
    ['t'] = "TUPLE",
    [')'] = "EMPTY_TUPLE",
    ['u'] = "SETITEMS",
    ['G'] = "BINFLOAT",
    [0x80] = "PROTO",
    [0x81] = "NEWOBJ",
    [0x82] = "EXT1",
    [0x83] = "EXT2",
    [0x84] = "EXT4",
    [0x85] = "TUPLE1",
    [0x86] = "TUPLE2",
    [0x87] = "TUPLE3",
    [0x88] = "NEWTRUE",
    [0x89] = "NEWFALSE",
    [0x8a] = "LONG1",
    [0x8b] = "LONG4",
    ['B'] = "BINBYTES",
    ['C'] = "SHORT_BINBYTES",
    [0x8c] = "SHORT_BINUNICODE",
    [0x8d] = "BINUNICODE8",
    [0x8e] = "BINBYTES8",
    [0x8f] = "EMPTY_SET",
    [0x90] = "ADDITEMS",
    [0x91] = "FROZENSET",
    [0x92] = "NEWOBJ_EX",
    [0x93] = "STACK_GLOBAL",
    [0x94] = "MEMOIZE",
    [0x95] = "FRAME",
    [0x96] = "BYTEARRAY8",
    [0x97] = "NEXT_BUFFER",
    [0x98] = "READONLY_BUFFER",
};

const char *devbuf_pickle_opcode_name(uint8_t opcode) { return opcode_names[opcode]; }

bool devbuf_pickle_sniff(const uint8_t *data, size_t size) {
  return size >= 2 && data[0] == 0x80 && data[1] >= 2 && data[1] <= 5;
}

// ---- errors: "offset N (OPCODE): what" ----------------------------------------------------

__attribute__((format(printf, 2, 3))) static int fail(reader *r, const char *format, ...) {
  const char *name = opcode_names[r->opcode];
  int used =
      name ? snprintf(r->message, r->message_capacity, "offset %zu (%s): ", r->op_offset, name)
           : snprintf(r->message, r->message_capacity, "offset %zu (byte 0x%02x): ", r->op_offset,
                      r->opcode);
  if (used < 0 || (size_t)used >= r->message_capacity) return -1;
  va_list args;
  va_start(args, format);
  vsnprintf(r->message + used, r->message_capacity - (size_t)used, format, args);
  va_end(args);
  return -1;
}

// ---- memory -------------------------------------------------------------------------------

static int charge(reader *r, size_t bytes) {
  devbuf_pickle *p = r->pickle;
  if (bytes > p->budget - p->memory)
    return fail(r,
                "the pickle would take more than %zu bytes of memory (%d times its size, "
                "plus %zu): refused",
                p->budget, DEVBUF_PICKLE_MEMORY_PER_BYTE, DEVBUF_PICKLE_MEMORY_FLOOR);
  p->memory += bytes;
  return 0;
}

static void *arena_alloc(reader *r, size_t bytes) {
  bytes = (bytes + 15) & ~(size_t)15;
  arena_chunk *chunk = r->pickle->chunks;
  if (!chunk || chunk->capacity - chunk->used < bytes) {
    size_t capacity = bytes > ((size_t)64 << 10) ? bytes : (size_t)64 << 10;
    if (charge(r, sizeof *chunk + capacity)) return NULL;
    chunk = malloc(sizeof *chunk + capacity);
    if (!chunk) {
      fail(r, "out of memory");
      return NULL;
    }
    *chunk = (arena_chunk){.next = r->pickle->chunks, .capacity = capacity};
    r->pickle->chunks = chunk;
  }
  void *at = chunk->data + chunk->used;
  chunk->used += bytes;
  return at;
}

// A new value of `kind`, made by the current opcode.
static devbuf_pickle_value *new_value(reader *r, devbuf_pickle_kind kind, bool hashable) {
  devbuf_pickle_value *value = arena_alloc(r, sizeof *value);
  if (value)
    *value = (devbuf_pickle_value){
        .kind = (uint8_t)kind, .hashable = hashable, .offset = (uint32_t)r->op_offset};
  return value;
}

// Room for `more` items in a container (arrays double; the old one stays in the arena).
static int reserve_items(reader *r, devbuf_pickle_value *container, size_t more) {
  size_t count = container->as.list.count, capacity = container->as.list.capacity;
  if (more <= capacity - count) return 0;
  size_t wanted = capacity ? capacity : 4;
  while (wanted - count < more) {
    if (wanted > SIZE_MAX / 2 / sizeof(void *)) return fail(r, "container too large");
    wanted *= 2;
  }
  devbuf_pickle_value **items = arena_alloc(r, wanted * sizeof *items);
  if (!items) return -1;
  if (count) memcpy(items, container->as.list.items, count * sizeof *items);
  container->as.list.items = items;
  container->as.list.capacity = wanted;
  return 0;
}

// A container of `kind` holding `count` items from `items`.
static devbuf_pickle_value *new_container(reader *r, devbuf_pickle_kind kind,
                                          devbuf_pickle_value *const *items, size_t count) {
  bool hashable = kind == DEVBUF_PICKLE_TUPLE;
  for (size_t i = 0; hashable && i < count; i++) hashable = items[i]->hashable;
  devbuf_pickle_value *value = new_value(r, kind, hashable);
  if (!value || !count) return value;
  value->as.list.items = arena_alloc(r, count * sizeof *items); // exactly: most never grow
  if (!value->as.list.items) return NULL;
  memcpy(value->as.list.items, items, count * sizeof *items);
  value->as.list.count = value->as.list.capacity = count;
  return value;
}

// ---- the stack and its marks --------------------------------------------------------------

static size_t fence(const reader *r) { return r->mark_count ? r->marks[r->mark_count - 1] : 0; }

static int grow_stack(reader *r) {
  size_t capacity = r->stack_capacity ? r->stack_capacity * 2 : 256;
  if (charge(r, (capacity - r->stack_capacity) * sizeof *r->stack)) return -1;
  devbuf_pickle_value **stack = realloc(r->stack, capacity * sizeof *stack);
  if (!stack) return fail(r, "out of memory");
  r->stack = stack;
  r->stack_capacity = capacity;
  return 0;
}

static int push(reader *r, devbuf_pickle_value *value) {
  if (!value || (r->depth == r->stack_capacity && grow_stack(r))) return -1;
  r->stack[r->depth++] = value;
  return 0;
}

// The top value above the fence, or NULL (with the message) where there is none.
static devbuf_pickle_value *top(reader *r) {
  if (r->depth <= fence(r)) {
    fail(r, "the stack is empty%s", r->mark_count ? " above the last MARK" : "");
    return NULL;
  }
  return r->stack[r->depth - 1];
}

static devbuf_pickle_value *pop(reader *r) {
  devbuf_pickle_value *value = top(r);
  if (value) r->depth--;
  return value;
}

// Closes the last mark: the items above it start at `*out_first`, `*out_count` of them
// (still on the stack, which now ends at the mark).
static int pop_mark(reader *r, size_t *out_first, size_t *out_count) {
  if (!r->mark_count) return fail(r, "no MARK to close");
  size_t mark = r->marks[--r->mark_count];
  *out_first = mark;
  *out_count = r->depth - mark;
  r->depth = mark;
  return 0;
}

// ---- the memo -----------------------------------------------------------------------------

static int memo_put(reader *r, uint64_t index) {
  devbuf_pickle_value *value = top(r);
  if (!value) return -1;
  // A pickler numbers its memo from 0 with at most one entry per byte it wrote.
  if (index >= r->size)
    return fail(r, "memo index %llu is past what a %zu-byte pickle can hold",
                (unsigned long long)index, r->size);
  if (index >= r->memo_capacity) {
    size_t capacity = r->memo_capacity ? r->memo_capacity : 256;
    while (capacity <= index) capacity *= 2;
    if (capacity > r->size) capacity = r->size;
    if (charge(r, (capacity - r->memo_capacity) * sizeof *r->memo)) return -1;
    devbuf_pickle_value **memo = realloc(r->memo, capacity * sizeof *memo);
    if (!memo) return fail(r, "out of memory");
    memset(memo + r->memo_capacity, 0, (capacity - r->memo_capacity) * sizeof *memo);
    r->memo = memo;
    r->memo_capacity = capacity;
  }
  if (!r->memo[index]) r->memo_count++;
  r->memo[index] = value;
  return 0;
}

static int memo_get(reader *r, uint64_t index) {
  if (index >= r->memo_capacity || !r->memo[index])
    return fail(r, "memo index %llu was never stored", (unsigned long long)index);
  return push(r, r->memo[index]);
}

// ---- reading the input --------------------------------------------------------------------

// `bytes` more bytes of the input, or NULL (with the message) when fewer are left.
static const uint8_t *take(reader *r, uint64_t bytes, const char *what) {
  size_t left = r->size - r->at;
  if (bytes > left) {
    fail(r, "%s of %llu bytes runs past the end of the input (%zu bytes left)", what,
         (unsigned long long)bytes, left);
    return NULL;
  }
  const uint8_t *at = r->data + r->at;
  r->at += (size_t)bytes;
  return at;
}

static int take_unsigned(reader *r, unsigned bytes, uint64_t *out) {
  const uint8_t *at = take(r, bytes, "the argument");
  if (!at) return -1;
  uint64_t value = 0;
  for (unsigned i = 0; i < bytes; i++) value |= (uint64_t)at[i] << (8 * i);
  *out = value;
  return 0;
}

// A line ended by '\n' (GLOBAL's names, PUT's and GET's numbers), without the '\n'.
static const uint8_t *take_line(reader *r, size_t *out_length) {
  const uint8_t *start = r->data + r->at;
  const uint8_t *end = memchr(start, '\n', r->size - r->at);
  if (!end) {
    fail(r, "a line with no end before the end of the input");
    return NULL;
  }
  *out_length = (size_t)(end - start);
  r->at += *out_length + 1;
  return start;
}

// Well-formed UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
static bool valid_utf8(const uint8_t *s, size_t length) {
  for (size_t i = 0; i < length;) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n = c >= 0xc2 && c <= 0xdf   ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    if (!n || n > length - i) return false;
    for (size_t k = 1; k < n; k++)
      if ((s[i + k] & 0xc0) != 0x80) return false;
    if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f) ||
        (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] > 0x8f))
      return false;
    i += n;
  }
  return true;
}

static int push_text(reader *r, devbuf_pickle_kind kind, uint64_t length) {
  const uint8_t *at = take(r, length, kind == DEVBUF_PICKLE_STR ? "a string" : "a bytes object");
  if (!at) return -1;
  if (kind == DEVBUF_PICKLE_STR && !valid_utf8(at, (size_t)length))
    return fail(r, "a string of %llu bytes that is not well-formed UTF-8",
                (unsigned long long)length);
  devbuf_pickle_value *value = new_value(r, kind, true);
  if (!value) return -1;
  value->as.text.bytes = (const char *)at;
  value->as.text.length = (size_t)length;
  return push(r, value);
}

static int push_int(reader *r, int64_t integer) {
  devbuf_pickle_value *value = new_value(r, DEVBUF_PICKLE_INT, true);
  if (value) value->as.integer = integer;
  return push(r, value);
}

// LONG1 and LONG4: little-endian two's complement of `length` bytes. Python reads any length;
// a value int64 holds is an INT, whatever bytes wrote it, and a longer one a BIGINT that
// points at its bytes: a snapshot refused whole for one frame's line of 2^64 - 1 (9 bytes, a
// C++ frame's unknown line as an unsigned 64-bit number) was refused for nothing it needs.
static int push_long(reader *r, uint64_t length) {
  const uint8_t *at = take(r, length, "an integer");
  if (!at) return -1;
  size_t used = (size_t)length; // less the sign bytes that repeat the bit below them
  while (used > 1 && ((at[used - 1] == 0x00 && !(at[used - 2] & 0x80)) ||
                      (at[used - 1] == 0xff && (at[used - 2] & 0x80))))
    used--;
  if (used > 8) {
    devbuf_pickle_value *value = new_value(r, DEVBUF_PICKLE_BIGINT, true);
    if (!value) return -1;
    value->as.text.bytes = (const char *)at;
    value->as.text.length = used;
    return push(r, value);
  }
  uint64_t bits = 0;
  for (size_t i = 0; i < used; i++) bits |= (uint64_t)at[i] << (8 * i);
  if (used && used < 8 && (at[used - 1] & 0x80)) bits |= ~(uint64_t)0 << (8 * used);
  int64_t integer;
  memcpy(&integer, &bits, sizeof integer);
  return push_int(r, integer);
}

// A class reference "module.name" (both well-formed UTF-8).
static int push_class(reader *r, const uint8_t *module, size_t module_length, const uint8_t *name,
                      size_t name_length) {
  if (!valid_utf8(module, module_length) || !valid_utf8(name, name_length))
    return fail(r, "a class name that is not well-formed UTF-8");
  devbuf_pickle_value *value = new_value(r, DEVBUF_PICKLE_CLASS, true);
  char *text = value ? arena_alloc(r, module_length + 1 + name_length) : NULL;
  if (!text) return -1;
  memcpy(text, module, module_length);
  text[module_length] = '.';
  memcpy(text + module_length + 1, name, name_length);
  value->as.text.bytes = text;
  value->as.text.length = module_length + 1 + name_length;
  return push(r, value);
}

// A decimal line (PUT, GET).
static int take_decimal(reader *r, uint64_t *out) {
  size_t length;
  const uint8_t *line = take_line(r, &length);
  if (!line) return -1;
  uint64_t value = 0;
  if (!length || length > 18) return fail(r, "not a memo index of 1 to 18 digits");
  for (size_t i = 0; i < length; i++) {
    if (line[i] < '0' || line[i] > '9') return fail(r, "not a memo index of 1 to 18 digits");
    value = value * 10 + (uint64_t)(line[i] - '0');
  }
  *out = value;
  return 0;
}

// ---- dictionaries and inert objects -------------------------------------------------------

const char *devbuf_pickle_kind_name(const devbuf_pickle_value *value) {
  static const char *const names[] = {"None", "bool",  "int",  "float", "str", "bytes",
                                      "list", "tuple", "dict", "class", "int"};
  if (value->kind == DEVBUF_PICKLE_DICT && value->type) return "inert object";
  return names[value->kind];
}

// Sets `count` / 2 key-value pairs from `items` in `dict`.
static int set_items(reader *r, devbuf_pickle_value *dict, devbuf_pickle_value *const *items,
                     size_t count) {
  if (count % 2) return fail(r, "an odd number of items (%zu) for a dictionary", count);
  if (!count) return 0; // CPython sets nothing, whatever the target is
  if (dict->kind != DEVBUF_PICKLE_DICT)
    return fail(r, "items set in a %s, not a dictionary", devbuf_pickle_kind_name(dict));
  for (size_t i = 0; i < count; i += 2)
    if (!items[i]->hashable)
      return fail(r, "a %s as a dictionary key", devbuf_pickle_kind_name(items[i]));
  if (reserve_items(r, dict, count)) return -1;
  memcpy(dict->as.list.items + dict->as.list.count, items, count * sizeof *items);
  dict->as.list.count += count;
  return 0;
}

static int append_items(reader *r, devbuf_pickle_value *list, devbuf_pickle_value *const *items,
                        size_t count) {
  if (!count) return 0;
  if (list->kind != DEVBUF_PICKLE_LIST)
    return fail(r, "items appended to a %s, not a list", devbuf_pickle_kind_name(list));
  if (reserve_items(r, list, count)) return -1;
  memcpy(list->as.list.items + list->as.list.count, items, count * sizeof *items);
  list->as.list.count += count;
  return 0;
}

// A string key made by the reader (inert objects' "__args__" and "__state__").
static devbuf_pickle_value *key_value(reader *r, const char *key) {
  devbuf_pickle_value *value = new_value(r, DEVBUF_PICKLE_STR, true);
  if (value) {
    value->as.text.bytes = key;
    value->as.text.length = strlen(key);
  }
  return value;
}

// REDUCE (`arguments` non-NULL: the object gets "__args__", a list of them) and NEWOBJ
// (NULL: an empty object) on a class reference.
static int push_inert(reader *r, const devbuf_pickle_value *type,
                      const devbuf_pickle_value *arguments) {
  if (type->kind != DEVBUF_PICKLE_CLASS)
    return fail(r, "a %s called: only class references make objects",
                devbuf_pickle_kind_name(type));
  if (arguments && arguments->kind != DEVBUF_PICKLE_TUPLE)
    return fail(r, "arguments in a %s, not a tuple", devbuf_pickle_kind_name(arguments));
  devbuf_pickle_value *object = new_value(r, DEVBUF_PICKLE_DICT, false);
  if (!object) return -1;
  object->type = type;
  if (arguments) {
    devbuf_pickle_value *entry[2] = {key_value(r, "__args__"), NULL};
    if (entry[0])
      entry[1] =
          new_container(r, DEVBUF_PICKLE_LIST, arguments->as.list.items, arguments->as.list.count);
    if (!entry[1] || set_items(r, object, entry, 2)) return -1;
  }
  return push(r, object);
}

// ---- the opcodes --------------------------------------------------------------------------

static int step(reader *r, bool *stopped) {
  r->op_offset = r->at;
  r->opcode = r->data[r->at++];
  uint64_t n = 0;
  size_t first = 0, count = 0;
  devbuf_pickle_value *a, *b;
  switch (r->opcode) {
  case 0x80: // PROTO
    return fail(r, "a second PROTO");
  case 0x95: // FRAME: a hint for buffered readers; its length must fit the input
    if (take_unsigned(r, 8, &n)) return -1;
    if (n > r->size - r->at)
      return fail(r, "a frame of %llu bytes runs past the end of the input (%zu bytes left)",
                  (unsigned long long)n, r->size - r->at);
    return 0;
  case '.': // STOP
    if (!top(r)) return -1;
    *stopped = true;
    return 0;
  case '(': // MARK
    if (r->mark_count == DEVBUF_PICKLE_MAX_MARKS)
      return fail(r, "more than %d containers nested", DEVBUF_PICKLE_MAX_MARKS);
    r->marks[r->mark_count++] = r->depth;
    return 0;
  case '0': // POP: a value, or the last mark where it is on top
    if (r->mark_count && r->marks[r->mark_count - 1] == r->depth) {
      r->mark_count--;
      return 0;
    }
    return pop(r) ? 0 : -1;
  case '1': // POP_MARK
    return pop_mark(r, &first, &count);
  case '2': // DUP
    return (a = top(r)) ? push(r, a) : -1;
  case 'N':
    return push(r, &none_value);
  case 0x88: // NEWTRUE
    return push(r, &true_value);
  case 0x89: // NEWFALSE
    return push(r, &false_value);
  case 'J': // BININT: signed 32-bit
    if (take_unsigned(r, 4, &n)) return -1;
    return push_int(r, (int64_t)(int32_t)(uint32_t)n);
  case 'K': // BININT1
    if (take_unsigned(r, 1, &n)) return -1;
    return push_int(r, (int64_t)n);
  case 'M': // BININT2
    if (take_unsigned(r, 2, &n)) return -1;
    return push_int(r, (int64_t)n);
  case 0x8a: // LONG1
    if (take_unsigned(r, 1, &n)) return -1;
    return push_long(r, n);
  case 0x8b: // LONG4: a signed 32-bit length
    if (take_unsigned(r, 4, &n)) return -1;
    if (n & 0x80000000u) return fail(r, "a negative length");
    return push_long(r, n);
  case 'G': { // BINFLOAT: big-endian IEEE double
    const uint8_t *at = take(r, 8, "a float");
    if (!at) return -1;
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++) bits = bits << 8 | at[i];
    devbuf_pickle_value *value = new_value(r, DEVBUF_PICKLE_FLOAT, true);
    if (value) memcpy(&value->as.number, &bits, sizeof bits);
    return push(r, value);
  }
  case 0x8c: // SHORT_BINUNICODE
    return take_unsigned(r, 1, &n) ? -1 : push_text(r, DEVBUF_PICKLE_STR, n);
  case 'X': // BINUNICODE
    return take_unsigned(r, 4, &n) ? -1 : push_text(r, DEVBUF_PICKLE_STR, n);
  case 0x8d: // BINUNICODE8
    return take_unsigned(r, 8, &n) ? -1 : push_text(r, DEVBUF_PICKLE_STR, n);
  case 'C': // SHORT_BINBYTES
    return take_unsigned(r, 1, &n) ? -1 : push_text(r, DEVBUF_PICKLE_BYTES, n);
  case 'B': // BINBYTES
    return take_unsigned(r, 4, &n) ? -1 : push_text(r, DEVBUF_PICKLE_BYTES, n);
  case 0x8e: // BINBYTES8
    return take_unsigned(r, 8, &n) ? -1 : push_text(r, DEVBUF_PICKLE_BYTES, n);
  case ']': // EMPTY_LIST
    return push(r, new_container(r, DEVBUF_PICKLE_LIST, NULL, 0));
  case '}': // EMPTY_DICT
    return push(r, new_container(r, DEVBUF_PICKLE_DICT, NULL, 0));
  case ')': // EMPTY_TUPLE
    return push(r, new_container(r, DEVBUF_PICKLE_TUPLE, NULL, 0));
  case 0x85: // TUPLE1
  case 0x86: // TUPLE2
  case 0x87: // TUPLE3
    count = (size_t)(r->opcode - 0x84);
    if (r->depth - fence(r) < count)
      return fail(r, "%zu values needed on the stack, %zu there", count, r->depth - fence(r));
    r->depth -= count;
    return push(r, new_container(r, DEVBUF_PICKLE_TUPLE, r->stack + r->depth, count));
  case 't': // TUPLE
  case 'l': // LIST
    if (pop_mark(r, &first, &count)) return -1;
    return push(r, new_container(r, r->opcode == 't' ? DEVBUF_PICKLE_TUPLE : DEVBUF_PICKLE_LIST,
                                 r->stack + first, count));
  case 'd': // DICT
    if (pop_mark(r, &first, &count)) return -1;
    a = new_container(r, DEVBUF_PICKLE_DICT, NULL, 0);
    if (!a || set_items(r, a, r->stack + first, count)) return -1;
    return push(r, a);
  case 'a': // APPEND
    if (!(b = pop(r)) || !(a = top(r))) return -1;
    return append_items(r, a, &b, 1);
  case 'e': // APPENDS
    if (pop_mark(r, &first, &count) || !(a = top(r))) return -1;
    return append_items(r, a, r->stack + first, count);
  case 's': // SETITEM
    if (r->depth - fence(r) < 3)
      return fail(r, "3 values needed on the stack, %zu there", r->depth - fence(r));
    r->depth -= 2;
    return set_items(r, r->stack[r->depth - 1], r->stack + r->depth, 2);
  case 'u': // SETITEMS
    if (pop_mark(r, &first, &count) || !(a = top(r))) return -1;
    return set_items(r, a, r->stack + first, count);
  case 0x94: // MEMOIZE
    return memo_put(r, r->memo_count);
  case 'q': // BINPUT
    return take_unsigned(r, 1, &n) ? -1 : memo_put(r, n);
  case 'r': // LONG_BINPUT
    return take_unsigned(r, 4, &n) ? -1 : memo_put(r, n);
  case 'p': // PUT
    return take_decimal(r, &n) ? -1 : memo_put(r, n);
  case 'h': // BINGET
    return take_unsigned(r, 1, &n) ? -1 : memo_get(r, n);
  case 'j': // LONG_BINGET
    return take_unsigned(r, 4, &n) ? -1 : memo_get(r, n);
  case 'g': // GET
    return take_decimal(r, &n) ? -1 : memo_get(r, n);
  case 'c': { // GLOBAL: "module\nname\n"
    size_t module_length, name_length;
    const uint8_t *module = take_line(r, &module_length);
    const uint8_t *name = module ? take_line(r, &name_length) : NULL;
    return name ? push_class(r, module, module_length, name, name_length) : -1;
  }
  case 0x93: // STACK_GLOBAL
    if (!(b = pop(r)) || !(a = pop(r))) return -1;
    if (a->kind != DEVBUF_PICKLE_STR || b->kind != DEVBUF_PICKLE_STR)
      return fail(r, "module and name must be strings, not a %s and a %s",
                  devbuf_pickle_kind_name(a), devbuf_pickle_kind_name(b));
    return push_class(r, (const uint8_t *)a->as.text.bytes, a->as.text.length,
                      (const uint8_t *)b->as.text.bytes, b->as.text.length);
  case 'R': // REDUCE: class(*args), made inert
    if (!(b = pop(r)) || !(a = pop(r))) return -1;
    return push_inert(r, a, b);
  case 0x81: // NEWOBJ: class.__new__(class, *args), made inert
    if (!(b = pop(r)) || !(a = pop(r))) return -1;
    if (b->kind != DEVBUF_PICKLE_TUPLE)
      return fail(r, "arguments in a %s, not a tuple", devbuf_pickle_kind_name(b));
    return push_inert(r, a, NULL);
  case 'b': { // BUILD: the state of an inert object, as "__state__"
    if (!(b = pop(r)) || !(a = top(r))) return -1;
    if (a->kind != DEVBUF_PICKLE_DICT || !a->type)
      return fail(r, "a state given to a %s: only inert objects take one",
                  devbuf_pickle_kind_name(a));
    devbuf_pickle_value *entry[2] = {key_value(r, "__state__"), b};
    return entry[0] ? set_items(r, a, entry, 2) : -1;
  }
  default:
    if (opcode_names[r->opcode])
      return fail(r, "opcode %s is not one a memory snapshot uses: refused",
                  opcode_names[r->opcode]);
    return fail(r, "not a pickle opcode");
  }
}

int devbuf_pickle_parse(const uint8_t *data, size_t size, devbuf_pickle **out_pickle,
                        const devbuf_pickle_value **out_root, char *message, size_t capacity) {
  *out_pickle = NULL;
  *out_root = NULL;
  if (capacity) message[0] = '\0';
  reader r = {.data = data, .size = size, .message = message, .message_capacity = capacity};
  if (!devbuf_pickle_sniff(data, size)) {
    snprintf(message, capacity, "offset 0: not a pickle of protocol 2 to 5 (no PROTO opcode)");
    return -1;
  }
  if (size >= DEVBUF_PICKLE_MAX_INPUT) {
    snprintf(message, capacity, "offset 0: a pickle of %zu bytes: more than 4 GiB", size);
    return -1;
  }
  r.pickle = calloc(1, sizeof *r.pickle);
  if (!r.pickle) {
    snprintf(message, capacity, "out of memory");
    return -1;
  }
  r.pickle->budget = size * DEVBUF_PICKLE_MEMORY_PER_BYTE + DEVBUF_PICKLE_MEMORY_FLOOR;
  r.at = 2;
  bool stopped = false;
  int status = grow_stack(&r); // never NULL: opcodes take items from it by offset
  while (status == 0 && !stopped) {
    if (r.at == r.size) {
      r.op_offset = r.at;
      r.opcode = '.';
      snprintf(message, capacity, "offset %zu: the input ends before STOP", r.at);
      status = -1;
      break;
    }
    status = step(&r, &stopped);
  }
  free(r.memo);
  if (status == 0) {
    *out_root = r.stack[r.depth - 1];
    *out_pickle = r.pickle;
  } else {
    devbuf_pickle_free(r.pickle);
  }
  free(r.stack);
  return status;
}

void devbuf_pickle_free(devbuf_pickle *pickle) {
  if (!pickle) return;
  for (arena_chunk *chunk = pickle->chunks, *next; chunk; chunk = next) {
    next = chunk->next;
    free(chunk);
  }
  free(pickle);
}

size_t devbuf_pickle_memory(const devbuf_pickle *pickle) { return pickle ? pickle->memory : 0; }

bool devbuf_pickle_is_str(const devbuf_pickle_value *value, const char *text) {
  size_t length = strlen(text);
  return value && value->kind == DEVBUF_PICKLE_STR && value->as.text.length == length &&
         memcmp(value->as.text.bytes, text, length) == 0;
}

const devbuf_pickle_value *devbuf_pickle_get(const devbuf_pickle_value *dict, const char *key,
                                             uint64_t *steps) {
  if (!dict || dict->kind != DEVBUF_PICKLE_DICT) return NULL;
  size_t count = dict->as.list.count;
  *steps += count / 2 + 1;
  for (size_t i = count; i >= 2; i -= 2)
    if (devbuf_pickle_is_str(dict->as.list.items[i - 2], key)) return dict->as.list.items[i - 1];
  return NULL;
}

bool devbuf_pickle_negative(const devbuf_pickle_value *value) {
  if (value->kind == DEVBUF_PICKLE_BIGINT)
    return ((const uint8_t *)value->as.text.bytes)[value->as.text.length - 1] & 0x80;
  return value->as.integer < 0;
}

// A BIGINT of more bytes than this has more than DEVBUF_PICKLE_MAX_DIGITS digits: its
// magnitude is at least 2^(8 * (bytes - 2)), and 10^4300 < 2^14285.
#define BIGINT_MOST_BYTES (DEVBUF_PICKLE_MAX_DIGITS * 10 / 24 + 3)

size_t devbuf_pickle_decimal(const devbuf_pickle_value *value, char *out, size_t capacity,
                             uint64_t *steps) {
  if (value->kind != DEVBUF_PICKLE_BIGINT) {
    int length = snprintf(out, capacity, "%lld", (long long)value->as.integer);
    return length > 0 && (size_t)length < capacity ? (size_t)length : 0;
  }
  const uint8_t *bytes = (const uint8_t *)value->as.text.bytes;
  size_t length = value->as.text.length;
  if (length > BIGINT_MOST_BYTES) return 0;
  // The magnitude in 32-bit words, low first: the bytes sign-extended, negated if negative.
  uint32_t words[(BIGINT_MOST_BYTES + 3) / 4];
  size_t count = (length + 3) / 4;
  bool negative = devbuf_pickle_negative(value);
  for (size_t i = 0; i < count; i++) {
    uint32_t word = 0;
    for (size_t k = 0; k < 4; k++) {
      size_t at = 4 * i + k;
      word |= (uint32_t)(at < length ? bytes[at] : negative ? 0xff : 0x00) << (8 * k);
    }
    words[i] = word;
  }
  if (negative) {
    uint64_t carry = 1;
    for (size_t i = 0; i < count; i++) {
      carry += (uint32_t)~words[i];
      words[i] = (uint32_t)carry;
      carry >>= 32;
    }
  }
  while (count && !words[count - 1]) count--;
  // Nine digits at a time, lowest first, by long division by 10^9.
  char digits[DEVBUF_PICKLE_MAX_DIGITS];
  size_t used = 0;
  while (count) {
    uint64_t remainder = 0;
    for (size_t i = count; i-- > 0;) {
      uint64_t current = remainder << 32 | words[i];
      words[i] = (uint32_t)(current / 1000000000u);
      remainder = current % 1000000000u;
    }
    *steps += count;
    while (count && !words[count - 1]) count--;
    for (int k = 0; k < 9 && (count || remainder); k++) {
      if (used == sizeof digits) return 0;
      digits[used++] = (char)('0' + remainder % 10);
      remainder /= 10;
    }
  }
  if (used + negative + 1 > capacity) return 0;
  size_t written = 0;
  if (negative) out[written++] = '-';
  while (used) out[written++] = digits[--used];
  out[written] = '\0';
  return written;
}
