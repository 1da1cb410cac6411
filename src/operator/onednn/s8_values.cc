// The numbers of s8 weights (s8_values.h): those a region computes from
// float32 weights, float32 arithmetic step by step (the library is built
// without FMA contraction), rounding half to even (nearbyint in the default
// rounding mode), sums in double.
#include "s8_values.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace mxamp_onednn {
namespace {

// The name numpy gives an MXNet dtype code.
std::string dtype_name(int code) {
  static const char* const names[] = {"float32", "float64", "float16", "uint8",
                                      "int32",   "int8",    "int64"};
  return code >= 0 && code < 7 ? names[code] : "of code " + std::to_string(code);
}

// A parameter's values in float32, as numpy's astype(float32) gives them.
std::vector<float> floats(const Node* v) {
  const MXTensor& t = *v->tensor;
  std::vector<float> out(t.size());
  if (t.dtype == kFloat32) {
    std::memcpy(out.data(), t.data_ptr, out.size() * sizeof(float));
  } else if (t.dtype == kFloat64) {
    const double* d = static_cast<const double*>(t.data_ptr);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(d[i]);
  } else {
    throw std::invalid_argument("parameter " + v->name + " has dtype " + dtype_name(t.dtype) +
                                ": s8 weights are made from float32 or float64 weights");
  }
  return out;
}

// Throws unless parameter v holds `size` values.
void check_size(const Node* v, size_t size, const Node* layer) {
  if (static_cast<size_t>(v->tensor->size()) != size)
    throw std::invalid_argument("parameter " + v->name + " of " + layer->name + " holds " +
                                std::to_string(v->tensor->size()) + " values, not " +
                                std::to_string(size));
}

// Folds BatchNorm parameters `bn` (gamma, beta, moving mean and variance)
// into p as the region folds them (normalisation.cc): the factor in double,
// then float32.
void fold_batchnorm(const Int8Layer& l, const std::vector<const Node*>& bn, LayerParams* p) {
  const size_t channels = p->shape[0], row = p->weights.size() / channels;
  for (const Node* v : bn) check_size(v, channels, l.batchnorm);
  std::vector<float> gamma = floats(bn[0]), beta = floats(bn[1]), mean = floats(bn[2]),
                     var = floats(bn[3]);
  if (l.fix_gamma) std::fill(gamma.begin(), gamma.end(), 1.0f);
  if (!p->has_bias) p->bias.assign(channels, 0.0f);
  for (size_t c = 0; c < channels; ++c) {
    const double root = std::sqrt(static_cast<double>(var[c]) + l.eps);
    const float factor = static_cast<float>(gamma[c] / root);
    for (size_t i = c * row; i < (c + 1) * row; ++i) p->weights[i] *= factor;
    p->bias[c] = (p->bias[c] - mean[c]) * factor + beta[c];
  }
  p->has_bias = true;
}

// Per output channel, the sum over its weights of their rounding error
// (float32 weight minus its INT8 value) times the mean of the data channel
// each weight reads; `mean_of(r, i)` the mean weight i of row r reads.
template <typename MeanOf>
std::vector<float> shift_by(const LayerParams& p, const Quantized& q, size_t taps, MeanOf mean_of) {
  const size_t rows = p.shape[0], row = p.weights.size() / rows;
  std::vector<float> out(rows);
  for (size_t r = 0; r < rows; ++r) {
    double total = 0;
    for (size_t i = 0; i < row; i += taps) {
      double tap_sum = 0;  // a kernel's taps read one channel: counted whole
      for (size_t t = i; t < i + taps; ++t)
        tap_sum += static_cast<double>(p.weights[r * row + t] -
                                       static_cast<float>(q.q[r * row + t]) * q.scales[r]);
      total += tap_sum * mean_of(r, i / taps);
    }
    out[r] = static_cast<float>(total);
  }
  return out;
}

}  // namespace

LayerParams layer_params(const Int8Layer& l, const std::vector<const Node*>& vars,
                         const std::vector<const Node*>& bn) {
  LayerParams p{vars[0]->tensor->shape, floats(vars[0])};
  if (p.shape.size() < 2 || p.shape[0] < 1) {
    std::string shape;
    for (int64_t d : p.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    throw std::invalid_argument("weights " + vars[0]->name + " of " + l.node->name +
                                " have shape [" + shape + "]: s8 weights need 2 axes or more "
                                "and an output channel");
  }
  if (vars.size() > 1) {
    check_size(vars[1], p.shape[0], l.node);
    p.bias = floats(vars[1]);
    p.has_bias = true;
  }
  if (l.batchnorm) fold_batchnorm(l, bn, &p);
  return p;
}

Quantized quantized(const LayerParams& p, int levels, int step) {
  const size_t rows = p.shape[0], row = p.weights.size() / rows;
  Quantized out{std::vector<int8_t>(p.weights.size()), std::vector<float>(rows)};
  const float limit = static_cast<float>(levels);
  for (size_t r = 0; r < rows; ++r) {
    const float* w = &p.weights[r * row];
    float top = 0;
    for (size_t i = 0; i < row; ++i) top = std::max(top, std::fabs(w[i]));
    const float scale = top > 0 ? top / limit : 1.0f;
    const float unit = scale * static_cast<float>(step);
    for (size_t i = 0; i < row; ++i) {
      const float steps = std::nearbyint(w[i] / unit) * static_cast<float>(step);
      out.q[r * row + i] = static_cast<int8_t>(std::min(std::max(steps, -limit), limit));
    }
    out.scales[r] = scale;
  }
  return out;
}

std::vector<float> rounding_shift(const Int8Layer& l, const LayerParams& p, const Quantized& q,
                                  const std::vector<double>* mean) {
  if (!mean || l.axis == ChannelAxis::kNone) return {};
  const size_t rows = p.shape[0], row = p.weights.size() / rows;
  if (l.axis != ChannelAxis::kFirst) {
    if (mean->size() != row) return {};
    return shift_by(p, q, 1, [&](size_t, size_t i) { return (*mean)[i]; });
  }
  const size_t per_group = p.shape[1], groups = l.groups;
  if (per_group == 0 || mean->size() != groups * per_group) return {};
  return shift_by(p, q, row / per_group, [&](size_t r, size_t c) {
    return (*mean)[r * groups / rows * per_group + c];
  });
}

}  // namespace mxamp_onednn
