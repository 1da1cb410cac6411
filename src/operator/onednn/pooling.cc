// Pooling: max and average, 2-d or global, as MXNet pools. INT8 input is
// pooled in INT8 in the same encoding (scale and zero point).
#include "engine.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// Pooling's attributes with MXNet's defaults.
struct Pool {
  bool max, global, full, count_include_pad, nchw;
  std::string type, convention;
  Dims kernel, stride, pad;
};

Pool attributes(const Node* n) {
  Pool p;
  p.type = text(n, "pool_type", "max");
  p.convention = text(n, "pooling_convention", "valid");
  p.max = p.type == "max";
  p.full = p.convention == "full";
  p.global = flag(n, "global_pool", false);
  p.count_include_pad = flag(n, "count_include_pad", true);
  std::string layout = text(n, "layout", "None");
  p.nchw = layout == "None" || layout == "NCHW";
  p.kernel = ints(n, "kernel");
  p.stride = pair(n, "stride", {1, 1});
  p.pad = pair(n, "pad", {0, 0});
  return p;
}

// Whether oneDNN pools as MXNet does with these attributes.
bool supported(const Node* n, int) {
  Pool p = attributes(n);
  if ((p.type != "max" && p.type != "avg") || !p.nchw || (!p.full && p.convention != "valid"))
    return false;
  if (p.global) return true;
  if (p.kernel.size() != 2 || p.stride.size() != 2 || p.pad.size() != 2) return false;
  bool padded = false;
  for (int i = 0; i < 2; ++i) {
    // oneDNN needs every window to reach into the input: pad < kernel, and
    // with "full" (the last window ends up to stride - 1 past the pad)
    // pad + stride <= kernel.
    if (p.pad[i] >= p.kernel[i] || (p.full && p.pad[i] + p.stride[i] > p.kernel[i])) return false;
    padded |= p.pad[i] != 0;
  }
  // An average "full" window may run past input + pad; MXNet then divides
  // by its part inside input + pad, oneDNN by the whole window or by the
  // part inside the input, which agree with it only without pad.
  return !(!p.max && p.full && padded && p.count_include_pad);
}

// MXNet divides an average by the window's part inside input + pad. That
// is the whole window for "valid"; for "full" (without pad, see
// supported()) it is the part inside the input.
bool counts_padding(const Pool& p) { return !p.max && p.count_include_pad && !p.full; }

// MXNet's Pooling of a 4-d src (its data type; dst layout left to oneDNN);
// `out` gets MXNet's output shape.
dnnl::pooling_forward::primitive_desc pooling_pd(const Pool& p, const memory::desc& src,
                                                 Dims* out) {
  Dims d = src.get_dims();
  Dims kernel = p.global ? Dims{d[2], d[3]} : p.kernel;
  Dims stride = p.global ? Dims{1, 1} : p.stride, pad = p.global ? Dims{0, 0} : p.pad;
  *out = {d[0], d[1], 0, 0};
  Dims pad_r = pad;
  for (int i = 0; i < 2; ++i) {
    int64_t span = d[2 + i] + 2 * pad[i] - kernel[i];
    (*out)[2 + i] = (p.full ? (span + stride[i] - 1) / stride[i] : span / stride[i]) + 1;
    pad_r[i] = ((*out)[2 + i] - 1) * stride[i] + kernel[i] - d[2 + i] - pad[i];
  }
  auto alg = p.max ? dnnl::algorithm::pooling_max
             : counts_padding(p) ? dnnl::algorithm::pooling_avg_include_padding
                                 : dnnl::algorithm::pooling_avg_exclude_padding;
  memory::desc dst_any(*out, src.get_data_type(), memory::format_tag::any);
  return dnnl::pooling_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_inference,
                                               alg, src, dst_any, stride, kernel, {0, 0}, pad,
                                               pad_r, step_attr());
}

// Whether Pooling n pools INT8 with a zero point as it pools without one:
// max, or an average whose windows count no padding; an average over
// padding would count it as the zero point's negative.
bool pools_zero_point(const Node* n) {
  Pool p = attributes(n);  // global pooling has no padding (pooling_pd)
  return !counts_padding(p) || p.global || (p.pad.size() == 2 && p.pad[0] == 0 && p.pad[1] == 0);
}

// Pooling not kept in float passes INT8 on in its encoding where it pools
// a zero point alike.
bool passes_zero_point(const Node* n, int) { return !keeps_float(n) && pools_zero_point(n); }

std::vector<Dims> probe(const Node* n, int) {
  Pool p = attributes(n);
  bool sized = !p.global && p.kernel.size() == 2;
  return {{1, 16, sized ? p.kernel[0] + p.stride[0] : 4, sized ? p.kernel[1] + p.stride[1] : 4}};
}

void add(Plan* r, const Node* n, int) {
  Pool p = attributes(n);
  int v = r->value_of(input(n, 0));
  const Dims d = r->value(v).dims;
  // INT8 or float data is pooled in its own type (no conversion for it);
  // INT8 data before a kept pooling, or with a zero point the pooling would
  // not keep, is dequantized.
  bool q = r->is_int8(v) && !keeps_float(n) && (r->value(v).enc.zp == 0 || pools_zero_point(n));
  memory::data_type dt = r->is_int8(v) ? r->dt(n) : r->value(v).md.get_data_type();
  Arg src = q ? Arg{r->value(v).buf, r->value(v).md} : r->computed(v, dt);
  Dims out;
  if (d.size() != 4) {
    // Global pooling over 1 or 3 spatial axes (MXNet accepts them; a kernel
    // fixes 2) is the same over a 4-d view: (N, C, rest, last).
    if (!p.global || d.size() < 3)
      throw std::runtime_error("Pooling " + n->name + " needs a 4-d input");
    Dims d4 = {d[0], d[1], 1, d.back()};
    for (size_t i = 2; i + 1 < d.size(); ++i) d4[2] *= d[i];
    src = q ? r->view(v, d4) : Arg{r->dense(v, dt).first, plain(d4, dt)};
    out = d;
    std::fill(out.begin() + 2, out.end(), 1);
  }
  Dims out4;
  auto pd = pooling_pd(p, src.second, &out4);
  int b = r->new_buffer(pd.dst_desc());
  r->new_value(b, pd.dst_desc(), out.empty() ? out4 : out, {n, 0},
               q ? r->value(v).enc : Encoding());
  r->add_step(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {b, pd.dst_desc()}}});
  r->consume(input(n, 0));
}

}  // namespace

const Family kPooling = {supported, add, probe, nullptr, passes_zero_point};
const FamilyName kPoolingName("pooling", kPooling);

}  // namespace mxamp_onednn
