// Convolution and FullyConnected, with what follows folded in: BatchNorm
// into the weights, a residual add as sum post-op, an activation as eltwise
// post-op. INT8 when the input is INT8 already or calibrated: s8 weights
// with a scale per output channel (weights.cc), requantized output where
// every reader takes INT8.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "depthwise.h"
#include "engine.h"
#include "fusion.h"
#include "linear.h"
#include "plan.h"
#include "table.h"
#include "weights.h"

namespace mxamp_onednn {

Conv conv_attributes(const Node* n) {
  std::string layout = text(n, "layout", "None");
  return {ints(n, "kernel"), pair(n, "stride", {1, 1}), pair(n, "pad", {0, 0}),
          pair(n, "dilate", {1, 1}), static_cast<int64_t>(number(n, "num_group", 1)),
          layout == "None" || layout == "NCHW"};
}

Fusion fuse(Plan* r, const Node* n, int variant) {
  Fusion f;
  f.last = {n, 0};
  std::vector<const Node*> casts;
  auto take = [&](const Node* next) {
    f.nodes.insert(f.nodes.end(), casts.begin(), casts.end());
    f.nodes.push_back(next);
    f.last = {next, 0};
    casts.clear();
    return r->readers().sole(f.last, &casts);
  };
  const Node* next = r->readers().sole(f.last, &casts);
  if (variant == kConvolution && next && is(next, kNormalisation, kBatchNorm)) {
    f.batchnorm = next;
    next = take(next);
  }
  if (next && is(next, kBinary)) {
    Entry other = input(next, 0);
    if (producer(other) == producer(f.last) && other.second == f.last.second)
      other = input(next, 1);
    if (r->has_value(other) && other != f.last) {
      f.sum_with = r->value_of(other);
      f.sum_entry = other;
      next = take(next);
    }
  }
  if (next && post_op_of(r, next, &f.act)) {
    f.has_act = true;
    take(next);
  }
  return f;
}

namespace {

bool supported(const Node* n, int variant) {
  if (variant == kFullyConnected) return true;
  Conv c = conv_attributes(n);
  return c.kernel.size() == 2 && c.stride.size() == 2 && c.pad.size() == 2 &&
         c.dilate.size() == 2 && c.nchw;
}

// Inputs of a small instance: data, weights, bias.
std::vector<Dims> probe(const Node* n, int variant) {
  if (variant == kFullyConnected) {
    int64_t hidden = static_cast<int64_t>(number(n, "num_hidden", 1));
    return {{2, 16}, {hidden, 16}, {hidden}};
  }
  Conv c = conv_attributes(n);
  int64_t filters = static_cast<int64_t>(number(n, "num_filter", 1));
  int64_t per_group = filters == c.groups ? 1 : 4;  // depthwise has one channel a group
  Dims src = {1, c.groups * per_group, 0, 0};
  for (int i = 0; i < 2; ++i) src[2 + i] = (c.kernel[i] - 1) * c.dilate[i] + 1 + c.stride[i];
  return {src, {filters, per_group, c.kernel[0], c.kernel[1]}, {filters}};
}

// Whether activation e commutes with scaling by k > 0, e(kx) = k e(x):
// relu and leaky relu, a scaling, and clip with its bounds times k.
bool scales_through(const Eltwise& e) {
  return e.alg == dnnl::algorithm::eltwise_relu || e.alg == dnnl::algorithm::eltwise_clip ||
         (e.alg == dnnl::algorithm::eltwise_linear && e.beta == 0);
}

// INT8: what takes real values to output steps where the destination
// scale folds into the weights' (1 / out.scale, applied to the weights'
// scales, bias and post-ops: oneDNN then runs one per-channel scale, as
// MXNet's precomputed output scale); 1 where it does not (a float output,
// an activation that does not commute with scaling).
float dst_fold(const Fusion& f, const Types& t) {
  if (!t.q_out || (f.has_act && !scales_through(f.act))) return 1;
  float k = 1 / t.out.scale;
  return std::isfinite(k) ? k : 1;  // (one over a subnormal scale overflows)
}

// The weights' scales with the source's folded in, and the destination's
// where `fold` (dst_fold) says: what takes a sum of products to output steps.
std::vector<float> folded_scales(std::vector<float> wscales, const Types& t, float fold) {
  for (float& s : wscales) s = s * t.src_enc.scale * fold;
  return wscales;
}

// Whether the fused activation is a post-op: an INT8 output's saturation
// may clamp as it would.
bool needs_act_post_op(const Fusion& f, const Types& t) {
  return f.has_act && !(t.q_out && saturation_clamps(f.act, t.dst, t.out.scale, t.out.zp));
}

// The primitive's attributes: post-ops, INT8 scales and zero points
// (runtime arguments into `fixed`; `wscales` gets the weights' scales). The
// source's scale folds into the weights' runtime scales, and the
// destination's where `fold` (dst_fold) says: the residual's scale, clip's
// bounds and an added zero point then count output steps. oneDNN 3.2's
// inner product takes no zero points: its output's is a last linear
// post-op (adding zp steps before the output's scale). `src_zp`: the
// source's zero point oneDNN compensates (bias_takes_zero_point's are 0).
dnnl::primitive_attr attributes(const Fusion& f, const Types& t, bool conv, int wmask,
                                const Params& p, float fold, int src_zp,
                                std::vector<float>* wscales,
                                std::unordered_map<int, memory>* fixed) {
  dnnl::post_ops ops;
  if (f.sum_with >= 0)
    ops.append_sum(t.sum_enc.scale * fold, t.sum_enc.zp,
                   t.sum == t.dst ? memory::data_type::undef : t.sum);
  Eltwise act = f.act;
  if (needs_act_post_op(f, t)) {
    if (act.alg == dnnl::algorithm::eltwise_clip) act.alpha *= fold, act.beta *= fold;
    ops.append_eltwise(act.alg, act.alpha, act.beta);
  }
  if (!conv && t.out.zp)
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, 1.f,
                       fold == 1 ? t.out.zp * t.out.scale : t.out.zp);  // exact steps when folded
  dnnl::primitive_attr attr = step_attr();
  attr.set_post_ops(ops);
  if (t.q) {
    *wscales = weight_scales(p, weight_levels(conv, t.src));
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, wmask);
    (*fixed)[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = scales(folded_scales(*wscales, t, fold));
  }
  if (t.q_out && fold == 1) {  // not folded
    attr.set_scales_mask(DNNL_ARG_DST, 0);
    (*fixed)[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales({t.out.scale});
  }
  if (conv) zero_points(src_zp, t.out.zp, &attr, fixed);
  return attr;
}

// Whether the bias takes a source zero point back (take_back_zero_point)
// rather than oneDNN: without padding it is one constant per output
// channel, and oneDNN then runs the kernel for plain u8 data, which with
// VNNI is 5-18% faster (brgconv_1x1, MobileNet v2's expansions at batch 32:
// 7.3 against 6.0 ms for 16 -> 96 channels at 112x112; docs/quantization.md).
// oneDNN 3.2's inner product takes no zero points at all. With padding the
// border reads the pad as the zero point, so oneDNN keeps it there.
bool bias_takes_zero_point(const Node* n, bool conv) {
  if (!conv) return true;
  Dims pad = conv_attributes(n).pad;
  return std::all_of(pad.begin(), pad.end(), [](int64_t x) { return x == 0; });
}

// The primitive, where it reads its source and its weights' dims and
// layout.
struct Built {
  dnnl::primitive prim;
  Arg src;
  memory::desc dst_md, w_md;
  Dims out_dims, wdims;
};

// A convolution's output and (grouped) weights dims for a source of dims d.
struct ConvDims {
  Dims out, weights;
};

ConvDims conv_dims(const Conv& c, const Dims& d, int64_t out_ch, int64_t in_per_group) {
  ConvDims s{{d[0], out_ch, 0, 0}, {out_ch, in_per_group, c.kernel[0], c.kernel[1]}};
  for (int i = 0; i < 2; ++i)
    s.out[2 + i] = (d[2 + i] + 2 * c.pad[i] - ((c.kernel[i] - 1) * c.dilate[i] + 1)) / c.stride[i] + 1;
  if (c.groups > 1) s.weights = {c.groups, out_ch / c.groups, in_per_group, c.kernel[0], c.kernel[1]};
  return s;
}

dnnl::convolution_forward::primitive_desc conv_pd(const Conv& c, const memory::desc& src,
                                                  const memory::desc& weights,
                                                  const memory::desc& dst,
                                                  const dnnl::primitive_attr& attr = {}) {
  Dims dil = c.dilate;
  for (int64_t& x : dil) x -= 1;  // oneDNN counts dilation from 0
  return dnnl::convolution_forward::primitive_desc(
      cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      src, weights, memory::desc({dst.get_dims()[1]}, kF32, memory::format_tag::a), dst, c.stride,
      dil, c.pad, c.pad, attr);
}

// The layout in which the convolution that is the sole reader of `e` (a
// tensor of dims d and type dt, subsampled by k) wants its source; a zero
// desc if another operator reads e, or several do.
memory::desc reader_layout(Plan* r, Entry e, const Dims& d, memory::data_type dt, int64_t k) {
  const Node* next = r->readers().sole(e);
  if (!next || !is(next, kLinear, kConvolution) || !supported(next, kConvolution)) return {};
  Strides known;
  Conv c = planned(next, k, output_stride(r, next, fuse(r, next, kConvolution), &known));
  int64_t filters = static_cast<int64_t>(number(next, "num_filter", 1));
  if (c.groups < 1 || d[1] % c.groups || filters % c.groups) return {};
  ConvDims s = conv_dims(c, d, filters, d[1] / c.groups);
  auto any = memory::format_tag::any;
  return conv_pd(c, memory::desc(d, dt, any), memory::desc(s.weights, dt, any),
                 memory::desc(s.out, dt, any)).src_desc();
}

// Whether pd runs a kernel of its own for its layouts, not a reference or
// GEMM fallback.
bool direct_kernel(const dnnl::convolution_forward::primitive_desc& pd) {
  return !reference_kernel(pd) && std::string(pd.impl_info_str()).find("gemm") == std::string::npos;
}

// pd again, writing its output (`last`, after what it fuses) in the layout
// its reader wants when that reader is a convolution and a direct kernel
// writes that layout; else pd as oneDNN chose it. (The first convolution of
// a network, three input channels, prefers a blocked output its
// channels-last readers would reorder, every call.)
dnnl::convolution_forward::primitive_desc in_reader_layout(
    Plan* r, const Conv& c, const dnnl::convolution_forward::primitive_desc& pd,
    const memory::desc& src, const memory::desc& weights, Entry last, int64_t q,
    const dnnl::primitive_attr& attr) {
  if (r->int8()) return pd;  // INT8 activations are channels-last already
  try {
    memory::desc dst = pd.dst_desc();
    memory::desc wanted = reader_layout(r, last, dst.get_dims(), dst.get_data_type(), q);
    if (wanted.is_zero() || wanted == dst) return pd;
    auto matched = conv_pd(c, src, weights, wanted, attr);
    if (direct_kernel(matched)) return matched;
  } catch (const dnnl::error&) {  // no kernel for the reader or that layout
  }
  return pd;
}

// Convolution n with its output subsampled by q (output_stride).
Built convolution(Plan* r, const Node* n, int v, const Types& t, const Params& p, Entry last,
                  int64_t q, const dnnl::primitive_attr& attr) {
  const Dims d = r->value(v).dims;
  if (d.size() != 4) throw std::runtime_error("Convolution " + n->name + " needs a 4-d input");
  Conv c = planned(n, r->value(v).subsampled, q);
  ConvDims s = conv_dims(c, d, p.shape[0], p.shape[1]);
  auto any = memory::format_tag::any;
  memory::desc src(d, t.src, any), weights(s.weights, t.q ? kS8 : r->rest(), any);
  auto pd = in_reader_layout(r, c, conv_pd(c, src, weights, memory::desc(s.out, t.dst, any), attr),
                             src, weights, last, q, attr);
  Built b;
  b.out_dims = s.out;
  b.wdims = s.weights;
  b.src = r->as(v, pd.src_desc(), t.src_enc);
  b.dst_md = pd.dst_desc();
  b.w_md = pd.weights_desc();
  b.prim = dnnl::convolution_forward(pd);
  return b;
}

// FullyConnected on a dense 2-d view: flatten=True keeps the batch axis,
// flatten=False keeps all but the last axis.
Built inner_product(Plan* r, const Node* n, int v, const Types& t, const Params& p,
                    const dnnl::primitive_attr& attr) {
  const Dims d = r->value(v).dims;
  bool flatten = flag(n, "flatten", true);
  int64_t rows = 1, cols = 1, out_ch = p.shape[0];
  for (size_t i = 0; i < d.size(); ++i) ((flatten ? i == 0 : i + 1 < d.size()) ? rows : cols) *= d[i];
  Built b;
  b.out_dims = flatten ? Dims{d[0], out_ch} : d;
  b.out_dims.back() = out_ch;
  b.wdims = {out_ch, cols};
  memory::desc src_md({rows, cols}, t.src, memory::format_tag::ab);
  dnnl::inner_product_forward::primitive_desc pd(
      cpu_engine(), dnnl::prop_kind::forward_inference, src_md,
      memory::desc(b.wdims, t.q ? kS8 : r->rest(), memory::format_tag::any),
      memory::desc({out_ch}, kF32, memory::format_tag::a),
      memory::desc({rows, out_ch}, t.dst, memory::format_tag::ab), attr);
  b.src = {r->as(v, plain(r->value(v).md.get_dims(), t.src), t.src_enc).first, src_md};
  b.dst_md = pd.dst_desc();
  b.w_md = pd.weights_desc();
  b.prim = dnnl::inner_product_forward(pd);
  return b;
}

// The output buffer. The residual operand is written into dst first
// (subsampled by q with the output); when nothing else reads it and its
// layout matches, the add happens in its own buffer.
int output_buffer(Plan* r, const Fusion& f, const Types& t, const memory::desc& dst_md,
                  int64_t q) {
  if (f.sum_with < 0) return r->new_buffer(dst_md);
  memory::desc sum_md = t.sum == t.dst ? dst_md : retyped(dst_md, t.sum);
  const Value& o = r->value(f.sum_with);
  int buf;
  if (q > 1) {
    buf = r->new_buffer(dst_md);
    subsample(r, {o.buf, o.md}, {buf, sum_md}, q, o.enc, t.sum_enc);
  } else if (r->writable(f.sum_with) && o.md == sum_md) {
    buf = o.buf;
  } else {
    buf = r->new_buffer(dst_md);
    Arg from = o.md.get_dims() == dst_md.get_dims() ? Arg{o.buf, o.md}
                                                    : r->view(f.sum_with, dst_md.get_dims());
    r->add_reorder(from, {buf, sum_md}, o.enc, t.sum_enc);
  }
  r->consume(f.sum_entry);
  return buf;
}

// n's output, written into buffer `out` by the step just added.
void add_output(Plan* r, const Node* n, const Fusion& f, const Types& t, int out,
                const memory::desc& md, const Dims& dims, int64_t q) {
  r->consume(input(n, 0));
  for (const Node* node : f.nodes) r->fused(node);
  r->value(r->new_value(out, md, dims, f.last, t.out)).subsampled = q;
}

// A call of the depthwise kernel as oneDNN's verbose mode would log the
// convolution (the fields run_logged takes).
std::string depthwise_log(const DepthwiseShape& s, const Types& t) {
  std::string zp;
  if (t.src_enc.zp) zp = "src0:0";
  if (t.out.zp) zp += (zp.empty() ? "" : "+") + std::string("dst:0");
  if (!zp.empty()) zp = "attr-zero-points:" + zp + " ";
  std::string c = std::to_string(s.c), h = std::to_string(s.h), w = std::to_string(s.w);
  return "convolution,mxamp_dw3x3:avx512_core_vnni,forward_inference,src_u8::blocked:acdb::f0 "
         "wei_s8::blocked:abcde::f0 bia_f32::blocked:a::f0 dst_" +
         type_name(t.dst) +
         "::blocked:acdb::f0,attr-scales:wei:3 " + zp + ",alg:convolution_direct,g" + c + "mb" +
         std::to_string(s.n) + "_ic" + c + "oc" + c + "_ih" + h + "oh" + h + "kh3sh1dh0ph1_iw" +
         w + "ow" + w + "kw3sw1dw0pw1";
}

// Convolution n on mxamp's own depthwise kernel (depthwise.h), where that
// computes it as planned: INT8 from u8 data, one 3x3 filter per channel,
// padding 1, stride 1 (it has no stride 2: at stride 2 oneDNN's kernel was
// faster than a first version, docs/onednn.md), and nothing fused that
// needs a post-op.
// MXAMP_ONEDNN_DEPTHWISE=onednn keeps every convolution on oneDNN (to
// compare). False where it plans nothing.
bool add_own_depthwise(Plan* r, const Node* n, int v, const Fusion& f, const Types& t,
                       const Params& p, int64_t q, float fold) {
  if (kernel_choice("DEPTHWISE") == "onednn" || !cpu_has_avx512_vnni()) return false;
  const Dims d = r->value(v).dims;
  if (!t.q || !t.q_out || t.src != kU8 || d.size() != 4 || f.sum_with >= 0 ||
      needs_act_post_op(f, t) || (fold == 1 && t.out.scale != 1))
    return false;
  Conv c = planned(n, r->value(v).subsampled, q);
  const Dims one = {1, 1};
  if (c.kernel != Dims{3, 3} || c.stride != one || c.pad != one || c.dilate != one ||
      c.groups != d[1] || p.shape[0] != d[1] || !depthwise_fits(d[1]))
    return false;
  ConvDims s = conv_dims(c, d, p.shape[0], 1);
  const auto nhwc = memory::format_tag::nhwc;
  memory::desc w_md(s.weights, kS8, memory::format_tag::goihw), dst_md(s.out, t.dst, nhwc);
  const int levels = weight_levels(true, t.src);
  const std::vector<float> wscales = weight_scales(p, levels);
  memory w = p.s8 ? pack_s8(p, s.weights, w_md, true, levels, 3)
                  : r->pack(p.weights.data(), s.weights, w_md, wscales, 3);
  std::vector<float> bias(p.bias);
  for (float& x : bias) x *= fold;  // in output steps
  auto k = std::make_shared<const DepthwiseWeights>(depthwise_weights(
      static_cast<const int8_t*>(w.get_data_handle()), d[1], t.src_enc.zp,
      folded_scales(wscales, t, fold), std::move(bias), t.out.zp, t.dst == kS8));
  const DepthwiseShape shape{d[0], d[2], d[3], d[1]};
  Arg src = r->as(v, memory::desc(d, kU8, nhwc), t.src_enc);
  int out = r->new_buffer(dst_md);
  r->add_step(
      [k, shape](const std::unordered_map<int, memory>& a) {
        depthwise3x3(shape, *k, static_cast<const uint8_t*>(a.at(DNNL_ARG_SRC).get_data_handle()),
                     a.at(DNNL_ARG_DST).get_data_handle());
      },
      depthwise_log(shape, t), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {out, dst_md}}});
  add_output(r, n, f, t, out, dst_md, s.out, q);
  return true;
}

void add(Plan* r, const Node* n, int variant) {
  bool conv = variant == kConvolution;
  Params p = params(r, n);
  Fusion f = fuse(r, n, variant);
  if (f.batchnorm) {
    if (p.s8)  // mxamp's quantization folds BatchNorm before quantizing
      throw std::runtime_error("BatchNorm " + f.batchnorm->name + " follows s8 weights");
    fold_batchnorm(r, f.batchnorm, &p.weights, &p.bias);
  }
  Strides known;
  int64_t q = conv ? output_stride(r, n, f, &known) : 1;
  Types t = types(r, n, f);
  int groups = conv ? static_cast<int>(conv_attributes(n).groups) : 1;
  int wmask = groups > 1 ? 3 : 1;  // output channels: (group, channel) or channel
  std::vector<float> wscales;
  std::unordered_map<int, memory> fixed;
  float fold = dst_fold(f, t);
  int v = r->value_of(input(n, 0));
  if (conv && add_own_depthwise(r, n, v, f, t, p, q, fold)) return;
  bool bias_zp = t.src_enc.zp && bias_takes_zero_point(n, conv);
  dnnl::primitive_attr attr =
      attributes(f, t, conv, wmask, p, fold, bias_zp ? 0 : t.src_enc.zp, &wscales, &fixed);
  Built b = conv ? convolution(r, n, v, t, p, f.last, q, attr) : inner_product(r, n, v, t, p, attr);
  int out = output_buffer(r, f, t, b.dst_md, q);
  int levels = weight_levels(conv, t.src);
  if (bias_zp)
    take_back_zero_point(p, wscales, levels, t.src_enc.zp * t.src_enc.scale, &p.bias);
  fixed[DNNL_ARG_WEIGHTS] = p.s8 ? pack_s8(p, b.wdims, b.w_md, t.q, levels, wmask)
                                 : r->pack(p.weights.data(), b.wdims, b.w_md, wscales, wmask);
  for (float& x : p.bias) x *= fold;  // in output steps, as the post-ops
  memory::desc bias_md({p.shape[0]}, kF32, memory::format_tag::a);
  fixed[DNNL_ARG_BIAS] = r->pack(p.bias.data(), {p.shape[0]}, bias_md);
  r->add_step(b.prim, {{DNNL_ARG_SRC, b.src}, {DNNL_ARG_DST, {out, b.dst_md}}}, std::move(fixed));
  add_output(r, n, f, t, out, b.dst_md, b.out_dims, q);
}

}  // namespace

const Family kLinear = {supported, add, probe};
const FamilyName kLinearName("linear", kLinear);

}  // namespace mxamp_onednn
