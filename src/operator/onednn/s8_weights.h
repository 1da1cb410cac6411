// s8 weights in INT8 regions, written by the finishing pass (finish.h): what
// a saved INT8 model holds instead of float32 weights, a quarter of their
// size.
//
// Each Convolution / FullyConnected that a region runs in INT8 (its data
// calibrated, the layer not kept float32; int8_layers.h) reads its weights
// as its piece of broadcast_mul(Cast(<s8 weights>, dtype=float32), <their
// scales>): the weights in int8, quantized per output channel as the region
// quantizes float32 weights itself (scale = max |w| / levels, 1 for a
// channel of zeros), the scales in float32 shaped (channels, 1, ...). A
// BatchNorm the region folds into the convolution before it is folded here
// (the factor in double, then float32, as normalisation.cc folds it) and
// leaves the graph; its convolution reads a new float32 bias. Where
// calibration gave the mean of each channel of a layer's data, its bias also
// takes the mean shift that rounding the weights gives its outputs,
// sum((w - q) * mean) per output channel (bias correction), and the layer
// reads a new bias too.
//
// A region's new parameters are packed: each kind is one variable whose rows
// are its layers' output channels, cut by a _split_v2 along axis 0. The s8
// weights are one variable per row shape (<region>_weight_s8_32x3x3),
// dequantized as a whole before the cut; their scales one per weight rank
// (<region>_weight_scales_4d), cut into the packs' pieces; the folded and
// corrected biases one (<region>_bias_folded). Names are made unique; the new
// variables carry __dtype__ and __shape__, and the region's inputs (and their
// input_ranges) follow its subgraph's new inputs in MXNet's order. Every
// region input and node costs MXNet time on every call, hence the packs.
#ifndef MXAMP_ONEDNN_S8_WEIGHTS_H_
#define MXAMP_ONEDNN_S8_WEIGHTS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common.h"

namespace mxamp_onednn {

// Channel means from calibration by node index of the graph before
// partitioning (the mean of output 0's channels): option "data_means", one
// "<index> <op> <mean>..." line per node, checked against `ops` (that
// graph's operators by index). No option: none.
using ChannelMeans = std::map<int, std::vector<double>>;
ChannelMeans read_means(const Attrs& options, const std::vector<std::string>& ops);

// A partitioned graph's node's index in the graph before partitioning (-1:
// a node it had not).
using IndexBefore = std::function<int(const Node*)>;

// Writes the s8 weights of g's INT8 regions from the parameters MXNet gave
// the pass (a variable's tensor), allocating the packs as new parameters.
// Returns how many layers' biases were corrected.
int write_s8_weights(Graph* g, const ChannelMeans& means, const IndexBefore& index_before);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_S8_WEIGHTS_H_
