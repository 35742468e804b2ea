// Segment sizes. The shape follows PyTorch's CUDA caching allocator, whose figures the
// traces compare against: requests of at most 1 MiB share 2 MiB segments, those up to
// 10 MiB share 20 MiB segments, larger ones get a segment of their own rounded to the page.
// Unlike it, a new large segment grows with the pool (at least 1/2^growth_shift of what
// is already reserved): a program that builds up gigabytes makes a few dozen system
// allocations, not hundreds, and what the last segment leaves over is bounded by that
// fraction.
#include "caching.h"

#define MIB ((size_t)1 << 20)

static size_t round_up(size_t size, size_t page) {
  return size > SIZE_MAX - (page - 1) ? 0 : (size + page - 1) & ~(page - 1);
}

void devbuf__policy_init(segment_policy *policy, size_t page) {
  policy->page = page;
  policy->small_max = MIB;
  policy->small_segment = round_up(2 * MIB, page);
  policy->medium_max = 10 * MIB;
  policy->medium_segment = round_up(20 * MIB, page);
  policy->growth_shift = 0;
}

int devbuf__policy_pool(const segment_policy *policy, size_t size) {
  return size <= policy->small_max ? POOL_SMALL : POOL_LARGE;
}

size_t devbuf__policy_segment_size(const segment_policy *policy, int pool, size_t size, uint64_t reserved,
                                   uint64_t room) {
  size_t least = round_up(size, policy->page);
  if (!least || least > room) return 0;
  size_t chosen = pool == POOL_SMALL ? policy->small_segment : size <= policy->medium_max ? policy->medium_segment : least;
  if (pool == POOL_LARGE && policy->growth_shift) {
    size_t grown = round_up((size_t)(reserved >> policy->growth_shift), policy->page);
    if (grown > chosen) chosen = grown;
  }
  if (chosen < least) chosen = least;
  if (chosen > room) chosen = (size_t)room & ~(policy->page - 1);
  return chosen < least ? least : chosen;
}
