// The softmax of mxamp's own, float32 rows in, INT8 out (softmax_int8.h). Each
// row is read twice (its maximum, then its exponentials and their sum)
// and its exponentials once more, from a row of the thread's own that
// stays in L1; nothing but the INT8 output goes to memory: no float32
// tensor to store and reread.
#include "softmax_int8.h"

#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#define MXAMP_AVX2 __attribute__((target("avx2,fma")))

namespace mxamp_onednn {
namespace {

constexpr int64_t kLanes = 8;  // floats in a vector

// The row's floats j..j+7; past its end -infinity, which leaves its maximum
// as it is and adds (next to) nothing to its sum.
MXAMP_AVX2 inline __m256 load(const float* row, int64_t j, int64_t cols) {
  if (j + kLanes <= cols) return _mm256_loadu_ps(row + j);
  const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols - j)),
                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(row + j, in),
                          _mm256_castsi256_ps(in));
}

// e^x for x <= 0: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor
// series to r^6 (relative error about 2e-7), times 2^n built in the exponent
// bits. Below -87, where 2^n would leave float's normal range, e^-87 (1.6e-38:
// 0 in u8 after any scale a probability can have).
MXAMP_AVX2 inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln 2 in two parts, the first exact in few bits, so that n * ln2_hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i two_n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// One float of the eight lanes, combined by `op` (max or add).
template <typename Op>
MXAMP_AVX2 inline float across(__m256 v, Op op) {
  __m128 h = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = op(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(op(h, _mm_shuffle_ps(h, h, 1)));
}

// One row; `exps` holds the row's exponentials (cols rounded up to a whole
// vector), computed once.
MXAMP_AVX2 void softmax_row(const float* src, uint8_t* dst, int64_t cols, float scale,
                            float most_steps, float* exps) {
  __m256 most = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < cols; j += kLanes) most = _mm256_max_ps(most, load(src, j, cols));
  const __m256 top =
      _mm256_set1_ps(across(most, [](__m128 a, __m128 b) { return _mm_max_ps(a, b); }));
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < cols; j += kLanes) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(load(src, j, cols), top));
    _mm256_storeu_ps(exps + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float total = across(sum, [](__m128 a, __m128 b) { return _mm_add_ps(a, b); });
  // Each exponential in output steps, capped at the type's saturation, then
  // rounded to the nearest (even) integer as oneDNN's conversion rounds. A
  // probability is never negative: s8's bytes are u8's up to 127.
  const __m256 step = _mm256_set1_ps(1 / (total * scale)), cap = _mm256_set1_ps(most_steps);
  for (int64_t j = 0; j < cols; j += kLanes) {
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(exps + j), step);
    const __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(p, cap));
    const __m128i words =
        _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i bytes = _mm_packus_epi16(words, words);
    if (j + kLanes <= cols)
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + j), bytes);
    else
      std::memcpy(dst + j, &bytes, static_cast<size_t>(cols - j));
  }
}

}  // namespace

void softmax_int8(const float* src, void* dst, int64_t rows, int64_t cols, float scale,
                  bool out_signed) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const float most_steps = out_signed ? 127 : 255;
  const int64_t padded = (cols + kLanes - 1) / kLanes * kLanes;
  std::vector<float> exps(static_cast<size_t>(threads * padded));  // a row's per thread
  uint8_t* out = static_cast<uint8_t*>(dst);
#pragma omp parallel for schedule(static) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r)
    softmax_row(src + r * cols, out + r * cols, cols, scale, most_steps,
                exps.data() + omp_get_thread_num() * padded);
}

}  // namespace mxamp_onednn
