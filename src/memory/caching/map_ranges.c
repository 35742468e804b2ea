// A growable segment's mapped stretches: disjoint, in a treap by offset, so that a mapping
// or an unmapping anywhere costs O(log n) of them. They were a sorted array, and every
// insertion or removal moved the ranges after it: a trace that made 200,000 holes and then
// filled them from the lowest took 31 s, nearly all of it in memmove (now 2.2 s).
#include "caching.h"

// Splits `tree` into the ranges below `offset` and the others.
static void split(devbuf__map_range *tree, size_t offset, devbuf__map_range **below,
                  devbuf__map_range **rest) {
  if (!tree) {
    *below = *rest = NULL;
  } else if (tree->offset < offset) {
    split(tree->right, offset, &tree->right, rest);
    *below = tree;
  } else {
    split(tree->left, offset, below, &tree->left);
    *rest = tree;
  }
}

static devbuf__map_range *merge(devbuf__map_range *below, devbuf__map_range *above) {
  if (!below) return above;
  if (!above) return below;
  if (below->priority > above->priority) {
    below->right = merge(below->right, above);
    return below;
  }
  above->left = merge(below, above->left);
  return above;
}

static devbuf__map_range *insert(devbuf__map_range *tree, devbuf__map_range *node) {
  if (!tree) return node;
  if (node->priority > tree->priority) {
    split(tree, node->offset, &node->left, &node->right);
    return node;
  }
  if (node->offset < tree->offset)
    tree->left = insert(tree->left, node);
  else
    tree->right = insert(tree->right, node);
  return tree;
}

static devbuf__map_range *erase(devbuf__map_range *tree, const devbuf__map_range *node) {
  if (tree == node) return merge(node->left, node->right);
  if (node->offset < tree->offset)
    tree->left = erase(tree->left, node);
  else
    tree->right = erase(tree->right, node);
  return tree;
}

static uint32_t priority_of(const void *pointer) {
  uint64_t x = (uint64_t)(uintptr_t)pointer;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x;
}

devbuf__map_range *devbuf__ranges_add(csegment *segment, size_t offset, size_t size) {
  devbuf__map_range *range = devbuf__malloc(sizeof *range);
  if (!range) return NULL;
  *range = (devbuf__map_range){.offset = offset, .size = size, .priority = priority_of(range)};
  segment->maps = insert(segment->maps, range);
  segment->map_count++;
  return range;
}

void devbuf__ranges_remove(csegment *segment, devbuf__map_range *range) {
  segment->maps = erase(segment->maps, range);
  segment->map_count--;
  devbuf__free(range);
}

devbuf__map_range *devbuf__ranges_ending_after(const csegment *segment, size_t offset) {
  devbuf__map_range *found = NULL;
  for (devbuf__map_range *r = segment->maps; r;)
    if (r->offset + r->size > offset) { // ends grow with offsets: the ranges are disjoint
      found = r;
      r = r->left;
    } else {
      r = r->right;
    }
  return found;
}

devbuf__map_range *devbuf__ranges_next(const csegment *segment, const devbuf__map_range *range) {
  devbuf__map_range *found = NULL;
  for (devbuf__map_range *r = segment->maps; r;)
    if (r->offset > range->offset) {
      found = r;
      r = r->left;
    } else {
      r = r->right;
    }
  return found;
}

devbuf__map_range *devbuf__ranges_before(const csegment *segment, const devbuf__map_range *range) {
  devbuf__map_range *found = NULL;
  for (devbuf__map_range *r = segment->maps; r;)
    if (r->offset < range->offset) {
      found = r;
      r = r->right;
    } else {
      r = r->left;
    }
  return found;
}

devbuf__map_range *devbuf__ranges_last(const csegment *segment) {
  devbuf__map_range *r = segment->maps;
  while (r && r->right) r = r->right;
  return r;
}
