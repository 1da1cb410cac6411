// Activations and scalar arithmetic: oneDNN eltwise primitives, or post-ops
// of the operator before them (linear.cc, binary.cc).
#include <cmath>
#include <map>

#include "engine.h"
#include "fusion.h"
#include "region.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// Activation's act_type values (the relu, sigmoid and tanh operators have
// variants of their own).
const std::map<std::string, Eltwise>& act_types() {
  static const std::map<std::string, Eltwise> types = {
      {"relu", {dnnl::algorithm::eltwise_relu}},
      {"sigmoid", {dnnl::algorithm::eltwise_logistic}},
      {"tanh", {dnnl::algorithm::eltwise_tanh}},
      {"softrelu", {dnnl::algorithm::eltwise_soft_relu, 1.f}}};
  return types;
}

bool of_variant(const Node* n, int variant, Eltwise* e) {
  const std::string act = text(n, "act_type");
  double scalar = number(n, "scalar", 1);
  auto found = act_types().find(act);
  switch (variant) {
    case kActType:
      if (found == act_types().end()) return false;
      *e = found->second;
      return true;
    case kRelu: *e = {dnnl::algorithm::eltwise_relu}; return true;
    case kSigmoid: *e = {dnnl::algorithm::eltwise_logistic}; return true;
    case kTanh: *e = {dnnl::algorithm::eltwise_tanh}; return true;
    case kLeaky:
      if (act == "gelu") *e = {dnnl::algorithm::eltwise_gelu_erf};
      else if (act == "leaky" || act.empty())
        *e = {dnnl::algorithm::eltwise_relu, static_cast<float>(number(n, "slope", 0.25))};
      else return false;
      return true;
    case kMulScalar: *e = {dnnl::algorithm::eltwise_linear, static_cast<float>(scalar)}; return true;
    case kDivScalar:
      if (scalar == 0) return false;
      *e = {dnnl::algorithm::eltwise_linear, static_cast<float>(1 / scalar)};
      return true;
    case kClip:
      *e = {dnnl::algorithm::eltwise_clip, static_cast<float>(number(n, "a_min", 0)),
            static_cast<float>(number(n, "a_max", 0))};
      return true;
  }
  return false;
}

bool supported(const Node* n, int variant) {
  Eltwise e;
  return of_variant(n, variant, &e);
}

std::vector<Dims> probe(const Node*, int) { return {{2, 16}}; }

// An activation that is not a post-op: one eltwise primitive.
void add(Region* r, const Node* n, int variant) {
  Eltwise e;
  of_variant(n, variant, &e);
  int v = r->value_of(input(n, 0));
  Arg src = r->computed(v, r->dt(n));
  dnnl::eltwise_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                           e.alg, src.second, src.second, e.alpha, e.beta,
                                           step_attr());
  int b = r->new_buffer(pd.dst_desc());
  r->new_value(b, pd.dst_desc(), r->value(v).dims, {n, 0});
  r->add_step(dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {b, pd.dst_desc()}}});
  r->consume(input(n, 0));
}

}  // namespace

bool eltwise_of(const Node* n, Eltwise* e) {
  const Row* row = row_of(n);
  return row && row->family == &kEltwise && of_variant(n, row->variant, e);
}

bool saturation_clamps(const Eltwise& e, memory::data_type dt, float scale, int zero_point) {
  if (!is_int8(dt) || !(scale > 0)) return false;
  // The values the type holds, in steps of `scale` (u8 with zero point 128
  // holds signed values: it clamps no relu).
  float lo = (dt == kU8 ? 0.f : -128.f) - zero_point, hi = (dt == kU8 ? 255.f : 127.f) - zero_point;
  float a, b;  // the activation's bounds
  if (e.alg == dnnl::algorithm::eltwise_relu && e.alpha == 0) {
    a = 0, b = INFINITY;
  } else if (e.alg == dnnl::algorithm::eltwise_clip) {
    a = e.alpha, b = e.beta;
  } else {
    return false;
  }
  // A value past a bound rounds to the type's end either way when the bound
  // itself rounds there (half a step inside it, or beyond).
  return a / scale < lo + 0.5f && b / scale > hi - 0.5f;
}

const Family kEltwise = {supported, add, nullptr, probe};

}  // namespace mxamp_onednn
