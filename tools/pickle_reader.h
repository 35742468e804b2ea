// A restricted unpickler for PyTorch memory snapshots (the pickles
// torch.cuda.memory._dump_snapshot writes): it turns a pickle's bytes into a tree of plain
// values and nothing else. A class the pickle names (GLOBAL, STACK_GLOBAL) becomes an inert
// reference, and what REDUCE, NEWOBJ and BUILD make of it an inert dictionary: nothing is
// imported, resolved or called. Only the opcodes of protocols 2 to 5 that plain data needs
// are accepted; any other is refused naming it and its offset.
//
// The input is hostile: every length is checked against the bytes left before it is read,
// nothing recurses, and the tree, stack, marks and memo together may take at most
// DEVBUF_PICKLE_MEMORY_PER_BYTE times the input's size (plus DEVBUF_PICKLE_MEMORY_FLOOR).
// Shared values (the memo) live in one arena, freed at once with the tree.
#ifndef DEVBUF_TOOL_PICKLE_READER_H
#define DEVBUF_TOOL_PICKLE_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEVBUF_PICKLE_MAX_MARKS       256               // containers being built at once
#define DEVBUF_PICKLE_MEMORY_PER_BYTE 16                // memory per input byte, at most
#define DEVBUF_PICKLE_MEMORY_FLOOR    ((size_t)1 << 20) // allowed on top, for small inputs
#define DEVBUF_PICKLE_MAX_INPUT       ((size_t)1 << 32) // 4 GiB

typedef enum devbuf_pickle_kind {
  DEVBUF_PICKLE_NONE,
  DEVBUF_PICKLE_BOOL,   // integer 0 or 1
  DEVBUF_PICKLE_INT,    // integer: any int64
  DEVBUF_PICKLE_FLOAT,  // number
  DEVBUF_PICKLE_STR,    // text: well-formed UTF-8 (no surrogates), may hold NUL
  DEVBUF_PICKLE_BYTES,  // text: any bytes
  DEVBUF_PICKLE_LIST,   // items
  DEVBUF_PICKLE_TUPLE,  // items
  DEVBUF_PICKLE_DICT,   // items: key, value, key, value, ... in insertion order (a key set
                        // again appears again: the last one counts); `type` non-NULL for an
                        // inert object
  DEVBUF_PICKLE_CLASS,  // text "module.name": a class reference, never resolved
  DEVBUF_PICKLE_BIGINT, // text: an integer outside int64 (LONG1, LONG4: a real snapshot's
                        // line of 2^64 - 1), its little-endian two's complement bytes in the
                        // input, without the redundant sign bytes: 9 or more
} devbuf_pickle_kind;

// Python's str() of an int refuses more digits than this (sys.get_int_max_str_digits()'s
// default since 3.11), and so does devbuf_pickle_decimal: beyond it the conversion would
// take time quadratic in the integer's length.
#define DEVBUF_PICKLE_MAX_DIGITS 4300

typedef struct devbuf_pickle_value devbuf_pickle_value;
struct devbuf_pickle_value {
  uint8_t kind;    // devbuf_pickle_kind
  bool hashable;   // may be a dictionary key (as in Python: not a list, dict, or a tuple of them)
  uint32_t offset; // input byte of the opcode that made it
  const devbuf_pickle_value *type; // DICT made by REDUCE or NEWOBJ: the class it names
  union {
    int64_t integer; // BOOL, INT
    double number;   // FLOAT
    struct {
      const char *bytes; // into the input (STR, BYTES) or the arena (CLASS); not terminated
      size_t length;
    } text;
    struct {
      devbuf_pickle_value **items;
      size_t count, capacity; // DICT: count is twice the entries
    } list;
  } as;
};

typedef struct devbuf_pickle devbuf_pickle;

// Parses the pickle in `data` (`size` bytes; it must stay alive and unchanged while the
// tree is used: strings point into it). Returns the tree's root in `*out_root` and the
// owner of every value in `*out_pickle` (free with devbuf_pickle_free), and 0; or -1 with
// `*out_pickle` NULL and a message naming the byte offset in `message` (always terminated).
int devbuf_pickle_parse(const uint8_t *data, size_t size, devbuf_pickle **out_pickle,
                        const devbuf_pickle_value **out_root, char *message, size_t capacity);
// Frees every value of the tree. NULL-safe.
void devbuf_pickle_free(devbuf_pickle *pickle);
// Bytes of memory the tree took (arena, stack, memo), for the tests and the docs.
size_t devbuf_pickle_memory(const devbuf_pickle *pickle);

// Whether `data` starts as a pickle of protocol 2 to 5 does (0x80, then the protocol).
bool devbuf_pickle_sniff(const uint8_t *data, size_t size);
// The opcode's name ("BINUNICODE"), or NULL for a byte that is no opcode of protocol 0-5.
const char *devbuf_pickle_opcode_name(uint8_t opcode);

// The value stored under the string `key` in a dictionary (the last such entry), or NULL;
// NULL when `dict` is not a DICT. `*steps` is raised by the entries looked at.
const devbuf_pickle_value *devbuf_pickle_get(const devbuf_pickle_value *dict, const char *key,
                                             uint64_t *steps);
// What `value` is, for messages: "int", "dict", "inert object", ...
const char *devbuf_pickle_kind_name(const devbuf_pickle_value *value);
// Whether `value` is the string `text`.
bool devbuf_pickle_is_str(const devbuf_pickle_value *value, const char *text);
// Whether the INT, BOOL or BIGINT `value` is below 0.
bool devbuf_pickle_negative(const devbuf_pickle_value *value);
// The decimal text of the INT, BOOL or BIGINT `value` as Python's str(int(value)) writes it,
// terminated, in `out` (DEVBUF_PICKLE_MAX_DIGITS + 2 bytes hold any): its length, or 0 where
// it has more than DEVBUF_PICKLE_MAX_DIGITS digits or `capacity` bytes do not hold it.
// `*steps` is raised by the work (the 32-bit words divided).
size_t devbuf_pickle_decimal(const devbuf_pickle_value *value, char *out, size_t capacity,
                             uint64_t *steps);

#endif
