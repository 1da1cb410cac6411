// BatchNorm (folded into the convolution before it, see linear.cc), and
// LayerNorm and softmax over the last axis (INT8 output where calibrated).
#include <cmath>

#include "engine.h"
#include "fusion.h"
#include "plan.h"
#include "softmax_int8.h"
#include "special.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// Normalised over the last axis only (what oneDNN runs), no extras.
bool supported(const Node* n, int variant) {
  if (variant == kBatchNorm)
    return text(n, "axis", "1") == "1" && !flag(n, "output_mean_var", false);
  if (variant == kLayerNorm)
    return text(n, "axis", "-1") == "-1" && !flag(n, "output_mean_var", false);
  return text(n, "axis", "-1") == "-1" && !flag(n, "use_length", false) &&
         number(n, "temperature", 1) == 1;
}

// A BatchNorm folds into the convolution before it when it is that
// convolution's only reader and only its output 0 is read.
bool fuses(const Node* bn, const Readers& readers) {
  const Node* conv = producer(input(bn, 0));
  return is(conv, kLinear, kConvolution) && readers.sole({conv, 0}) == bn &&
         readers.of({bn, 1}).empty() && readers.of({bn, 2}).empty();
}

// BatchNorm has no primitive of its own (folded into weights).
std::vector<Dims> probe(const Node*, int variant) {
  if (variant == kBatchNorm) return {};
  return {{2, 3, 16}, {16}, {16}};  // data; LayerNorm's gamma and beta
}

// softmax, or LayerNorm (with scale and shift), over the last axis.
dnnl::primitive_desc normalisation_pd(int variant, const memory::desc& src,
                                      const memory::desc& dst, float eps,
                                      const dnnl::primitive_attr& attr) {
  if (variant == kSoftmax)
    return dnnl::softmax_forward::primitive_desc(
        cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, src,
        dst, src.get_ndims() - 1, attr);
  return dnnl::layer_normalization_forward::primitive_desc(
      cpu_engine(), dnnl::prop_kind::forward_inference, src, dst, eps,
      dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift, attr);
}

// mxamp's own softmax (softmax_int8.h) as a step, rows of float32 or
// bfloat16 (`src_type`) to `out` (its INT8 type and steps), logged as oneDNN logs
// its softmax.
void add_own_softmax(Plan* r, std::vector<std::pair<int, Arg>> args,
                     memory::data_type src_type, int64_t rows, int64_t cols, const Range& out) {
  const float scale = out.scale();
  const bool out_signed = out.type() == kS8, bf16 = src_type == kBF16;
  r->add_step(
      [rows, cols, scale, out_signed, bf16](const std::unordered_map<int, memory>& a) {
        softmax_int8(a.at(DNNL_ARG_SRC).get_data_handle(), bf16,
                     a.at(DNNL_ARG_DST).get_data_handle(), rows, cols, scale, out_signed);
      },
      "softmax,mxamp_softmax:" + std::string(softmax_int8_isa()) + ",forward_inference,src_" +
          type_name(src_type) +
          "::blocked:ab::f0 dst_" + type_name(out.type()) +
          "::blocked:ab::f0,attr-scales:dst:0 ,alg:softmax_accurate axis:1," +
          std::to_string(rows) + "x" + std::to_string(cols),
      std::move(args));
}

// oneDNN's softmax or LayerNorm as a step (`scale`: its INT8 output's, 0
// for a float output); in an exact region, softmax's rows that hold NaN or
// +Inf get MXNet's answer (special.h).
void add_primitive(Plan* r, const Node* n, int variant, const dnnl::primitive_desc& pd,
                   std::vector<std::pair<int, Arg>> args, float scale) {
  std::unordered_map<int, memory> fixed;
  if (scale) fixed[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales({scale});
  const Dims d = args[0].second.second.get_dims();  // rows by the last axis
  if (variant == kLayerNorm) {
    Dims c = {d.back()};
    memory::desc cmd(c, kF32, memory::format_tag::a);
    fixed[DNNL_ARG_SCALE] = r->pack(r->param(n->inputs[1], c[0]), c, cmd);
    fixed[DNNL_ARG_SHIFT] = r->pack(r->param(n->inputs[2], c[0]), c, cmd);
  }
  Arg src = args[0].second, dst = args[1].second;
  r->add_step(dnnl::primitive(pd), std::move(args), std::move(fixed));
  if (r->exact() && variant == kSoftmax) add_softmax_special_rows(r, src, dst, d[0], d[1]);
}

// softmax or LayerNorm on a dense tensor viewed as 2-d (rows by last axis:
// oneDNN's layer normalisation needs 2 axes or more). In an INT8 region the
// output is requantized where calibrated and every reader takes INT8 (the
// attention's weights, for the batch_dot after softmax), and the input read
// as INT8 where oneDNN stores no bfloat16.
void add(Plan* r, const Node* n, int variant) {
  if (variant == kBatchNorm)
    throw std::runtime_error("BatchNorm " + n->name + " does not follow a convolution");
  int v = r->value_of(input(n, 0));
  const Dims d = r->value(v).dims;  // a copy: dense() below may grow the values
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < d.size(); ++i) rows *= d[i];
  // Read as it is: INT8 where oneDNN stores no bfloat16 (LayerNorm's narrowest
  // type), or float of either type (computed in float32 inside); else
  // dequantized. oneDNN 3.2's LayerNorm multiplies its output by a source
  // scale, so an INT8 source gets none: LayerNorm of q equals LayerNorm of
  // q times its scale once epsilon is divided by the scale squared (and a
  // zero point, the same over the row, cancels in the mean).
  bool q_in = variant == kLayerNorm && r->narrow_int8() && !keeps_float(n) && r->is_int8(v);
  float in_scale = r->value(v).enc.scale;
  Arg dense = q_in || !r->is_int8(v) ? r->view(v, d) : r->dense(v, r->dt(n));
  Arg src{dense.first, plain({rows, d.back()}, dense.second.get_data_type())};
  Range out = r->range_of({n, 0});
  float eps = static_cast<float>(number(n, "eps", 1e-5)) / (q_in ? in_scale * in_scale : 1);
  auto writing = [&](bool q) {
    dnnl::primitive_attr attr = step_attr();
    if (q) attr.set_scales_mask(DNNL_ARG_DST, 0);
    memory::data_type dt = q ? out.type() : r->float_out({n, 0}, r->dt(n));
    return normalisation_pd(variant, src.second, plain({rows, d.back()}, dt), eps, attr);
  };
  bool q_out = r->int8() && !keeps_float(n) && out.known() && r->int8_readers({n, 0});
  dnnl::primitive_desc pd = writing(q_out);
  // INT8 out of a jit kernel only: oneDNN 3.2's INT8 softmax on AVX2 is its
  // reference one (85 of 165 ms of a 2-layer encoder at 1x128). There
  // mxamp's own softmax writes the INT8 probabilities from float32 scores;
  // else it writes float and its reader requantizes in a jit reorder. From
  // bfloat16 scores (AVX-512) mxamp's runs too: it took 1.46x less time
  // than oneDNN's jit kernel (docs/onednn.md). MXAMP_ONEDNN_SOFTMAX chooses
  // (engine.h, kernel_choice).
  const std::string choice = kernel_choice("SOFTMAX");
  bool reference = q_out && reference_kernel(pd);
  const memory::data_type src_dt = src.second.get_data_type();
  bool own = q_out && variant == kSoftmax && cpu_has_avx2() &&
             (src_dt == kF32 || src_dt == kBF16) &&
             (choice == "mxamp" || ((reference || src_dt == kBF16) && choice != "onednn"));
  if (reference && !own) pd = writing(q_out = false);
  memory::desc dst = own ? plain({rows, d.back()}, out.type()) : pd.dst_desc();
  int buf = r->new_buffer(dst);
  std::vector<std::pair<int, Arg>> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {buf, dst}}};
  if (own) {
    add_own_softmax(r, std::move(args), src_dt, rows, d.back(), out);
  } else {
    add_primitive(r, n, variant, pd, std::move(args), q_out ? out.scale() : 0);
  }
  r->new_value(buf, dst, d, {n, 0}, {q_out ? out.scale() : 1, 0});
  r->consume(input(n, 0));
}

}  // namespace

void fold_batchnorm(Plan* r, const Node* bn, std::vector<float>* w, std::vector<float>* b) {
  size_t c = b->size();
  const float* gamma = flag(bn, "fix_gamma", true) ? nullptr : r->param(bn->inputs[1], c);
  const float* beta = r->param(bn->inputs[2], c);
  const float* mean = r->param(bn->inputs[3], c);
  const float* var = r->param(bn->inputs[4], c);
  double eps = number(bn, "eps", 1e-3);
  size_t per = w->size() / c;
  for (size_t o = 0; o < c; ++o) {
    float s = static_cast<float>((gamma ? gamma[o] : 1.0) / std::sqrt(var[o] + eps));
    for (size_t i = 0; i < per; ++i) (*w)[o * per + i] *= s;
    (*b)[o] = ((*b)[o] - mean[o]) * s + beta[o];
  }
}

const Family kNormalisation = {supported, add, probe, fuses};
const FamilyName kNormalisationName("normalisation", kNormalisation);

}  // namespace mxamp_onednn
