// The weights of Convolution and FullyConnected (linear.cc): read from the
// region's parameters, their INT8 scales, packed into a primitive's layout.
#ifndef MXAMP_ONEDNN_WEIGHTS_H_
#define MXAMP_ONEDNN_WEIGHTS_H_

#include <vector>

#include "common.h"

namespace mxamp_onednn {

class Plan;

// The weights and bias (zeros with no_bias), as float32 host copies that
// BatchNorm folding may change; or s8 weights with a scale per output
// channel, as mxamp's quantization writes them (BatchNorm folded in).
struct Params {
  Dims shape;
  std::vector<float> weights, bias;
  const int8_t* s8 = nullptr;  // the s8 weights, when given
  std::vector<float> s8_scales;
  int s8_top = 0;  // their largest magnitude: +-127, or +-64 from a CPU without VNNI
};

Params params(Plan* r, const Node* n);

// Per output channel, the real value of one s8 step of the weights as
// packed at `levels` (weight_levels).
std::vector<float> weight_scales(const Params& p, int levels);

// s8 weights into the layout w_md (of dims wdims): for INT8 compute (q) as
// they are, or requantized from +-127 to +-levels where this CPU takes
// fewer; for float compute, times their scales.
memory pack_s8(const Params& p, const Dims& wdims, const memory::desc& w_md, bool q, int levels,
               int wmask);

// A FullyConnected (oneDNN 3.2's inner product takes no zero point) or an
// unpadded convolution reading u8 data with a zero point computes
// W (x + zero) + b, `zero` the zero
// point times the data's scale; this takes zero times each output's sum of
// the weights as packed (`wscales`, `levels`) off the bias, so that it
// computes W x + b.
void take_back_zero_point(const Params& p, const std::vector<float>& wscales, int levels,
                          float zero, std::vector<float>* bias);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_WEIGHTS_H_
