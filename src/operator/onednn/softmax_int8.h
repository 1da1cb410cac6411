// A softmax over rows of mxamp's own (softmax_int8.cc), float32 in and INT8 out,
// for the CPUs where oneDNN 3.2's INT8 softmax is its reference kernel
// (AVX2 without AVX-512): there the attention's probabilities would else be
// written in float32 and requantized by a reorder for the batch_dot that
// reads them. It needs AVX2 with FMA (engine.h, cpu_has_avx2).
#ifndef MXAMP_ONEDNN_SOFTMAX_INT8_H_
#define MXAMP_ONEDNN_SOFTMAX_INT8_H_

#include <cstdint>

namespace mxamp_onednn {

// dst[r][j] = the nearest integer to softmax(src[r])[j] / scale, saturated
// to u8 (to s8 where `out_signed`: 127 at most), as oneDNN computes
// softmax_accurate with a destination scale; over `rows` dense rows of
// `cols`. Runs on the calling thread's OpenMP team (one thread inside a
// region's chunks). Rows are finite (MXNet's masks add large negatives):
// a row of -infinity, or one holding +infinity or NaN, gives no NaN here,
// as oneDNN's softmax would, but arbitrary steps.
void softmax_int8(const float* src, void* dst, int64_t rows, int64_t cols, float scale,
                  bool out_signed);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_SOFTMAX_INT8_H_
