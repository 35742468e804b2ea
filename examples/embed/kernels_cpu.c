// The forward pass's kernels on the CPU: C functions that devbuf_queue_submit runs on the
// compute queue's worker thread (one compute queue: the helper below serves one kernel at a
// time). Each kernel splits its work in chunks that the worker and a helper thread of ours
// take in turn (a "team" of two); the matrix products are OpenBLAS's cblas_sgemm,
// single-threaded inside each chunk, so that the two cores never wait for each other's
// thread pools. Row-wise kernels compute the rows of tokens only, not the padding. The
// element-wise loops (LayerNorm, GELU, softmax) are written to vectorise and are built for
// x86-64-v4 (AVX-512), v3 (AVX2) and baseline x86-64 (target_clones), the right one picked
// when the program starts.
#include "kernels.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMBED_TSAN 1
#endif
#elif defined(__SANITIZE_THREAD__)
#define EMBED_TSAN 1
#endif

// ThreadSanitizer instruments the clones' resolvers, which the dynamic linker runs before
// its runtime is up: no clones there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(EMBED_TSAN)
#define EMBED_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define EMBED_CLONES
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define EMBED_PAUSE() _mm_pause()
#else
#define EMBED_PAUSE() ((void)0)
#endif

#define H  EMBED_HIDDEN
#define HD EMBED_HEAD_DIM

// ---- OpenBLAS's kernels --------------------------------------------------------------------
// OpenBLAS 0.3.21 (Debian 12) does not know AMD's Zen 4 and Zen 5 and runs its Haswell
// (AVX2) kernels there: sgemm at 40% of the speed of its SkylakeX (AVX-512) kernels on this
// project's machine. It reads OPENBLAS_CORETYPE in its constructor, which runs before any
// code of ours, except what the executable's .preinit_array names: there we ask for SkylakeX
// on AMD processors that have AVX-512 F/DQ/BW/VL, unless the user chose a core already.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
static void pick_blas_core(int argc, char **argv, char **envp) {
  (void)argc, (void)argv, (void)envp;
  __builtin_cpu_init();
  if (getenv("OPENBLAS_CORETYPE") || !__builtin_cpu_is("amd")) return;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
}
__attribute__((section(".preinit_array"),
               used)) static void (*const preinit_blas)(int, char **, char **) = pick_blas_core;
#endif

// ---- the team: the worker thread and one helper ----------------------------------------
// team_run(fn, ctx, chunks) runs fn(ctx, c, chunks, thread) for every chunk c < chunks, on
// the calling thread (the queue's worker, thread 0) and on the helper (thread 1), each taking
// the next chunk as it is free, so that a thread the system preempts holds up one chunk, not
// half the kernel. It returns when all are done. The helper spins a few tens of microseconds
// after a kernel (the next one follows within microseconds while the queue has work), then
// sleeps on a condition variable.
typedef void (*part_fn)(void *ctx, unsigned chunk, unsigned chunks, unsigned thread);

_Static_assert(EMBED_FFN_PARTS == 4, "linear_parts takes 4 inputs");

#define SPINS         4000 // pauses a waiting thread spins before it sleeps or yields
#define SCRATCH_BYTES (3 * EMBED_MAX_TOKENS * HD * sizeof(float) + 4096)

static struct team {
  unsigned threads;          // 1: no helper; 2: the worker and the helper
  pthread_t helper;          // valid while threads == 2
  atomic_uint posted;        // the generation of the work posted (counts from 1)
  atomic_uint_fast64_t next; // generation << 32 | chunks << 16 | the next chunk to take
  atomic_uint done;          // chunks of the current generation finished
  atomic_int sleeping;       // the helper waits on `wake`
  bool quit;                 // set with the last generation
  part_fn fn;                // the posted work, written before `posted` and `next`
  void *ctx;                 //
  pthread_mutex_t lock;      // guards the sleep
  pthread_cond_t wake;       //
  float *scratch[2];         // per thread: SCRATCH_BYTES for attention
} team = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

// Runs chunks of generation `generation` until none is left; returns how many it ran. A
// chunk taken is one the poster waits for, so fn and ctx stay those of its generation.
static unsigned take_chunks(uint64_t generation, unsigned thread) {
  unsigned ran = 0;
  uint_fast64_t next = atomic_load_explicit(&team.next, memory_order_acquire);
  for (;;) {
    unsigned chunk = next & 0xffff, chunks = (next >> 16) & 0xffff;
    if (next >> 32 != generation || chunk >= chunks) return ran;
    if (!atomic_compare_exchange_weak_explicit(&team.next, &next, next + 1, memory_order_acquire,
                                               memory_order_acquire))
      continue;
    team.fn(team.ctx, chunk, chunks, thread);
    ran++;
    next = atomic_load_explicit(&team.next, memory_order_acquire);
  }
}

static void *helper_main(void *unused) {
  (void)unused;
  unsigned seen = 0;
  for (;;) {
    unsigned posted;
    for (int spins = 0; (posted = atomic_load_explicit(&team.posted, memory_order_acquire)) == seen;
         spins++) {
      if (spins < SPINS) {
        EMBED_PAUSE();
        continue;
      }
      pthread_mutex_lock(&team.lock);
      atomic_store(&team.sleeping, 1);
      while ((posted = atomic_load(&team.posted)) == seen)
        pthread_cond_wait(&team.wake, &team.lock);
      atomic_store(&team.sleeping, 0);
      pthread_mutex_unlock(&team.lock);
      break;
    }
    seen = posted;
    if (team.quit) return NULL;
    unsigned ran = take_chunks(posted, 1);
    if (ran) atomic_fetch_add_explicit(&team.done, ran, memory_order_release);
  }
}

static void post(unsigned chunks) {
  unsigned generation = atomic_load(&team.posted) + 1;
  atomic_store(&team.done, 0);
  atomic_store_explicit(&team.next, (uint_fast64_t)generation << 32 | (uint_fast64_t)chunks << 16,
                        memory_order_release);
  atomic_store(&team.posted, generation);
  if (atomic_load(&team.sleeping)) {
    pthread_mutex_lock(&team.lock);
    pthread_cond_signal(&team.wake);
    pthread_mutex_unlock(&team.lock);
  }
}

static void team_run(part_fn fn, void *ctx, unsigned chunks) { // chunks < 65536
  if (team.threads < 2 || chunks < 2) {
    for (unsigned c = 0; c < chunks; c++) fn(ctx, c, chunks, 0);
    return;
  }
  team.fn = fn;
  team.ctx = ctx;
  post(chunks);
  unsigned ran = take_chunks(atomic_load(&team.posted), 0);
  atomic_fetch_add_explicit(&team.done, ran, memory_order_relaxed);
  for (int spins = 0; atomic_load_explicit(&team.done, memory_order_acquire) != chunks; spins++) {
    if (spins < SPINS)
      EMBED_PAUSE();
    else
      sched_yield(); // the helper's chunk is late: it may want this core
  }
}

devbuf_status embed_cpu_start(unsigned threads) {
  openblas_set_num_threads(1);
  team.threads = 1; // 2 once the helper runs: embed_cpu_stop joins only a thread that started
  for (unsigned p = 0; p < 2; p++) {
    team.scratch[p] = aligned_alloc(64, SCRATCH_BYTES);
    if (!team.scratch[p]) return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory for scratch");
  }
  if (threads >= 2) {
    if (pthread_create(&team.helper, NULL, helper_main, NULL) != 0)
      return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "cannot start the kernels' helper thread");
    team.threads = 2;
  }
  return DEVBUF_OK;
}

void embed_cpu_stop(void) {
  if (team.threads == 2) {
    team.quit = true;
    post(0);
    pthread_join(team.helper, NULL);
    team.threads = 1;
  }
  for (unsigned p = 0; p < 2; p++) free(team.scratch[p]), team.scratch[p] = NULL;
}

const char *embed_cpu_blas_core(void) { return openblas_get_corename(); }

// [begin, end) of `count` items for chunk `chunk` of `chunks`, in steps of `step`.
static void share(size_t count, size_t step, unsigned chunk, unsigned chunks, size_t *begin,
                  size_t *end) {
  size_t units = (count + step - 1) / step;
  *begin = units * chunk / chunks * step;
  *end = units * (chunk + 1) / chunks * step;
  if (*end > count) *end = count;
  if (*begin > count) *begin = count;
}

// Chunks for `items` items, at least `least` items each, at most `most` chunks.
static unsigned chunks_of(size_t items, size_t least, unsigned most) {
  size_t chunks = (items + least - 1) / least;
  return chunks < 1 ? 1 : chunks > most ? most : (unsigned)chunks;
}

// ---- vectorisable element-wise functions ---------------------------------------------------

// exp for x <= 0 (softmax): Cephes' polynomial on a range-reduced argument, relative error
// below 1e-7; no library call, so that the loops that use it vectorise.
static inline float exp_neg(float x) {
  x = x >= -87.0f ? x : -87.0f; // NaN too: converting it to an integer below would be undefined
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; // round to nearest
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// erf as a rational function on [-4, 4] (beyond, +-1 in float), absolute error 4e-7.
static inline float erf_rational(float x) {
  x = x < -4.0f ? -4.0f : x > 4.0f ? 4.0f : x;
  float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p + -2.10102402082508e-06f;
  p = x2 * p + -5.69250639462346e-05f;
  p = x2 * p + -7.34990630326855e-04f;
  p = x2 * p + -2.95459980854025e-03f;
  p = x2 * p + -1.60960333262415e-02f;
  float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
  q = x2 * q + -1.68282697438203e-03f;
  q = x2 * q + -7.37332916720468e-03f;
  q = x2 * q + -1.42647390514189e-02f;
  return x * p / q;
}

// The sum of H floats in 16 lanes (a sum the compiler may vectorise without reassociating).
static inline float sum_row(const float *v) {
  float lanes[16] = {0};
  for (size_t c = 0; c < H; c += 16)
    for (size_t l = 0; l < 16; l++) lanes[l] += v[c + l];
  float sum = 0.0f;
  for (size_t l = 0; l < 16; l++) sum += lanes[l];
  return sum;
}

// out = LayerNorm(v) * gamma + beta over one row; `v` is overwritten.
static inline void norm_row(float *out, float *v, const float *gamma, const float *beta) {
  float mean = sum_row(v) * (1.0f / H);
  for (size_t c = 0; c < H; c++) v[c] -= mean;
  float lanes[16] = {0};
  for (size_t c = 0; c < H; c += 16)
    for (size_t l = 0; l < 16; l++) lanes[l] += v[c + l] * v[c + l];
  float squares = 0.0f;
  for (size_t l = 0; l < 16; l++) squares += lanes[l];
  float scale = 1.0f / sqrtf(squares * (1.0f / H) + 1e-12f);
  for (size_t c = 0; c < H; c++) out[c] = v[c] * scale * gamma[c] + beta[c];
}

// ---- the rows of tokens -------------------------------------------------------------------
// Row-wise kernels compute the rows of tokens only, as runs of consecutive rows: one per
// sequence, merged across the padding between two runs when that gap is short (a product
// over one long run is faster than over two short ones and the few rows between).

#define MAX_RUNS  4096 // the largest batch (--batch)
#define SHORT_GAP 8    // rows of padding a run is merged across

typedef struct row_run {
  uint32_t first, count; // rows [first, first + count)
} row_run;

typedef struct row_runs {
  size_t count, rows; // runs; rows in them
  row_run run[MAX_RUNS];
} row_runs;

static void find_runs(row_runs *out, const float *mask, size_t seqs, size_t tokens) {
  out->count = out->rows = 0;
  for (size_t s = 0; s < seqs; s++) {
    size_t length = tokens;
    while (length > 0 && mask[s * tokens + length - 1] == 0.0f) length--;
    if (length == 0) continue;
    size_t first = s * tokens;
    row_run *last = out->count ? &out->run[out->count - 1] : NULL;
    if (last && first - (last->first + last->count) <= SHORT_GAP) {
      out->rows += first + length - (last->first + last->count);
      last->count = (uint32_t)(first + length - last->first);
    } else {
      out->run[out->count++] = (row_run){(uint32_t)first, (uint32_t)length};
      out->rows += length;
    }
  }
}

// Calls row(ctx, r) for the rows [begin, end) of the runs' rows taken in order.
static void for_rows(const row_runs *runs, size_t begin, size_t end, void (*row)(void *, size_t),
                     void *ctx) {
  size_t seen = 0;
  for (size_t i = 0; i < runs->count && seen < end; i++) {
    const row_run *r = &runs->run[i];
    size_t from = begin > seen ? begin - seen : 0,
           to = end - seen < r->count ? end - seen : r->count;
    for (size_t k = from; k < to; k++) row(ctx, r->first + k);
    seen += r->count;
  }
}

// ---- kernels -------------------------------------------------------------------------------

typedef struct upload_scalars {
  uint32_t rows; // followed by rows int32 ids, then rows float mask values
} upload_scalars;

static devbuf_status upload_kernel(const devbuf_kernel_args_t *a) {
  const upload_scalars *s = a->scalars;
  const char *bytes = (const char *)(s + 1);
  memcpy(a->data[0], bytes, (size_t)s->rows * sizeof(int32_t));
  memcpy(a->data[1], bytes + (size_t)s->rows * sizeof(int32_t), (size_t)s->rows * sizeof(float));
  return DEVBUF_OK;
}

// The scalars of every kernel over a batch, and what each computes from them.
typedef struct shape_scalars {
  uint32_t seqs, tokens;
  uint32_t n, k, gelu;     // products
  uint32_t outputs, parts; // products: outputs of one input, or one output of `parts` inputs
} shape_scalars;

typedef struct embed_work {
  float *out;
  const int32_t *ids;
  const float *word, *position, *type, *gamma, *beta;
  size_t tokens;
  _Atomic int bad_id; // an id out of range (the host checks them all; this is a backstop)
  row_runs runs;
} embed_work;

EMBED_CLONES static void embed_row(void *ctx, size_t r) {
  embed_work *w = ctx;
  int32_t id = w->ids[r];
  if (id < 0 || id >= EMBED_VOCAB) {
    atomic_store(&w->bad_id, 1);
    id = 100; // [UNK]
  }
  const float *word = w->word + (size_t)id * H, *position = w->position + (r % w->tokens) * H;
  float v[H];
  for (size_t c = 0; c < H; c++) v[c] = word[c] + position[c] + w->type[c];
  norm_row(w->out + r * H, v, w->gamma, w->beta);
}

static void embed_part(void *ctx, unsigned chunk, unsigned chunks, unsigned thread) {
  embed_work *w = ctx;
  size_t begin, end;
  share(w->runs.rows, 1, chunk, chunks, &begin, &end);
  for_rows(&w->runs, begin, end, embed_row, w);
}

static devbuf_status embed_kernel(const devbuf_kernel_args_t *a) {
  const shape_scalars *s = a->scalars;
  embed_work *w = malloc(sizeof *w);
  if (!w) return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory for a kernel's rows");
  w->out = a->data[0], w->ids = a->data[1], w->word = a->data[2], w->position = a->data[3];
  w->type = a->data[4], w->gamma = a->data[5], w->beta = a->data[6], w->tokens = s->tokens;
  atomic_init(&w->bad_id, 0);
  find_runs(&w->runs, a->data[7], s->seqs, s->tokens);
  team_run(embed_part, w, chunks_of(w->runs.rows, 16, 16));
  int bad = atomic_load(&w->bad_id);
  free(w);
  return bad ? devbuf_set_error(DEVBUF_INVALID_ARGUMENT, "a token id outside the vocabulary")
             : DEVBUF_OK;
}

// Products: `outputs` (1 to 4) of one input, or one output of EMBED_FFN_PARTS inputs (the
// columns of the input split into activations of their own). Each chunk is one output over
// a share of the rows (long batches: OpenBLAS packs the weights once per chunk and the rows
// once) or over a share of the columns (short ones, which have too few rows to share).
typedef struct linear_work {
  float *out[EMBED_FFN_PARTS];
  const float *in[EMBED_FFN_PARTS], *w[EMBED_FFN_PARTS], *bias[EMBED_FFN_PARTS];
  size_t outputs, parts, n, k;        // k: columns of each input
  unsigned row_chunks, column_chunks; // per output
  bool gelu;
  row_runs runs;
} linear_work;

// out[r, c] = bias[c] for the rows and columns of one chunk, before the products add to it.
EMBED_CLONES static void fill_bias(float *out, size_t ld, const float *bias, size_t rows,
                                   size_t cols) {
  for (size_t r = 0; r < rows; r++) memcpy(out + r * ld, bias, cols * sizeof(float));
}

EMBED_CLONES static void gelu_rows(float *out, size_t ld, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; r++) {
    float *y = out + r * ld;
    for (size_t c = 0; c < cols; c++)
      y[c] = 0.5f * y[c] * (1.0f + erf_rational(y[c] * 0.70710678118654752f));
  }
}

// out[o][rows, begin:end] = bias + sum over p of in[p][rows] . w[o][begin:end, p k:(p + 1) k]^T
static void product(const linear_work *w, size_t o, size_t first, size_t rows, size_t begin,
                    size_t end) {
  size_t ldw = w->parts * w->k;
  float *out = w->out[o] + first * w->n + begin;
  fill_bias(out, w->n, w->bias[o] + begin, rows, end - begin);
  for (size_t p = 0; p < w->parts; p++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)(end - begin), (int)w->k,
                1.0f, w->in[p] + first * w->k, (int)w->k, w->w[o] + begin * ldw + p * w->k,
                (int)ldw, 1.0f, out, (int)w->n);
  if (w->gelu) gelu_rows(out, w->n, rows, end - begin);
}

static void linear_part(void *ctx, unsigned chunk, unsigned chunks, unsigned thread) {
  linear_work *w = ctx;
  unsigned per_output = w->row_chunks * w->column_chunks;
  size_t o = chunk / per_output, begin, end, row_begin, row_end;
  share(w->n, 32, chunk % per_output % w->column_chunks, w->column_chunks, &begin, &end);
  share(w->runs.rows, 1, chunk % per_output / w->column_chunks, w->row_chunks, &row_begin,
        &row_end);
  size_t seen = 0; // rows of the runs before run i
  for (size_t i = 0; i < w->runs.count && seen < row_end; seen += w->runs.run[i++].count) {
    const row_run *r = &w->runs.run[i];
    size_t from = row_begin > seen ? row_begin - seen : 0;
    size_t to = row_end - seen < r->count ? row_end - seen : r->count;
    if (from < to && begin < end) product(w, o, r->first + from, to - from, begin, end);
  }
}

// Uses: the outputs, the inputs, the weights, the biases, the mask.
static devbuf_status linear_kernel(const devbuf_kernel_args_t *a) {
  const shape_scalars *s = a->scalars;
  linear_work *w = malloc(sizeof *w);
  if (!w) return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory for a kernel's rows");
  w->outputs = s->outputs, w->parts = s->parts, w->n = s->n, w->k = s->k, w->gelu = s->gelu;
  size_t u = 0;
  for (size_t o = 0; o < w->outputs; o++) w->out[o] = a->data[u++];
  for (size_t p = 0; p < w->parts; p++) w->in[p] = a->data[u++];
  for (size_t o = 0; o < w->outputs; o++) w->w[o] = a->data[u++];
  for (size_t o = 0; o < w->outputs; o++) w->bias[o] = a->data[u++];
  find_runs(&w->runs, a->data[u], s->seqs, s->tokens);
  // About six chunks in all, so that two threads share them evenly.
  unsigned share_of = (unsigned)((6 + w->outputs - 1) / w->outputs);
  w->row_chunks = w->runs.rows >= 128 ? chunks_of(w->runs.rows, 32, share_of) : 1;
  w->column_chunks = w->runs.rows >= 128 ? 1 : chunks_of(w->n, 96, share_of);
  team_run(linear_part, w, (unsigned)w->outputs * w->row_chunks * w->column_chunks);
  free(w);
  return DEVBUF_OK;
}

typedef struct attention_work {
  float *ctx;
  const float *q, *k, *v, *mask;
  size_t seqs, tokens;
} attention_work;

// One head of one sequence: the live keys gathered (k transposed, v as rows), then for each
// live query the scores over them, their softmax, and the weighted sum of the values.
EMBED_CLONES static void attend(const attention_work *w, size_t seq, size_t head, float *scratch) {
  size_t tokens = w->tokens, first = seq * tokens;
  float *kt = scratch;                    // [HD][tokens]: keys, transposed
  float *vs = kt + HD * EMBED_MAX_TOKENS; // [tokens][HD]: values
  float *p = vs + HD * EMBED_MAX_TOKENS;  // [tokens]: scores, then weights
  size_t keys = 0;
  for (size_t j = 0; j < tokens; j++) {
    if (w->mask[first + j] == 0.0f) continue;
    const float *kr = w->k + (first + j) * H + head * HD, *vr = w->v + (first + j) * H + head * HD;
    for (size_t d = 0; d < HD; d++) kt[d * tokens + keys] = kr[d];
    memcpy(vs + keys * HD, vr, HD * sizeof(float));
    keys++;
  }
  const float scale = 0.17677669529663689f; // 1 / sqrt(32)
  for (size_t i = 0; i < tokens; i++) {
    float *out = w->ctx + (first + i) * H + head * HD;
    if (w->mask[first + i] == 0.0f || keys == 0) {
      memset(out, 0, HD * sizeof(float));
      continue;
    }
    const float *qr = w->q + (first + i) * H + head * HD;
    for (size_t j = 0; j < keys; j++) p[j] = 0.0f;
    for (size_t d = 0; d < HD; d++) {
      float qd = qr[d] * scale;
      const float *kd = kt + d * tokens;
      for (size_t j = 0; j < keys; j++) p[j] += qd * kd[j];
    }
    float best = p[0];
    for (size_t j = 1; j < keys; j++) best = p[j] > best ? p[j] : best;
    float total = 0.0f;
    for (size_t j = 0; j < keys; j++) {
      p[j] = exp_neg(p[j] - best);
      total += p[j];
    }
    float acc[HD] = {0};
    for (size_t j = 0; j < keys; j++)
      for (size_t d = 0; d < HD; d++) acc[d] += p[j] * vs[j * HD + d];
    float inverse = 1.0f / total;
    for (size_t d = 0; d < HD; d++) out[d] = acc[d] * inverse;
  }
}

static void attention_part(void *ctx, unsigned chunk, unsigned chunks, unsigned thread) {
  attention_work *w = ctx;
  size_t begin, end;
  share(w->seqs * EMBED_HEADS, 1, chunk, chunks, &begin, &end);
  for (size_t pair = begin; pair < end; pair++)
    attend(w, pair / EMBED_HEADS, pair % EMBED_HEADS, team.scratch[thread]);
}

static devbuf_status attention_kernel(const devbuf_kernel_args_t *a) {
  const shape_scalars *s = a->scalars;
  attention_work w = {a->data[0], a->data[1], a->data[2], a->data[3],
                      a->data[4], s->seqs,    s->tokens};
  team_run(attention_part, &w, chunks_of(w.seqs * EMBED_HEADS, 1, 48));
  return DEVBUF_OK;
}

typedef struct norm_work {
  float *out;
  const float *a, *residual, *gamma, *beta;
  row_runs runs;
} norm_work;

EMBED_CLONES static void add_norm_row(void *ctx, size_t r) {
  norm_work *w = ctx;
  const float *a = w->a + r * H, *b = w->residual + r * H;
  float v[H];
  for (size_t c = 0; c < H; c++) v[c] = a[c] + b[c];
  norm_row(w->out + r * H, v, w->gamma, w->beta);
}

static void add_norm_part(void *ctx, unsigned chunk, unsigned chunks, unsigned thread) {
  norm_work *w = ctx;
  size_t begin, end;
  share(w->runs.rows, 1, chunk, chunks, &begin, &end);
  for_rows(&w->runs, begin, end, add_norm_row, w);
}

static devbuf_status add_norm_kernel(const devbuf_kernel_args_t *a) {
  const shape_scalars *s = a->scalars;
  norm_work *w = malloc(sizeof *w);
  if (!w) return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no memory for a kernel's rows");
  w->out = a->data[0], w->a = a->data[1], w->residual = a->data[2], w->gamma = a->data[3];
  w->beta = a->data[4];
  find_runs(&w->runs, a->data[5], s->seqs, s->tokens);
  team_run(add_norm_part, w, chunks_of(w->runs.rows, 32, 16));
  free(w);
  return DEVBUF_OK;
}

typedef struct pool_work {
  float *out;
  const float *in, *mask;
  size_t seqs, tokens;
} pool_work;

EMBED_CLONES static void pool_part(void *ctx, unsigned chunk, unsigned chunks, unsigned thread) {
  pool_work *w = ctx;
  size_t begin, end;
  share(w->seqs, 1, chunk, chunks, &begin, &end);
  for (size_t s = begin; s < end; s++) {
    float sum[H] = {0}, count = 0.0f;
    for (size_t t = 0; t < w->tokens; t++) {
      size_t r = s * w->tokens + t;
      if (w->mask[r] == 0.0f) continue;
      count += 1.0f;
      const float *x = w->in + r * H;
      for (size_t c = 0; c < H; c++) sum[c] += x[c];
    }
    float inverse = 1.0f / (count > 1e-9f ? count : 1e-9f), squares = 0.0f;
    for (size_t c = 0; c < H; c++) {
      sum[c] *= inverse;
      squares += sum[c] * sum[c];
    }
    float norm = sqrtf(squares);
    float scale = 1.0f / (norm > 1e-12f ? norm : 1e-12f);
    for (size_t c = 0; c < H; c++) w->out[s * H + c] = sum[c] * scale;
  }
}

static devbuf_status pool_kernel(const devbuf_kernel_args_t *a) {
  const shape_scalars *s = a->scalars;
  pool_work w = {a->data[0], a->data[1], a->data[2], s->seqs, s->tokens};
  team_run(pool_part, &w, chunks_of(w.seqs, 1, 8));
  return DEVBUF_OK;
}

// --empty-kernels: every kernel is this one, over the same uses and scalars.
static devbuf_status empty_kernel(const devbuf_kernel_args_t *a) {
  (void)a;
  return DEVBUF_OK;
}

// ---- submissions ---------------------------------------------------------------------------

#define R(buffer) \
  { buffer, DEVBUF_ACCESS_READ }
#define W(buffer) \
  { buffer, DEVBUF_ACCESS_WRITE }

static devbuf_status submit(embed_exec_t *x, devbuf_cpu_kernel_fn kernel, const devbuf_use_t *uses,
                            size_t count, const embed_shape_t *b, const shape_scalars *products) {
  shape_scalars s = {0};
  if (products) s = *products;
  s.seqs = (uint32_t)b->seqs, s.tokens = (uint32_t)b->tokens;
  return devbuf_queue_submit(x->compute, x->empty ? empty_kernel : kernel, uses, count, &s,
                             sizeof s);
}

static devbuf_status cpu_upload(embed_exec_t *x, devbuf_buffer_t *ids, devbuf_buffer_t *mask,
                                const int32_t *host_ids, const float *host_mask, size_t rows) {
  // The ids and the mask travel as the kernel's scalars, which devbuf copies at submission.
  enum { STACK = 4096 };
  char stack[STACK], *bytes = stack;
  size_t size = sizeof(upload_scalars) + rows * (sizeof(int32_t) + sizeof(float));
  if (size > STACK && !(bytes = malloc(size)))
    return devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "no host memory for %zu token ids", rows);
  upload_scalars s = {(uint32_t)rows};
  memcpy(bytes, &s, sizeof s);
  memcpy(bytes + sizeof s, host_ids, rows * sizeof(int32_t));
  memcpy(bytes + sizeof s + rows * sizeof(int32_t), host_mask, rows * sizeof(float));
  devbuf_use_t uses[] = {W(ids), W(mask)};
  devbuf_status status =
      devbuf_queue_submit(x->upload, x->empty ? empty_kernel : upload_kernel, uses, 2, bytes, size);
  if (bytes != stack) free(bytes);
  return status;
}

static devbuf_status cpu_embed(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                               devbuf_buffer_t *ids, devbuf_buffer_t *word,
                               devbuf_buffer_t *position, devbuf_buffer_t *type,
                               devbuf_buffer_t *gamma, devbuf_buffer_t *beta) {
  devbuf_use_t uses[] = {W(out),  R(ids),   R(word), R(position),
                         R(type), R(gamma), R(beta), R(b->mask)};
  return submit(x, embed_kernel, uses, 8, b, NULL);
}

static devbuf_status cpu_linear(embed_exec_t *x, const embed_shape_t *b,
                                devbuf_buffer_t *const *out, devbuf_buffer_t *in,
                                devbuf_buffer_t *const *w, devbuf_buffer_t *const *bias,
                                size_t count, size_t n, size_t k, bool gelu) {
  if (count < 1 || count > EMBED_FFN_PARTS)
    return devbuf_set_error(DEVBUF_INVALID_ARGUMENT, "%zu products of one input", count);
  devbuf_use_t uses[3 * EMBED_FFN_PARTS + 2];
  size_t u = 0;
  for (size_t i = 0; i < count; i++) uses[u++] = (devbuf_use_t)W(out[i]);
  uses[u++] = (devbuf_use_t)R(in);
  for (size_t i = 0; i < count; i++) uses[u++] = (devbuf_use_t)R(w[i]);
  for (size_t i = 0; i < count; i++) uses[u++] = (devbuf_use_t)R(bias[i]);
  uses[u++] = (devbuf_use_t)R(b->mask);
  shape_scalars s = {
      .n = (uint32_t)n, .k = (uint32_t)k, .gelu = gelu, .outputs = (uint32_t)count, .parts = 1};
  return submit(x, linear_kernel, uses, u, b, &s);
}

static devbuf_status cpu_linear_parts(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                                      devbuf_buffer_t *const *in, devbuf_buffer_t *w,
                                      devbuf_buffer_t *bias, size_t n, size_t k) {
  devbuf_use_t uses[] = {W(out), R(in[0]), R(in[1]), R(in[2]), R(in[3]), R(w), R(bias), R(b->mask)};
  shape_scalars s = {.n = (uint32_t)n, .k = (uint32_t)k, .outputs = 1, .parts = EMBED_FFN_PARTS};
  return submit(x, linear_kernel, uses, 8, b, &s);
}

static devbuf_status cpu_attention(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *ctx,
                                   devbuf_buffer_t *q, devbuf_buffer_t *k, devbuf_buffer_t *v) {
  devbuf_use_t uses[] = {W(ctx), R(q), R(k), R(v), R(b->mask)};
  return submit(x, attention_kernel, uses, 5, b, NULL);
}

static devbuf_status cpu_add_norm(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                                  devbuf_buffer_t *a, devbuf_buffer_t *residual,
                                  devbuf_buffer_t *gamma, devbuf_buffer_t *beta) {
  devbuf_use_t uses[] = {W(out), R(a), R(residual), R(gamma), R(beta), R(b->mask)};
  return submit(x, add_norm_kernel, uses, 6, b, NULL);
}

static devbuf_status cpu_pool(embed_exec_t *x, const embed_shape_t *b, devbuf_buffer_t *out,
                              devbuf_buffer_t *in) {
  devbuf_use_t uses[] = {W(out), R(in), R(b->mask)};
  return submit(x, pool_kernel, uses, 3, b, NULL);
}

const embed_kernels_t embed_cpu_kernels = {
    .upload = cpu_upload,
    .embed = cpu_embed,
    .linear = cpu_linear,
    .linear_parts = cpu_linear_parts,
    .attention = cpu_attention,
    .add_norm = cpu_add_norm,
    .pool = cpu_pool,
};
