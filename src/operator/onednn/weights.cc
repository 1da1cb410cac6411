// The weights of Convolution and FullyConnected: reading, INT8 scales,
// packing.
#include "weights.h"

#include <algorithm>
#include <cmath>

#include "engine.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

constexpr int kS8Levels = 127;  // the most levels s8 weights use

// s8 weights: the weight input is broadcast_mul(Cast(s8 weights), scales),
// the scales shaped (channels, 1, ...), or a _split_v2 piece of that over
// the packed s8 weights of one row shape and their scales (earlier layouts
// dequantized each layer's own piece, or variables). Their shape is the
// weights'.
void read_s8(Plan* r, const Node* n, Params* p) {
  const Node* w = n->inputs[1].node;
  const NodeEntry* piece = cuts_pack(w) ? &n->inputs[1] : nullptr;
  const Node* mul = piece ? w->inputs[0].node : w;
  const Node* cast = mul->inputs.size() == 2 ? mul->inputs[0].node : nullptr;
  Param q;
  if (cast && casts_weights(cast) && cast->inputs.size() == 1)
    q = r->param_of(cast->inputs[0], piece);
  if (q.dtype != kInt8 || !q.data)
    throw std::runtime_error(n->name + ": weights computed in the region are not s8 weights "
                             "times their scales");
  p->shape.assign(q.shape.begin(), q.shape.end());
  p->s8 = static_cast<const int8_t*>(q.data);
  for (int64_t i = 0; i < q.size(); ++i)
    p->s8_top = std::max(p->s8_top, std::abs(static_cast<int>(p->s8[i])));
  const float* s = r->param(mul->inputs[1], p->shape[0], piece);
  p->s8_scales.assign(s, s + p->shape[0]);
}

// Whether pack_s8 requantizes the s8 weights to fewer levels.
bool requantized(const Params& p, int levels) { return p.s8 && p.s8_top > levels; }

}  // namespace

Params params(Plan* r, const Node* n) {
  Params p;
  if (dequantizes_s8(n->inputs[1].node)) {
    read_s8(r, n, &p);
  } else {
    p.shape = r->param_of(n->inputs[1]).shape;
    size_t size = 1;
    for (int64_t x : p.shape) size *= x;
    const float* w = r->param(n->inputs[1], size);
    p.weights.assign(w, w + size);
  }
  p.bias.assign(p.shape[0], 0.f);
  if (!flag(n, "no_bias", false)) {
    const float* b = r->param(n->inputs[2], p.shape[0]);
    p.bias.assign(b, b + p.shape[0]);
  }
  return p;
}

std::vector<float> weight_scales(const Params& p, int levels) {
  if (p.s8) {
    std::vector<float> s = p.s8_scales;
    if (requantized(p, levels))
      for (float& x : s) x *= static_cast<float>(kS8Levels) / levels;
    return s;
  }
  size_t channels = p.bias.size(), per = p.weights.size() / channels;
  std::vector<float> s(channels, 1.f);
  for (size_t o = 0; o < channels; ++o) {
    float m = 0;
    for (size_t i = 0; i < per; ++i) m = std::max(m, std::abs(p.weights[o * per + i]));
    if (m > 0) s[o] = m / levels;
  }
  return s;
}

memory pack_s8(const Params& p, const Dims& wdims, const memory::desc& w_md, bool q, int levels,
               int wmask) {
  memory src(plain(wdims, kS8), cpu_engine(), const_cast<int8_t*>(p.s8));
  memory dst(w_md, cpu_engine());
  dnnl::primitive_attr attr;
  std::unordered_map<int, memory> args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  if (!q) {
    attr.set_scales_mask(DNNL_ARG_SRC, wmask);
    args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = scales(p.s8_scales);
  } else if (requantized(p, levels)) {
    attr.set_scales_mask(DNNL_ARG_DST, 0);
    float ratio = static_cast<float>(kS8Levels) / levels;
    args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales({ratio});
  }
  dnnl::stream stream(cpu_engine());
  dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src.get_desc(), cpu_engine(), w_md,
                                              attr))
      .execute(stream, args);
  stream.wait();
  return dst;
}

// The steps are the packing reorders' roundings of the weights over their
// scales (to nearest; no ties: s8 times 64 / 127 never ends in a half).
void take_back_zero_point(const Params& p, const std::vector<float>& wscales, int levels,
                          float zero, std::vector<float>* bias) {
  size_t size = 1, channels = bias->size();
  for (int64_t x : p.shape) size *= x;
  size_t per = size / channels;
  float ratio = requantized(p, levels) ? static_cast<float>(levels) / kS8Levels : 1.f;
  for (size_t o = 0; o < channels; ++o) {
    double steps = 0;
    for (size_t i = 0, k = o * per; i < per; ++i, ++k)
      steps += std::nearbyint(p.s8 ? p.s8[k] * ratio : p.weights[k] / wscales[o]);
    (*bias)[o] -= static_cast<float>(zero * steps * wscales[o]);
  }
}

}  // namespace mxamp_onednn
