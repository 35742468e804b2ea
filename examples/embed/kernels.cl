// The forward pass's kernels for devices: OpenCL C as it stands, and CUDA through kernels.cu,
// which defines the few macros below for CUDA and includes this file. Every kernel takes its
// buffers first (the launch's uses, in order), then its scalars (uint, 4 bytes each). Built
// with EMBED_EMPTY=1, every kernel returns at once: same launches, no work (--empty-kernels).
//
// Shapes: activations are row-major [rows, columns] floats, rows = batch x tokens (the
// buffers may hold more rows than a batch uses); weights are the file's: a linear layer's
// matrix is [out, in]. H = 384 columns, 12 heads of 32.
#ifndef __CUDACC__
#define KERNEL       __kernel void
#define GLOBAL       __global
#define LOCAL        __local
#define LOCAL_ARRAY  __local
#define BARRIER()    barrier(CLK_LOCAL_MEM_FENCE)
#define LOCAL_ID(d)  ((uint)get_local_id(d))
#define GROUP_ID(d)  ((uint)get_group_id(d))
#define GLOBAL_ID(d) ((uint)get_global_id(d))
#define EXP(x)       exp(x)
#define ERF(x)       erf(x)
#define RSQRT(x)     rsqrt(x)
#define SQRT(x)      sqrt(x)
#define MAX(a, b)    fmax(a, b)
#define FUNC         static
#endif

#ifndef EMBED_EMPTY
#define EMBED_EMPTY 0
#endif
#ifndef EMBED_CPU_DEVICE // an OpenCL device that is a CPU (PoCL): other matrix products
#define EMBED_CPU_DEVICE 0
#endif

#define H        384
#define HEADS    12
#define HEAD_DIM 32
#define LN_EPS   1e-12f

// Work-groups of 128 over one row of H: each item holds 3 columns.
#define ROW_ITEMS 128
#define ROW_EACH  (H / ROW_ITEMS)

// The sum over a work-group of ROW_ITEMS items (every item gets it).
FUNC float row_sum(LOCAL float *scratch, float value) {
  uint lid = LOCAL_ID(0);
  scratch[lid] = value;
  BARRIER();
  for (uint step = ROW_ITEMS / 2; step > 0; step >>= 1) {
    if (lid < step) scratch[lid] += scratch[lid + step];
    BARRIER();
  }
  float sum = scratch[0];
  BARRIER();
  return sum;
}

// LayerNorm of one row held as ROW_EACH values per item, written to `out`.
FUNC void row_norm(LOCAL float *scratch, float *v, GLOBAL float *out, GLOBAL const float *gamma,
                   GLOBAL const float *beta) {
  uint lid = LOCAL_ID(0);
  float sum = 0.0f;
  for (uint e = 0; e < ROW_EACH; e++) sum += v[e];
  float mean = row_sum(scratch, sum) * (1.0f / H);
  float squares = 0.0f;
  for (uint e = 0; e < ROW_EACH; e++) {
    v[e] -= mean;
    squares += v[e] * v[e];
  }
  float scale = RSQRT(row_sum(scratch, squares) * (1.0f / H) + LN_EPS);
  for (uint e = 0; e < ROW_EACH; e++) {
    uint c = lid + e * ROW_ITEMS;
    out[c] = v[e] * scale * gamma[c] + beta[c];
  }
}

// x[r] = LayerNorm(word[ids[r]] + position[r % tokens] + type[0]); one group per row of a
// token (the rows of padding are left out: what they hold is undefined, and no kernel reads
// it; attention and pooling read the rows of tokens only, and the products compute a row from
// the same row).
// Global 128 x rows, local 128 (one dimension).
KERNEL embed_tokens(GLOBAL float *x, GLOBAL const int *ids, GLOBAL const float *word,
                    GLOBAL const float *position, GLOBAL const float *type,
                    GLOBAL const float *gamma, GLOBAL const float *beta, GLOBAL const float *mask,
                    uint tokens, uint vocab) {
  LOCAL_ARRAY float scratch[ROW_ITEMS];
  uint r = GROUP_ID(0), lid = LOCAL_ID(0);
  if (EMBED_EMPTY || mask[r] == 0.0f) return; // padding: left undefined
  int id = ids[r];
  if (id < 0 || (uint)id >= vocab) id = 100; // [UNK]; the host checked every id
  uint t = r % tokens;
  float v[ROW_EACH];
  for (uint e = 0; e < ROW_EACH; e++) {
    uint c = lid + e * ROW_ITEMS;
    v[e] = word[(size_t)id * H + c] + position[t * H + c] + type[c];
  }
  row_norm(scratch, v, x + (size_t)r * H, gamma, beta);
}

// out = in . w^T + bias (then GELU with erf when `gelu`). The input may be split by columns
// into `parts` activations of `k_part` columns each (in0..in3; k = parts x k_part): w is
// [n, k], out [rows, n]. n must be a multiple of 64, k_part of 16. Rows of padding (mask 0)
// are computed only where they share a block with a row of a token.
#if EMBED_CPU_DEVICE
// For OpenCL on a CPU (PoCL): each item computes 4 x 4 outputs with 16-wide vectors along k,
// no local memory and no barriers. Global (n / 4, ceil(rows / 4)), local (16, 1).
FUNC float sum16(float16 v) {
  float8 a = v.lo + v.hi;
  float4 b = a.lo + a.hi;
  float2 c = b.lo + b.hi;
  return c.x + c.y;
}

FUNC void linear_block(GLOBAL float *out, GLOBAL const float *in0, GLOBAL const float *in1,
                       GLOBAL const float *in2, GLOBAL const float *in3, GLOBAL const float *w,
                       GLOBAL const float *bias, GLOBAL const float *mask, uint rows, uint n,
                       uint k_part, uint parts, uint gelu) {
  uint c0 = GLOBAL_ID(0) * 4, r0 = GLOBAL_ID(1) * 4, k = parts * k_part;
  bool any = false; // a row of a token among the 4
  for (uint i = 0; i < 4 && r0 + i < rows; i++) any = any || mask[r0 + i] != 0.0f;
  if (!any) return;
  float16 acc[4][4];
  for (uint i = 0; i < 4; i++)
    for (uint j = 0; j < 4; j++) acc[i][j] = (float16)(0.0f);
  uint live = rows - r0 < 4 ? rows - r0 : 4;
  for (uint k0 = 0; k0 < k; k0 += 16) {
    uint part = k0 / k_part, kp = k0 - part * k_part;
    GLOBAL const float *in = part == 0 ? in0 : part == 1 ? in1 : part == 2 ? in2 : in3;
    float16 a[4], b[4];
    for (uint i = 0; i < 4; i++)
      a[i] = i < live ? vload16(0, in + (size_t)(r0 + i) * k_part + kp) : (float16)(0.0f);
    for (uint j = 0; j < 4; j++) b[j] = vload16(0, w + (size_t)(c0 + j) * k + k0);
    for (uint i = 0; i < 4; i++)
      for (uint j = 0; j < 4; j++) acc[i][j] = mad(a[i], b[j], acc[i][j]);
  }
  for (uint i = 0; i < live; i++) {
    for (uint j = 0; j < 4; j++) {
      float y = sum16(acc[i][j]) + bias[c0 + j];
      if (gelu) y = 0.5f * y * (1.0f + ERF(y * 0.70710678118654752f));
      out[(size_t)(r0 + i) * n + c0 + j] = y;
    }
  }
}

KERNEL linear(GLOBAL float *out, GLOBAL const float *in, GLOBAL const float *w,
              GLOBAL const float *bias, GLOBAL const float *mask, uint rows, uint n, uint k,
              uint gelu) {
  if (EMBED_EMPTY || GLOBAL_ID(1) * 4 >= rows) return;
  linear_block(out, in, in, in, in, w, bias, mask, rows, n, k, 1, gelu);
}

// The feed-forward layer's second product: its input is 4 activations of k columns.
KERNEL linear_parts(GLOBAL float *out, GLOBAL const float *in0, GLOBAL const float *in1,
                    GLOBAL const float *in2, GLOBAL const float *in3, GLOBAL const float *w,
                    GLOBAL const float *bias, GLOBAL const float *mask, uint rows, uint n, uint k) {
  if (EMBED_EMPTY || GLOBAL_ID(1) * 4 >= rows) return;
  linear_block(out, in0, in1, in2, in3, w, bias, mask, rows, n, k, 4, 0);
}
#else
// For GPUs: tiles of 64 x 64 outputs per group of 16 x 16 items (4 x 4 each) through local
// memory, k in steps of 16. Global (n / 4, ceil(rows / 64) x 16), local (16, 16).
#define TILE   64
#define TILE_K 16
#define PAD    (TILE + 4)
FUNC void linear_tile(LOCAL float *a_tile, LOCAL float *w_tile, GLOBAL float *out,
                      GLOBAL const float *in0, GLOBAL const float *in1, GLOBAL const float *in2,
                      GLOBAL const float *in3, GLOBAL const float *w, GLOBAL const float *bias,
                      GLOBAL const float *mask, uint rows, uint n, uint k_part, uint parts,
                      uint gelu) {
  uint tx = LOCAL_ID(0), ty = LOCAL_ID(1), item = ty * 16 + tx;
  uint col0 = GROUP_ID(0) * TILE, row0 = GROUP_ID(1) * TILE, k = parts * k_part;
  bool any = false; // a row of a token in the tile (the same answer for every item)
  for (uint i = 0; i < TILE && row0 + i < rows; i++) any = any || mask[row0 + i] != 0.0f;
  if (!any) return;
  uint load_row = item / 4, load_k = (item % 4) * 4; // each item loads 4 values of one row
  float acc[4][4];
  for (uint i = 0; i < 4; i++)
    for (uint j = 0; j < 4; j++) acc[i][j] = 0.0f;
  for (uint k0 = 0; k0 < k; k0 += TILE_K) {
    uint part = k0 / k_part, kp = k0 - part * k_part; // a tile lies in one part
    GLOBAL const float *in = part == 0 ? in0 : part == 1 ? in1 : part == 2 ? in2 : in3;
    uint ar = row0 + load_row;
    for (uint e = 0; e < 4; e++) {
      a_tile[(load_k + e) * PAD + load_row] =
          ar < rows ? in[(size_t)ar * k_part + kp + load_k + e] : 0.0f;
      w_tile[(load_k + e) * PAD + load_row] = w[(size_t)(col0 + load_row) * k + k0 + load_k + e];
    }
    BARRIER();
    for (uint kk = 0; kk < TILE_K; kk++) {
      float a[4], b[4];
      for (uint i = 0; i < 4; i++) a[i] = a_tile[kk * PAD + ty + 16 * i];
      for (uint j = 0; j < 4; j++) b[j] = w_tile[kk * PAD + tx + 16 * j];
      for (uint i = 0; i < 4; i++)
        for (uint j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
    }
    BARRIER();
  }
  for (uint i = 0; i < 4; i++) {
    uint r = row0 + ty + 16 * i;
    if (r >= rows) continue;
    for (uint j = 0; j < 4; j++) {
      uint c = col0 + tx + 16 * j;
      float y = acc[i][j] + bias[c];
      if (gelu) y = 0.5f * y * (1.0f + ERF(y * 0.70710678118654752f));
      out[(size_t)r * n + c] = y;
    }
  }
}

KERNEL linear(GLOBAL float *out, GLOBAL const float *in, GLOBAL const float *w,
              GLOBAL const float *bias, GLOBAL const float *mask, uint rows, uint n, uint k,
              uint gelu) {
  if (EMBED_EMPTY) return;
  LOCAL_ARRAY float a_tile[TILE_K * PAD];
  LOCAL_ARRAY float w_tile[TILE_K * PAD];
  linear_tile(a_tile, w_tile, out, in, in, in, in, w, bias, mask, rows, n, k, 1, gelu);
}

// The feed-forward layer's second product: its input is 4 activations of k columns.
KERNEL linear_parts(GLOBAL float *out, GLOBAL const float *in0, GLOBAL const float *in1,
                    GLOBAL const float *in2, GLOBAL const float *in3, GLOBAL const float *w,
                    GLOBAL const float *bias, GLOBAL const float *mask, uint rows, uint n, uint k) {
  if (EMBED_EMPTY) return;
  LOCAL_ARRAY float a_tile[TILE_K * PAD];
  LOCAL_ARRAY float w_tile[TILE_K * PAD];
  linear_tile(a_tile, w_tile, out, in0, in1, in2, in3, w, bias, mask, rows, n, k, 4, 0);
}

#endif

// Attention of one head over one sequence: ctx = softmax(q k^T / sqrt(32) + mask) v, keys
// whose mask is 0 left out; query rows whose mask is 0 get zeros. One item per query, keys
// in tiles of 64 through local memory, softmax online. Global (ceil(tokens / 64) x 64,
// batch x 12), local (64, 1).
#define KEYS 64
KERNEL attention(GLOBAL float *ctx, GLOBAL const float *q, GLOBAL const float *k,
                 GLOBAL const float *v, GLOBAL const float *mask, uint tokens) {
  if (EMBED_EMPTY) return;
  LOCAL_ARRAY float k_tile[KEYS][HEAD_DIM + 1];
  LOCAL_ARRAY float v_tile[KEYS][HEAD_DIM + 1];
  LOCAL_ARRAY float m_tile[KEYS];
  uint lid = LOCAL_ID(0), i = GROUP_ID(0) * KEYS + lid;
  uint seq = GROUP_ID(1) / HEADS, head = GROUP_ID(1) % HEADS;
  size_t base = (size_t)seq * tokens * H + head * HEAD_DIM;
  bool live = i < tokens && mask[seq * tokens + i] != 0.0f;
  float qi[HEAD_DIM], acc[HEAD_DIM];
  const float scale = 0.17677669529663689f; // 1 / sqrt(32)
  for (uint d = 0; d < HEAD_DIM; d++) {
    qi[d] = live ? q[base + (size_t)i * H + d] * scale : 0.0f;
    acc[d] = 0.0f;
  }
  float best = -1e30f, total = 0.0f;
  for (uint j0 = 0; j0 < tokens; j0 += KEYS) {
    uint j = j0 + lid;
    bool have = j < tokens;
    for (uint d = 0; d < HEAD_DIM; d++) {
      k_tile[lid][d] = have ? k[base + (size_t)j * H + d] : 0.0f;
      v_tile[lid][d] = have ? v[base + (size_t)j * H + d] : 0.0f;
    }
    m_tile[lid] = have ? mask[seq * tokens + j] : 0.0f;
    BARRIER();
    uint count = tokens - j0 < KEYS ? tokens - j0 : KEYS;
    for (uint jj = 0; jj < count && live; jj++) {
      if (m_tile[jj] == 0.0f) continue;
      float s = 0.0f;
      for (uint d = 0; d < HEAD_DIM; d++) s += qi[d] * k_tile[jj][d];
      float next = MAX(best, s);
      float shrink = EXP(best - next), p = EXP(s - next);
      total = total * shrink + p;
      for (uint d = 0; d < HEAD_DIM; d++) acc[d] = acc[d] * shrink + p * v_tile[jj][d];
      best = next;
    }
    BARRIER();
  }
  if (i >= tokens) return;
  float norm = live && total > 0.0f ? 1.0f / total : 0.0f;
  for (uint d = 0; d < HEAD_DIM; d++) ctx[base + (size_t)i * H + d] = acc[d] * norm;
}

// out = LayerNorm(a + residual); one group per row of a token. Global 128 x rows, local
// 128 (one dimension).
KERNEL add_norm(GLOBAL float *out, GLOBAL const float *a, GLOBAL const float *residual,
                GLOBAL const float *gamma, GLOBAL const float *beta, GLOBAL const float *mask) {
  LOCAL_ARRAY float scratch[ROW_ITEMS];
  uint r = GROUP_ID(0), lid = LOCAL_ID(0);
  if (EMBED_EMPTY || mask[r] == 0.0f) return; // padding: left undefined
  size_t at = (size_t)r * H;
  float v[ROW_EACH];
  for (uint e = 0; e < ROW_EACH; e++) {
    uint c = lid + e * ROW_ITEMS;
    v[e] = a[at + c] + residual[at + c];
  }
  row_norm(scratch, v, out + at, gamma, beta);
}

// out[s] = L2-normalised mean of x's rows of sequence s whose mask is 1 (a sequence
// without one gives zeros). Global 128 x sequences, local 128 (one dimension).
KERNEL pool(GLOBAL float *out, GLOBAL const float *x, GLOBAL const float *mask, uint tokens) {
  if (EMBED_EMPTY) return;
  LOCAL_ARRAY float scratch[ROW_ITEMS];
  uint s = GROUP_ID(0), lid = LOCAL_ID(0);
  float v[ROW_EACH];
  for (uint e = 0; e < ROW_EACH; e++) v[e] = 0.0f;
  float count = 0.0f;
  for (uint t = 0; t < tokens; t++) {
    size_t r = (size_t)s * tokens + t;
    if (mask[r] == 0.0f) continue;
    count += 1.0f;
    for (uint e = 0; e < ROW_EACH; e++) v[e] += x[r * H + lid + e * ROW_ITEMS];
  }
  float squares = 0.0f;
  for (uint e = 0; e < ROW_EACH; e++) {
    v[e] /= MAX(count, 1e-9f);
    squares += v[e] * v[e];
  }
  float norm = SQRT(row_sum(scratch, squares));
  float inverse = 1.0f / MAX(norm, 1e-12f);
  for (uint e = 0; e < ROW_EACH; e++) out[(size_t)s * H + lid + e * ROW_ITEMS] = v[e] * inverse;
}
