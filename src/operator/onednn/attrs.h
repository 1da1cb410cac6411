// Reading MXNet node attributes: typed, each with the default MXNet uses
// when the attribute is absent; and the calibration attributes mxamp's
// quantization sets.
#ifndef MXAMP_ONEDNN_ATTRS_H_
#define MXAMP_ONEDNN_ATTRS_H_

#include <cmath>
#include <string>
#include <vector>

#include "common.h"

namespace mxamp_onednn {

// The attribute as written, or `fallback` when absent.
std::string text(const Node* n, const std::string& key, const std::string& fallback = "");

// A boolean ("True", "true" or "1"), `fallback` when absent.
bool flag(const Node* n, const std::string& key, bool fallback);

// A number, `fallback` when absent or "None"; throws std::invalid_argument,
// naming the node and attribute, when it is not a number.
double number(const Node* n, const std::string& key, double fallback);

// All integers in a tuple attribute such as "(3, 3)" or "[1,2]" (none when
// absent).
Dims ints(const Node* n, const std::string& key);

// A 2-d tuple ("(2, 2)"), `fallback` when absent or empty.
Dims pair(const Node* n, const std::string& key, Dims fallback);

// A calibrated tensor: its symmetric threshold and the smallest value seen.
struct Range {
  double amax = 0, min = 0;
  bool known() const { return amax > 0 && std::isfinite(amax); }
  // Unsigned when the tensor never goes negative (after ReLU): a bit more
  // resolution for the same threshold.
  memory::data_type type() const { return min >= 0 ? kU8 : kS8; }
  // The real value of one INT8 step.
  float scale() const { return static_cast<float>(amax / (min >= 0 ? 255 : 127)); }
};

// The attributes of a tensor's calibration: its threshold and minimum.
constexpr const char* kAmaxAttr = "__mxamp_amax__";
constexpr const char* kMinAttr = "__mxamp_min__";

// The calibration of output 0 of node n (kAmaxAttr, kMinAttr).
Range range_attr(const Node* n);

// Why the finishing pass left an INT8 layer reading float32 weights (a
// sentence; s8_weights.h), kept by a saved model.
constexpr const char* kFloat32WeightsAttr = "__mxamp_float32_weights__";

// Whether quantization keeps node n in float32 (__mxamp_float__).
bool keeps_float(const Node* n);

// The INT8 ranges of a region's inputs as review_subgraph writes them:
// "amax,min" each (empty when not calibrated), separated by ';'.
std::vector<Range> parse_ranges(const std::string& s);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_ATTRS_H_
