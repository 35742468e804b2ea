// Segment sizes. The shape follows PyTorch's CUDA caching allocator, whose figures the
// traces compare against: requests of at most 1 MiB share 2 MiB segments, those below
// 10 MiB share 20 MiB segments, from 10 MiB on a request gets a segment of its own rounded
// to 2 MiB (or the page, where larger): a slightly larger request later still fits such a
// segment, which on the traces at a 4 KiB page decided whether a program fitted under a
// limit. The bound at 10 MiB is PyTorch's to the byte: a 10 MiB block in a shared 20 MiB
// segment strands the other half wherever no medium request comes, and on real runs that
// alone made devbuf need more memory than PyTorch's allocator to fit.
//
// One rule differs. A program first builds what it keeps (weights, gradients, optimizer
// state) and only then starts to free. While nothing has been freed, the medium segments
// grow with the pool: each holds at least 1/8 of what the pool already holds, but no more
// than four of the largest blocks asked for so far. Those long-lived blocks then sit packed
// in a few dozen segments instead of hundreds of 20 MiB ones (fewer driver calls, each of
// them slow), and what the last one leaves over when the first free ends the burst is at
// most an eighth of the pool and four of the program's largest blocks; the allocations
// after it fill it first (best fit takes free bytes before any new segment). Requests of
// 10 MiB and more that find no free block keep segments of their own. Under a memory limit
// the rule is off (the caller passes `burst` false): near a limit memory counts for more
// than a system call, and the tails of the grown segments, split by later requests, are
// what made requests fail at limits PyTorch's allocator met (trace_variants.py,
// docs/allocator.md).
#include "caching.h"

#define MIB ((size_t)1 << 20)

void devbuf__policy_init(segment_policy *policy, size_t page) {
  policy->page = page;
  policy->small_max = MIB;
  policy->small_segment = caching_round_up(2 * MIB, page);
  policy->medium_max = 10 * MIB;
  policy->medium_segment = caching_round_up(20 * MIB, page);
  policy->large_round = page > 2 * MIB ? page : 2 * MIB;
  policy->burst_shift = 3;
  policy->burst_blocks = 4;
}

int devbuf__policy_pool(const segment_policy *policy, size_t size) {
  return size <= policy->small_max ? POOL_SMALL : POOL_LARGE;
}

size_t devbuf__policy_segment_size(const segment_policy *policy, int pool, size_t size,
                                   uint64_t pool_reserved, bool burst, size_t largest_request,
                                   uint64_t room) {
  size_t least = caching_round_up(size, policy->page);
  if (!least || least > room) return 0;
  bool medium = pool == POOL_LARGE && size < policy->medium_max;
  size_t chosen = pool == POOL_SMALL ? policy->small_segment
                  : medium           ? policy->medium_segment
                                     : caching_round_up(size, policy->large_round);
  if (medium && burst && policy->burst_shift) {
    size_t grown = caching_round_up((size_t)(pool_reserved >> policy->burst_shift), policy->page);
    size_t cap = largest_request > SIZE_MAX / policy->burst_blocks
                     ? SIZE_MAX
                     : caching_round_up(largest_request * policy->burst_blocks, policy->page);
    if (cap && grown > cap) grown = cap;
    if (grown > chosen) chosen = grown;
  }
  if (chosen > room) chosen = (size_t)room & ~(policy->page - 1); // at a memory limit: what is left
  return chosen < least ? least : chosen;
}
