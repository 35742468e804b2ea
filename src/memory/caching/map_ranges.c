// A growable segment's mapped stretches: disjoint, in a treap by offset, so that a mapping
// or an unmapping anywhere costs O(log n) of them. They were a sorted array, and every
// insertion or removal moved the ranges after it: a trace that made 200,000 holes and then
// filled them from the lowest took 31 s, nearly all of it in memmove (now 2.2 s).
#include "caching.h"
#include "treap.h"

static bool range_less(const devbuf__map_range *a, const devbuf__map_range *b) {
  return a->offset < b->offset;
}

DEVBUF__TREAP(tree, devbuf__map_range, left, right, range_less)

devbuf__map_range *devbuf__ranges_add(csegment *segment, size_t offset, size_t size) {
  devbuf__map_range *range = devbuf__malloc(sizeof *range);
  if (!range) return NULL;
  *range = (devbuf__map_range){
      .offset = offset, .size = size, .priority = devbuf__treap_priority(range)};
  segment->maps = tree_insert(segment->maps, range);
  return range;
}

void devbuf__ranges_remove(csegment *segment, devbuf__map_range *range) {
  segment->maps = tree_erase(segment->maps, range);
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
