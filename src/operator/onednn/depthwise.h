// A 3x3 depthwise INT8 convolution of mxamp's own (depthwise.cc), for the
// layers where oneDNN 3.2's kernels reach about a tenth of the INT8 peak
// (MobileNet's, docs/quantization.md): u8 channels-last data, s8 weights
// with a scale per channel, u8 or s8 output, padding 1, stride 1. It needs
// AVX-512 with VNNI (engine.h, cpu_has_avx512_vnni).
#ifndef MXAMP_ONEDNN_DEPTHWISE_H_
#define MXAMP_ONEDNN_DEPTHWISE_H_

#include <cstdint>
#include <vector>

namespace mxamp_onednn {

// Dims of the source and the output (n, h, w, c: channels-last).
struct DepthwiseShape {
  int64_t n, h, w, c;
};

// What the kernel computes with, per channel c: the output is
// sum(w * (x - src_zp)) * scale[c] + bias[c] + dst_zp, saturated to the
// output type and rounded to the nearest integer, as oneDNN computes an
// INT8 convolution (the same integers).
struct DepthwiseWeights {
  std::vector<int32_t> taps;  // [3][c]: a kernel row's three taps as bytes, then 0
  std::vector<int32_t> init;  // -src_zp * the sum of channel c's weights
  std::vector<float> scale, bias;
  int src_zp = 0, dst_zp = 0;
  bool out_signed = false;
};

// Whether the kernel takes this many channels (a multiple of 16: a vector
// of int32 sums).
bool depthwise_fits(int64_t channels);

// weights: s8, [c][3][3]; scale and bias (in output steps) per channel.
DepthwiseWeights depthwise_weights(const int8_t* weights, int64_t channels, int src_zp,
                                   std::vector<float> scale, std::vector<float> bias, int dst_zp,
                                   bool out_signed);

// Runs the convolution on the calling thread's OpenMP team (one thread
// inside a region's chunks).
void depthwise3x3(const DepthwiseShape& s, const DepthwiseWeights& k, const uint8_t* src,
                  void* dst);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_DEPTHWISE_H_
