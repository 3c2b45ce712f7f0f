/* papers: jacobi-2d by hand, AVX-512 intrinsics → the machine's reference for tensorlang's recurrence.

   The recurrence's own schedule, written out: parallelogram tiles of (t, s = t + i), TT steps by
   SS skewed rows, each tile's steps taken JJ at a time row by row (scheduler/timetile.py), two
   planes (t mod 2) with rows padded to 16 floats, every row as aligned 16-lane vectors whose
   j - 1 and j + 1 neighbours are `valignd`s of the loads, masked stores at the row's ends. The
   update is the program's, in its order: 0.2 * ((((c + u) + d) + l) + r), so results are
   bitwise tensorlang's. c_limit.py loads this file's shared object with ctypes. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static long N, M, W;          /* rows, columns, padded row pitch (floats) */
static float *planes;         /* 2 planes of N x W */
static size_t mapped_bytes;

#define PLANE(t) (planes + (size_t)((t) & 1) * N * W)
#define AL(lo, hi, r) \
  _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(hi), _mm512_castps_si512(lo), r))

static inline __m512 update(const float *u, const float *d, long j, __m512 prev, __m512 cur, __m512 next) {
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(cur, _mm512_load_ps(u + j)),
                                                       _mm512_load_ps(d + j)),
                                         AL(prev, cur, 15)),
                           AL(cur, next, 1));
  return _mm512_mul_ps(_mm512_set1_ps(0.2f), s);
}

/* o[j] for j in [1, M - 1) from rows u, c, d (1 <= i <= N - 2): a masked block, unmasked
   blocks, a masked block; every load inside the planes (rows are padded to whole vectors, and
   the vectors just before and after a row are its neighbours' rows) */
static void row(const float *u, const float *c, const float *d, float *o) {
  long j1 = M - 1, j = 0;
  __m512 prev = _mm512_load_ps(c - 16), cur = _mm512_load_ps(c), next = _mm512_load_ps(c + 16);
  __mmask16 head = (__mmask16)0xFFFE;
  if (j1 < 16) head &= (__mmask16)((1u << j1) - 1);
  _mm512_mask_store_ps(o, head, update(u, d, 0, prev, cur, next));
  for (j = 16; j + 16 <= j1; j += 16) {
    prev = cur;
    cur = next;
    next = _mm512_load_ps(c + j + 16);
    _mm512_store_ps(o + j, update(u, d, j, prev, cur, next));
  }
  if (j < j1) {
    prev = cur;
    cur = next;
    next = _mm512_load_ps(c + j + 16);
    _mm512_mask_store_ps(o + j, (__mmask16)((1u << (j1 - j)) - 1), update(u, d, j, prev, cur, next));
  }
}

static void point_row(long t, long i) {
  float *o = PLANE(t) + i * W;
  const float *c = PLANE(t - 1) + i * W;
  if (i == 0 || i == N - 1) {
    memcpy(o, c, M * sizeof(float));
    return;
  }
  o[0] = c[0];
  o[M - 1] = c[M - 1];
  row(c - W, c, c + W, o);
}

/* plane 0 = a again (row-major, N x M) */
void ref_reset(const float *a) {
  for (long i = 0; i < N; i++) memcpy(planes + i * W, a + i * M, M * sizeof(float));
}

/* planes for an n x m grid, plane 0 = a (row-major, n x m); 0 on success */
int ref_init(long n, long m, const float *a) {
  if (planes) munmap(planes, mapped_bytes);
  N = n, M = m, W = (m + 15) / 16 * 16;
  size_t bytes = 2 * (size_t)N * W * sizeof(float), huge = (size_t)2 << 20;
  mapped_bytes = (bytes + huge - 1) / huge * huge;
  planes = mmap(NULL, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (planes == MAP_FAILED) return planes = NULL, 1;
  madvise(planes, mapped_bytes, MADV_HUGEPAGE);
  memset(planes, 0, 2 * (size_t)N * W * sizeof(float));  /* both planes faulted in here, not in a run */
  ref_reset(a);
  return 0;
}

/* steps 1 .. t - 1 in tiles of tt steps by ss skewed rows, jj steps at a time */
void ref_run(long t, long tt, long ss, long jj) {
  for (long t0 = 1; t0 < t; t0 += tt) {
    long t1 = t0 + tt < t ? t0 + tt : t;
    long first = t0 - ((t0 % ss) + ss) % ss;
    for (long s0 = first; s0 < t1 + N; s0 += ss)
      for (long g = t0; g < t1; g += jj) {
        long g1 = g + jj < t1 ? g + jj : t1;
        for (long s = s0 < g ? g : s0; s < s0 + ss; s++)
          for (long step = g; step < g1; step++) {
            long i = s - step;
            if (i >= 0 && i < N) point_row(step, i);
          }
      }
  }
}

/* plane (t - 1) mod 2, unpadded, into out (n x m) */
void ref_result(long t, float *out) {
  for (long i = 0; i < N; i++) memcpy(out + i * M, PLANE(t - 1) + i * W, M * sizeof(float));
}

/* the update on rows that stay in L1 (a ring of `ring` <= N rows of plane 0, written to plane 1;
   reps rows in all): the loop's
   own bound on this core */
void ref_rows_in_l1(long ring, long reps) {
  if (ring < 3 || ring > N) return;
  for (long r = 0; r < reps; r++) {
    long i = 1 + r % (ring - 2);
    row(planes + (i - 1) * W, planes + i * W, planes + (i + 1) * W, planes + (size_t)N * W + i * W);
  }
}
