// The layers with weights that INT8 regions run, as the regions take them
// (int8_layers.cc): read by mxamp's quantization through int8_layers
// (table.h) and by the pass that writes their s8 weights (s8_weights.h).
#ifndef MXAMP_ONEDNN_INT8_LAYERS_H_
#define MXAMP_ONEDNN_INT8_LAYERS_H_

#include <string>
#include <vector>

#include "attrs.h"
#include "common.h"

namespace mxamp_onednn {

// The axis of the channels a layer's weights sum over in its data.
enum class ChannelAxis {
  kFirst,  // 1: a channels-first convolution
  kLast,   // -1: a FullyConnected of flatten=False
  kEach,   // a flattening FullyConnected: each value of an example
  kNone,   // another layout
};

struct Int8Layer {
  const Node* node;
  std::vector<const Node*> params;  // weight, bias (nullptr where absent)
  Entry data;                       // what it reads, casts aside
  ChannelAxis axis;
  int groups;
  bool int8;  // whether a region runs it in INT8
  int levels, step;  // of its s8 weights
  const Node* batchnorm = nullptr;  // folded into it, if any
  std::vector<const Node*> batchnorm_params;
  double eps = 0;
  bool fix_gamma = false;
  // Whether its weights are s8 (dequantized in the graph), and if not why
  // the finishing pass left them float32 (kFloat32WeightsAttr; "" for a
  // graph that pass has not seen).
  bool s8_weights = false;
  std::string float32_weights;
};

// The layers with weights of graph g (a model, or a region's subgraph with
// its inputs' ranges), in g's node order.
std::vector<Int8Layer> int8_layers_of(const Graph* g, const std::vector<Range>& input_ranges);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_INT8_LAYERS_H_
