// How many decimals a ratio is printed with beside its target, for devbuf bench and the MPI
// benchmark (a program of its own): header-only so that both use the one rule.
#ifndef DEVBUF_BENCH_DECIMALS_H
#define DEVBUF_BENCH_DECIMALS_H

#include <math.h>

// 2, or more (up to 5) where fewer would print a value that misses, or meets, its target as
// the target itself: "0.90x MISSED (target >= 0.9x)" reads as a mistake.
static inline int bench_decimals(double value, double target) {
  int decimals = 2;
  for (double scale = 100;
       decimals < 5 && value != target && round(value * scale) == round(target * scale);
       scale *= 10)
    decimals++;
  return decimals;
}

#endif
