// NaN and +-Inf as MXNet's float32 operators answer them (special.cc).
// oneDNN's relu and clip take their bound for NaN, its GELU gives NaN for
// +Inf, and its softmax keeps a row's NaN to its place; INT8 holds neither.
// A region whose data or parameters hold one runs that call on a float32
// plan of its graph (Plan::exact) where such steps are followed by these
// steps of mxamp's own; without them, a region makes none (but by overflow).
#ifndef MXAMP_ONEDNN_SPECIAL_H_
#define MXAMP_ONEDNN_SPECIAL_H_

#include <cstdint>

#include "fusion.h"
#include "plan.h"

namespace mxamp_onednn {

// Whether `count` floats are all finite (one vectorized pass).
bool all_finite(const float* data, int64_t count);

// Whether oneDNN's e gives other values than MXNet's operator for NaN or
// +-Inf.
bool loses_special_values(const Eltwise& e);

// A step after eltwise e wrote dst from src (float32, one layout): NaN stays
// NaN; GELU of +Inf is +Inf and of -Inf NaN, as MXNet's x * Phi(x).
void add_special_values(Plan* r, const Eltwise& e, Arg src, Arg dst);

// A step after a softmax wrote dst from src (float32 rows of `cols`): a row
// holding NaN or +Inf, or only -Inf, is NaN throughout, as MXNet's softmax
// gives it (its maximum or its sum is then NaN).
void add_softmax_special_rows(Plan* r, Arg src, Arg dst, int64_t rows, int64_t cols);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_SPECIAL_H_
