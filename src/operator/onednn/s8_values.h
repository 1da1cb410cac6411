// The numbers of an INT8 layer's s8 weights (s8_weights.h): its float32
// parameters read, BatchNorm folded in, quantized per output channel, and
// the mean shift of their rounding.
#ifndef MXAMP_ONEDNN_S8_VALUES_H_
#define MXAMP_ONEDNN_S8_VALUES_H_

#include <vector>

#include "common.h"
#include "int8_layers.h"

namespace mxamp_onednn {

// A layer's float32 weights and bias, BatchNorm folded in.
struct LayerParams {
  Dims shape;  // the weights'
  std::vector<float> weights, bias;
  bool has_bias = false;
};

// The float32 weights and bias of layer l from its parameters `vars`
// (weight, bias: variables with MXNet's tensors) and its BatchNorm's `bn`
// (gamma, beta, moving mean and variance), folded as the region folds it
// (normalisation.cc: the factor in double, then float32). Throws where a
// parameter has another type or size.
LayerParams layer_params(const Int8Layer& l, const std::vector<const Node*>& vars,
                         const std::vector<const Node*>& bn);

// Weights in s8, a float32 scale per output channel: max |w| / levels (1 for
// a channel of zeros), each weight a multiple of `step`.
struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;
};

Quantized quantized(const LayerParams& p, int levels, int step);

// The mean shift that rounding layer l's weights gives each output channel on
// data of channel means `mean` (along the layer's channel axis; a grouped
// convolution's weights read their group's channels); empty where unknown
// (no mean, no channel axis, or means of another count).
std::vector<float> rounding_shift(const Int8Layer& l, const LayerParams& p, const Quantized& q,
                                  const std::vector<double>* mean);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_S8_VALUES_H_
