// An intrusive treap, written once for the caching allocator's ordered sets: a pool's free
// blocks by (size, segment, offset) (pool.c), a growable segment's free blocks to unmap by
// offset and its mapped ranges by offset (growable.c, map_ranges.c). DEVBUF__TREAP(name,
// type, left, right, less) defines static functions over `type`, whose members `left` and
// `right` link the tree and whose `priority` (uint32_t, a hash of the node's address) keeps
// it balanced; `less(a, b)` orders two nodes and no two nodes of a tree are equal:
//   name##_insert(tree, node) -> the new root     name##_erase(tree, node) -> the new root
// A node's key must not change while it is in a tree (or only within the gap between its
// neighbours).
#ifndef DEVBUF_TREAP_H
#define DEVBUF_TREAP_H

#include <stdint.h>

// A node's heap priority: its address, mixed.
static inline uint32_t devbuf__treap_priority(const void *node) {
  uint64_t x = (uint64_t)(uintptr_t)node;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (uint32_t)x;
}

#define DEVBUF__TREAP(name, type, left, right, less)                                 \
  /* Splits `tree` into the nodes before `key` and the others. */                    \
  static void name##_split(type *tree, const type *key, type **below, type **rest) { \
    if (!tree) {                                                                     \
      *below = *rest = NULL;                                                         \
    } else if (less(tree, key)) {                                                    \
      name##_split(tree->right, key, &tree->right, rest);                            \
      *below = tree;                                                                 \
    } else {                                                                         \
      name##_split(tree->left, key, below, &tree->left);                             \
      *rest = tree;                                                                  \
    }                                                                                \
  }                                                                                  \
  static type *name##_merge(type *below, type *above) {                              \
    if (!below) return above;                                                        \
    if (!above) return below;                                                        \
    if (below->priority > above->priority) {                                         \
      below->right = name##_merge(below->right, above);                              \
      return below;                                                                  \
    }                                                                                \
    above->left = name##_merge(below, above->left);                                  \
    return above;                                                                    \
  }                                                                                  \
  static type *name##_insert(type *tree, type *node) {                               \
    if (!tree) return node;                                                          \
    if (node->priority > tree->priority) {                                           \
      name##_split(tree, node, &node->left, &node->right);                           \
      return node;                                                                   \
    }                                                                                \
    if (less(node, tree))                                                            \
      tree->left = name##_insert(tree->left, node);                                  \
    else                                                                             \
      tree->right = name##_insert(tree->right, node);                                \
    return tree;                                                                     \
  }                                                                                  \
  static type *name##_erase(type *tree, const type *node) {                          \
    if (!tree) return NULL; /* not in it */                                          \
    if (tree == node) return name##_merge(node->left, node->right);                  \
    if (less(node, tree))                                                            \
      tree->left = name##_erase(tree->left, node);                                   \
    else                                                                             \
      tree->right = name##_erase(tree->right, node);                                 \
    return tree;                                                                     \
  }

#endif // DEVBUF_TREAP_H
