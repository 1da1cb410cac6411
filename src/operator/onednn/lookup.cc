// The byte table of lookup.h: 64 bytes at a time, each looked up in two
// 128-byte halves of the table (vpermi2b takes an index's low 7 bits) and
// the half chosen by its top bit.
#include "lookup.h"

#include <immintrin.h>
#include <omp.h>

#define MXAMP_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))

namespace mxamp_onednn {
namespace {

constexpr int64_t kBlock = 16384;  // bytes a thread takes at a time

MXAMP_VBMI void lookup_block(const __m512i half[4], const uint8_t* src, uint8_t* dst,
                             int64_t n) {
  for (int64_t i = 0; i < n; i += 64) {
    const __mmask64 in = n - i >= 64 ? ~0ULL : (1ULL << (n - i)) - 1;
    const __m512i x = _mm512_maskz_loadu_epi8(in, src + i);
    const __m512i low = _mm512_permutex2var_epi8(half[0], x, half[1]);
    const __m512i high = _mm512_permutex2var_epi8(half[2], x, half[3]);
    _mm512_mask_storeu_epi8(dst + i, in, _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), low, high));
  }
}

}  // namespace

MXAMP_VBMI void lookup_bytes(const uint8_t table[256], const uint8_t* src, uint8_t* dst,
                             int64_t n) {
  __m512i half[4];
  for (int k = 0; k < 4; ++k) half[k] = _mm512_loadu_si512(table + 64 * k);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1 && !omp_in_parallel())
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t start = b * kBlock;
    lookup_block(half, src + start, dst + start, n - start < kBlock ? n - start : kBlock);
  }
}

}  // namespace mxamp_onednn
