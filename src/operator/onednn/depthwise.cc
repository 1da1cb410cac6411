// The 3x3 depthwise INT8 convolution (depthwise.h). oneDNN's kernels give
// VNNI's dot product of four bytes one tap at a time (a depthwise layer has
// no channels to sum over). Here each input row is first laid out as the
// output columns read it, a kernel row's three taps in one dword per
// channel, so that one dot product takes three taps: three per output
// instead of nine. Each such window row serves the three output rows that
// read it, and stays in L1 while they do.
#include "depthwise.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <exception>
#include <vector>

#define MXAMP_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace mxamp_onednn {
namespace {

constexpr int64_t kLanes = 16;  // int32 sums in a vector
constexpr int kSlots = 4;       // window rows a thread keeps
// What a thread's window rows may take: most of L1 (measured on Zen 4;
// 64 KiB and more were no faster).
constexpr int64_t kWindowBytes = 24 << 10;

// Channels c..c+15 of column w of a row (nullptr: a padding row), widened
// to int32; the zero point outside the row.
MXAMP_VNNI inline __m512i column(const uint8_t* row, int64_t w, const DepthwiseShape& s, int64_t c,
                                 __m512i pad) {
  if (!row || w >= s.w) return pad;
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + w * s.c + c)));
}

// Channels [first, first + 16 * blocks) of an input row as the output
// columns read it: for column j, the bytes x[j-1], x[j], x[j+1] and 0 of each channel, at
// out[j * blocks + b]. Each input column is widened once.
MXAMP_VNNI void window_row(const uint8_t* row, const DepthwiseShape& s, int64_t first,
                           int64_t blocks, int zp, __m512i* out) {
  const __m512i pad = _mm512_set1_epi32(zp);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t cb = first + b * kLanes;
    __m512i left = pad, mid = column(row, 0, s, cb, pad);
    for (int64_t j = 0; j < s.w; ++j) {
      __m512i right = column(row, j + 1, s, cb, pad);
      out[j * blocks + b] = _mm512_ternarylogic_epi32(left, _mm512_slli_epi32(mid, 8),
                                                      _mm512_slli_epi32(right, 16), 0xFE);  // or
      left = mid;
      mid = right;
    }
  }
}

// What takes 16 channels' sums to output steps, in oneDNN's order and
// rounding (a fused multiply-add rounds once, and flipped one step in a few
// outputs in a million, which a deep network's later layers spread).
struct Requantize {
  __m512 scale, bias, zp, low, high;
};

// Output columns j..j+n-1 of 16 channels: three dot products each, then
// scaled, saturated and rounded to the output type.
template <int kColumns>
MXAMP_VNNI inline void output_columns(const __m512i* const* rows, int64_t j, int64_t blocks,
                                      const __m512i* w, __m512i init, const Requantize& rq,
                                      int8_t* out, int64_t out_step) {
  __m512i acc[kColumns];
#pragma GCC unroll 8
  for (int i = 0; i < kColumns; ++i) {
    acc[i] = _mm512_dpbusd_epi32(init, rows[0][(j + i) * blocks], w[0]);
    acc[i] = _mm512_dpbusd_epi32(acc[i], rows[1][(j + i) * blocks], w[1]);
    acc[i] = _mm512_dpbusd_epi32(acc[i], rows[2][(j + i) * blocks], w[2]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < kColumns; ++i) {
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m512 x = _mm512_mul_round_ps(_mm512_cvtepi32_ps(acc[i]), rq.scale, kNearest);
    x = _mm512_add_round_ps(_mm512_add_round_ps(x, rq.bias, kNearest), rq.zp, kNearest);
    x = _mm512_min_ps(_mm512_max_ps(x, rq.low), rq.high);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (j + i) * out_step),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(x)));
  }
}

// Channels [first, first + 16 * blocks) of one output row from the window
// rows of its three input rows.
MXAMP_VNNI void output_row(const __m512i* const* rows, const DepthwiseWeights& k,
                           const DepthwiseShape& s, int64_t first, int64_t blocks, int8_t* out) {
  constexpr int kBlock = 4;  // columns at a time: independent sums
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t cb = first + b * kLanes;
    const __m512i* in[3] = {rows[0] + b, rows[1] + b, rows[2] + b};
    __m512i w[3];
    for (int r = 0; r < 3; ++r) w[r] = _mm512_loadu_si512(k.taps.data() + r * s.c + cb);
    const __m512i init = _mm512_loadu_si512(k.init.data() + cb);
    const Requantize rq{_mm512_loadu_ps(k.scale.data() + cb), _mm512_loadu_ps(k.bias.data() + cb),
                        _mm512_set1_ps(static_cast<float>(k.dst_zp)),
                        _mm512_set1_ps(k.out_signed ? -128.f : 0.f),
                        _mm512_set1_ps(k.out_signed ? 127.f : 255.f)};
    int64_t j = 0;
    for (; j + kBlock <= s.w; j += kBlock)
      output_columns<kBlock>(in, j, blocks, w, init, rq, out + cb, s.c);
    for (; j < s.w; ++j) output_columns<1>(in, j, blocks, w, init, rq, out + cb, s.c);
  }
}

// A piece of the work: rows [top, bottom) of one image's output, channels
// [first, first + 16 * blocks).
struct Piece {
  int64_t image, first, blocks, top, bottom;
};

// A thread keeps the window rows of the last few input rows it read (the
// padding row is one of them).
MXAMP_VNNI void run_piece(const DepthwiseShape& s, const DepthwiseWeights& k, const uint8_t* src,
                          int8_t* dst, const Piece& p) {
  thread_local std::vector<int32_t> storage;  // for vectors aligned to 64 bytes
  const int64_t size = s.w * p.blocks;
  storage.resize((kSlots * size + 1) * kLanes);
  auto* windows = reinterpret_cast<__m512i*>(
      (reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t(63));
  int64_t held[kSlots] = {-2, -2, -2, -2};  // the input row in each slot; none yet
  int next = 0;
  auto window = [&](int64_t row) -> const __m512i* {
    if (row < 0 || row >= s.h) row = -1;
    for (int i = 0; i < kSlots; ++i)
      if (held[i] == row) return windows + i * size;
    int i = next;
    next = (next + 1) % kSlots;
    held[i] = row;
    const uint8_t* in = row < 0 ? nullptr : src + (p.image * s.h + row) * s.w * s.c;
    window_row(in, s, p.first, p.blocks, k.src_zp, windows + i * size);
    return windows + i * size;
  };
  for (int64_t oh = p.top; oh < p.bottom; ++oh) {
    const __m512i* rows[3];
    for (int r = 0; r < 3; ++r) rows[r] = window(oh - 1 + r);
    int8_t* out = dst + (p.image * s.h + oh) * s.w * s.c;
    output_row(rows, k, s, p.first, p.blocks, out);
  }
}

}  // namespace

bool depthwise_fits(int64_t channels) { return channels % kLanes == 0; }

DepthwiseWeights depthwise_weights(const int8_t* weights, int64_t channels, int src_zp,
                                   std::vector<float> scale, std::vector<float> bias, int dst_zp,
                                   bool out_signed) {
  DepthwiseWeights k;
  k.taps.assign(3 * channels, 0);
  k.init.assign(channels, 0);
  for (int64_t c = 0; c < channels; ++c)
    for (int r = 0; r < 3; ++r)
      for (int t = 0; t < 3; ++t) {
        int8_t v = weights[c * 9 + r * 3 + t];
        k.taps[r * channels + c] |= static_cast<int32_t>(static_cast<uint8_t>(v)) << (8 * t);
        k.init[c] -= src_zp * v;
      }
  k.scale = std::move(scale);
  k.bias = std::move(bias);
  k.src_zp = src_zp;
  k.dst_zp = dst_zp;
  k.out_signed = out_signed;
  return k;
}

void depthwise3x3(const DepthwiseShape& s, const DepthwiseWeights& k, const uint8_t* src,
                  void* dst) {
  // Pieces: each image's channels in groups whose window rows fit in L1,
  // their rows cut in bands where there are too few for the threads to
  // share evenly.
  const int64_t blocks = s.c / kLanes;
  const int64_t fit = std::max<int64_t>(1, kWindowBytes / (kSlots * s.w * sizeof(__m512i)));
  const int64_t groups = (blocks + fit - 1) / fit, per_group = (blocks + groups - 1) / groups;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t bands = 1;
  while (s.n * groups * bands < 4 * threads && bands * 2 <= s.h) bands *= 2;
  const int64_t pieces = s.n * groups * bands;
  std::exception_ptr failed;  // (an exception must not leave an OpenMP region)
#pragma omp parallel for schedule(static) if (threads > 1)
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t band = i % bands, group = i / bands % groups, image = i / bands / groups;
    const int64_t block = group * per_group;
    Piece p{image, block * kLanes, std::min(per_group, blocks - block), band * s.h / bands,
            (band + 1) * s.h / bands};
    try {
      run_piece(s, k, src, static_cast<int8_t*>(dst), p);
    } catch (...) {  // the window rows' storage
#pragma omp critical(mxamp_depthwise_failed)
      failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace mxamp_onednn
