// The softmax of mxamp's own, float32 or bfloat16 rows in, INT8 out
// (softmax_int8.h). Each row is read twice (its maximum, then its
// exponentials and their sum) and its exponentials once more, from a row of
// the thread's own that stays in L1; nothing but the INT8 output goes to
// memory: no float32 tensor to store and reread. The row's steps
// (softmax_row.h) are compiled twice: for AVX2 with FMA, 8 floats a
// vector, and for AVX-512, 16. Each copy's functions carry their ISA's
// target attribute (MXAMP_ISA), so that the AVX2 copy holds no AVX-512
// instruction.
#include "softmax_int8.h"

#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine.h"

namespace mxamp_onednn {
namespace {

// bfloat16 as stored: a float's upper 16 bits.
struct BF16 {
  uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(BF16 x) {
  uint32_t word = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

#define MXAMP_ISA __attribute__((target("avx2,fma")))
namespace avx2 {

constexpr int64_t kLanes = 8;
using Vec = __m256;

MXAMP_ISA inline Vec splat(float x) { return _mm256_set1_ps(x); }
MXAMP_ISA inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
MXAMP_ISA inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
MXAMP_ISA inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
MXAMP_ISA inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
MXAMP_ISA inline Vec nearest(Vec x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// p * 2^n, n whole and within float's normal exponents: 2^n built in the
// exponent bits.
MXAMP_ISA inline Vec times_two_to(Vec p, Vec n) {
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

MXAMP_ISA inline Vec whole(const float* at) { return _mm256_loadu_ps(at); }
MXAMP_ISA inline Vec whole(const BF16* at) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
// The row's floats j..j+7; past its end -infinity, which leaves its maximum
// as it is and adds (next to) nothing to its sum.
template <typename T>
MXAMP_ISA inline Vec load(const T* row, int64_t j, int64_t cols) {
  if (j + kLanes <= cols) return whole(row + j);
  float tail[kLanes];
  for (int64_t k = 0; k < kLanes; ++k) tail[k] = j + k < cols ? to_float(row[j + k]) : -INFINITY;
  return _mm256_loadu_ps(tail);
}

// One float of the eight lanes, combined by `op` (max or add).
template <typename Op>
MXAMP_ISA inline float across(Vec v, Op op) {
  __m128 h = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = op(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(op(h, _mm_shuffle_ps(h, h, 1)));
}
MXAMP_ISA inline float max_of(Vec v) {
  return across(v, [](__m128 a, __m128 b) { return _mm_max_ps(a, b); });
}
MXAMP_ISA inline float sum_of(Vec v) {
  return across(v, [](__m128 a, __m128 b) { return _mm_add_ps(a, b); });
}

// The nearest integers of p (0 to 255) as bytes at dst + j, within the row.
MXAMP_ISA inline void store_steps(Vec p, uint8_t* dst, int64_t j, int64_t cols) {
  const __m256i q = _mm256_cvtps_epi32(p);
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  const __m128i bytes = _mm_packus_epi16(words, words);
  if (j + kLanes <= cols)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + j), bytes);
  else
    std::memcpy(dst + j, &bytes, static_cast<size_t>(cols - j));
}

#include "softmax_row.h"

}  // namespace avx2
#undef MXAMP_ISA

#define MXAMP_ISA __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))
namespace avx512 {

constexpr int64_t kLanes = 16;
using Vec = __m512;

MXAMP_ISA inline Vec splat(float x) { return _mm512_set1_ps(x); }
MXAMP_ISA inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
MXAMP_ISA inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
MXAMP_ISA inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
MXAMP_ISA inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
MXAMP_ISA inline Vec nearest(Vec x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
MXAMP_ISA inline Vec times_two_to(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }

// The lanes of the row from j that lie within it.
MXAMP_ISA inline __mmask16 within(int64_t j, int64_t cols) {
  return static_cast<__mmask16>(j + kLanes <= cols ? 0xFFFF : (1u << (cols - j)) - 1);
}
// The row's floats j..j+15; past its end -infinity (as avx2's load).
MXAMP_ISA inline Vec load(const float* row, int64_t j, int64_t cols) {
  return _mm512_mask_loadu_ps(splat(-INFINITY), within(j, cols), row + j);
}
MXAMP_ISA inline Vec load(const BF16* row, int64_t j, int64_t cols) {
  const __mmask16 in = within(j, cols);
  const __m256i bits = _mm256_maskz_loadu_epi16(in, row + j);
  const Vec v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  return _mm512_mask_blend_ps(in, splat(-INFINITY), v);
}

MXAMP_ISA inline float max_of(Vec v) { return _mm512_reduce_max_ps(v); }
MXAMP_ISA inline float sum_of(Vec v) { return _mm512_reduce_add_ps(v); }

// The nearest integers of p (0 to 255) as bytes at dst + j, within the row.
MXAMP_ISA inline void store_steps(Vec p, uint8_t* dst, int64_t j, int64_t cols) {
  _mm_mask_storeu_epi8(dst + j, within(j, cols), _mm512_cvtusepi32_epi8(_mm512_cvtps_epu32(p)));
}

#include "softmax_row.h"

}  // namespace avx512
#undef MXAMP_ISA

// Every row, on the calling thread's OpenMP team, by the row kernel of the
// ISA (`wide`: AVX-512).
template <typename T>
void softmax_rows(const T* src, void* dst, int64_t rows, int64_t cols, float scale,
                  bool out_signed, bool wide) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const float most_steps = out_signed ? 127 : 255;
  const int64_t lanes = wide ? avx512::kLanes : avx2::kLanes;
  const int64_t padded = (cols + lanes - 1) / lanes * lanes;
  std::vector<float> exps(static_cast<size_t>(threads * padded));  // a row's per thread
  uint8_t* out = static_cast<uint8_t*>(dst);
#pragma omp parallel for schedule(static) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    float* row_exps = exps.data() + omp_get_thread_num() * padded;
    if (wide)
      avx512::softmax_row(src + r * cols, out + r * cols, cols, scale, most_steps, row_exps);
    else
      avx2::softmax_row(src + r * cols, out + r * cols, cols, scale, most_steps, row_exps);
  }
}

}  // namespace

const char* softmax_int8_isa() { return cpu_has_avx512() ? "avx512_core" : "avx2"; }

void softmax_int8(const void* src, bool bf16, void* dst, int64_t rows, int64_t cols,
                  float scale, bool out_signed) {
  const bool wide = cpu_has_avx512();  // as softmax_int8_isa names it
  if (bf16)
    softmax_rows(static_cast<const BF16*>(src), dst, rows, cols, scale, out_signed, wide);
  else
    softmax_rows(static_cast<const float*>(src), dst, rows, cols, scale, out_signed, wide);
}

}  // namespace mxamp_onednn
