// Activations and scalar arithmetic: oneDNN eltwise primitives, or post-ops
// of the operator before them (linear.cc, binary.cc), or in INT8 a table of
// mxamp's own (lookup.h).
#include <array>
#include <cmath>
#include <map>
#include <memory>

#include "engine.h"
#include "fusion.h"
#include "linear.h"
#include "lookup.h"
#include "plan.h"
#include "special.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// Activation's act_type values (the relu, sigmoid and tanh operators have
// kinds of their own).
const std::map<std::string, Eltwise>& act_types() {
  static const std::map<std::string, Eltwise> types = {
      {"relu", {dnnl::algorithm::eltwise_relu}},
      {"sigmoid", {dnnl::algorithm::eltwise_logistic}},
      {"tanh", {dnnl::algorithm::eltwise_tanh}},
      {"softrelu", {dnnl::algorithm::eltwise_soft_relu, 1.f}}};
  return types;
}

bool by_act_type(const Node* n, Eltwise* e) {
  auto found = act_types().find(text(n, "act_type"));
  if (found == act_types().end()) return false;
  *e = found->second;
  return true;
}

// One algorithm, whatever the attributes.
template <dnnl::algorithm kAlgorithm>
bool fixed(const Node*, Eltwise* e) {
  *e = {kAlgorithm};
  return true;
}

// LeakyReLU's act_type: GELU, or leaky relu with its slope.
bool leaky_or_gelu(const Node* n, Eltwise* e) {
  const std::string act = text(n, "act_type");
  if (act == "gelu") *e = {dnnl::algorithm::eltwise_gelu_erf};
  else if (act == "leaky" || act.empty())
    *e = {dnnl::algorithm::eltwise_relu, static_cast<float>(number(n, "slope", 0.25))};
  else return false;
  return true;
}

bool times_scalar(const Node* n, Eltwise* e) {
  *e = {dnnl::algorithm::eltwise_linear, static_cast<float>(number(n, "scalar", 1))};
  return true;
}

bool over_scalar(const Node* n, Eltwise* e) {
  double scalar = number(n, "scalar", 1);
  if (scalar == 0) return false;
  *e = {dnnl::algorithm::eltwise_linear, static_cast<float>(1 / scalar)};
  return true;
}

bool between_bounds(const Node* n, Eltwise* e) {
  *e = {dnnl::algorithm::eltwise_clip, static_cast<float>(number(n, "a_min", 0)),
        static_cast<float>(number(n, "a_max", 0))};
  return true;
}

// The kinds of eltwise operator, each named for what it computes (a row of
// the table names its operator's kind; operator names stay in table.cc)
// with how a node's attributes give its oneDNN eltwise (false: a
// configuration the backend does not run). A kind's index is its rows'
// variant.
struct Kind {
  const char* name;
  bool (*of)(const Node* n, Eltwise* e);
};
const Kind kKinds[] = {
    {"act_type", by_act_type},
    {"relu", fixed<dnnl::algorithm::eltwise_relu>},
    {"logistic", fixed<dnnl::algorithm::eltwise_logistic>},
    {"tanh", fixed<dnnl::algorithm::eltwise_tanh>},
    {"leaky or gelu", leaky_or_gelu},
    {"times scalar", times_scalar},
    {"over scalar", over_scalar},
    {"between bounds", between_bounds},
};

int kind(const std::string& name) {
  for (const Kind& k : kKinds)
    if (name == k.name) return static_cast<int>(&k - kKinds);
  return -1;
}

bool of_variant(const Node* n, int variant, Eltwise* e) {
  return kKinds[variant].of(n, e);
}

bool supported(const Node* n, int variant) {
  Eltwise e;
  return of_variant(n, variant, &e);
}

std::vector<Dims> probe(const Node*, int) { return {{2, 16}}; }

// GELU n on INT8 as a table (table_activation): the input INT8 as it is (or
// quantized with its calibration where the layer before it wrote float),
// dense in the dims it is stored in; the output requantized as a linear
// layer's with GELU fused would be (output_encoding), each of the 256
// input steps mapped to its output step once, when planned.
void add_table(Plan* r, const Node* n) {
  int v = r->value_of(input(n, 0));
  const Dims d = r->value(v).dims, stored = r->value(v).md.get_dims();
  const auto [in_type, in_enc] = int8_source(r, v, r->range_of(input(n, 0)));
  Arg src = r->as(v, plain(stored, in_type), in_enc);
  Fusion f;
  f.last = {n, 0};
  f.has_act = true;
  f.act = {dnnl::algorithm::eltwise_gelu_erf};
  Types t;
  output_encoding(r, f, r->range_of({n, 0}), &t);
  const double lo = t.dst == kU8 ? 0 : -128, hi = t.dst == kU8 ? 255 : 127;
  auto table = std::make_shared<std::array<uint8_t, 256>>();
  for (int b = 0; b < 256; ++b) {
    const double x = ((in_type == kS8 ? static_cast<int8_t>(b) : b) - in_enc.zp) * in_enc.scale;
    const double y = 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    const double q = std::nearbyint(y / t.out.scale) + t.out.zp;  // to even, as oneDNN rounds
    (*table)[b] = static_cast<uint8_t>(static_cast<int>(std::min(std::max(q, lo), hi)));
  }
  int64_t count = 1;
  std::string tag, problem;
  for (size_t i = 0; i < stored.size(); ++i) {
    count *= stored[i];
    tag += static_cast<char>('a' + i);
    problem += (i ? "x" : "") + std::to_string(stored[i]);
  }
  memory::desc dst = plain(stored, t.dst);
  int buf = r->new_buffer(dst);
  r->add_step(
      [table, count](const std::unordered_map<int, memory>& a) {
        lookup_bytes(table->data(),
                     static_cast<const uint8_t*>(a.at(DNNL_ARG_SRC).get_data_handle()),
                     static_cast<uint8_t*>(a.at(DNNL_ARG_DST).get_data_handle()), count);
      },
      "eltwise,mxamp_table:avx512_vbmi,forward_inference,src_" + type_name(in_type) +
          "::blocked:" + tag + "::f0 dst_" + type_name(t.dst) + "::blocked:" + tag +
          "::f0,,alg:eltwise_gelu_erf alpha:0 beta:0," + problem,
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {buf, dst}}});
  r->new_value(buf, dst, d, {n, 0}, t.out);
  r->consume(input(n, 0));
}

// An activation that is not a post-op: one eltwise primitive (and in an
// exact region, a step keeping special values where it loses them), or a
// table.
void add(Plan* r, const Node* n, int variant) {
  if (table_activation(r, n)) return add_table(r, n);
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
  if (r->exact() && loses_special_values(e)) add_special_values(r, e, src, {b, pd.dst_desc()});
  r->consume(input(n, 0));
}

}  // namespace

extern const Family kEltwise;  // below

bool eltwise_of(const Node* n, Eltwise* e) {
  const Row* row = row_of(n);
  return row && row->family == &kEltwise && of_variant(n, row->variant, e);
}

// GELU (an erf, a costly post-op) after a FullyConnected (where it was
// measured: docs/onednn.md), wherever its input's and output's steps are
// calibrated and every reader takes INT8, on CPUs with AVX-512 VBMI.
// MXAMP_ONEDNN_GELU=onednn keeps it a post-op (to compare; engine.h,
// kernel_choice: read for every GELU, so that a bad value fails planning
// on any CPU).
bool table_activation(Plan* r, const Node* n) {
  Eltwise e;
  if (!eltwise_of(n, &e) || e.alg != dnnl::algorithm::eltwise_gelu_erf ||
      kernel_choice("GELU") == "onednn")
    return false;
  const Node* before = producer(input(n, 0));
  return r->int8() && !keeps_float(n) && cpu_has_avx512_vbmi() && before &&
         is(before, kLinear, kFullyConnected) && !keeps_float(before) &&
         r->range_of(input(n, 0)).known() && r->range_of({n, 0}).known() &&
         r->int8_readers({n, 0});
}

bool post_op_of(Plan* r, const Node* n, Eltwise* e) {
  return eltwise_of(n, e) && !table_activation(r, n) &&
         !(r->exact() && loses_special_values(*e));
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

const Family kEltwise = {supported, add, probe, nullptr, nullptr, table_activation, false, kind};
const FamilyName kEltwiseName("eltwise", kEltwise);

}  // namespace mxamp_onednn
