// A softmax over rows of mxamp's own (softmax_int8.cc), float32 or bfloat16
// in and INT8 out. For the CPUs where oneDNN 3.2's INT8 softmax is its
// reference kernel (AVX2 without AVX-512): there the attention's
// probabilities would else be written in float32 and requantized by a
// reorder for the batch_dot that reads them. And from bfloat16 scores
// (AVX-512), where it takes less time than oneDNN's jit kernel
// (docs/onednn.md). It needs AVX2 with FMA (engine.h, cpu_has_avx2).
#ifndef MXAMP_ONEDNN_SOFTMAX_INT8_H_
#define MXAMP_ONEDNN_SOFTMAX_INT8_H_

#include <cstdint>

namespace mxamp_onednn {

// dst[r][j] = the nearest integer to softmax(src[r])[j] / scale, saturated
// to u8 (to s8 where `out_signed`: 127 at most), as oneDNN computes
// softmax_accurate with a destination scale; over `rows` dense rows of
// `cols`, float32 or (`bf16`) bfloat16. Runs on the calling thread's
// OpenMP team (one thread inside a region's chunks). Rows are finite
// (MXNet's masks add large negatives): a row of -infinity, or one holding
// +infinity or NaN, gives no NaN here, as oneDNN's softmax would, but
// arbitrary steps.
void softmax_int8(const void* src, bool bf16, void* dst, int64_t rows, int64_t cols,
                  float scale, bool out_signed);

// The ISA its rows run in, as oneDNN's verbose lines name one: "avx512_core"
// (16 floats a vector) where oneDNN runs AVX-512, else "avx2".
const char* softmax_int8_isa();

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_SOFTMAX_INT8_H_
