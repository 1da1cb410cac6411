// Convolutions computing only the rows and columns their readers read
// (linear.h says when).
#include <numeric>

#include "engine.h"
#include "linear.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// The largest k at which every reader of e reads every k-th row and column
// of it only (1: some reader needs it all).
int64_t read_stride(Plan* r, Entry e, Strides* known) {
  int64_t k = 0;
  for (const Node* n : r->readers().of(e)) {
    if (!n || !is(n, kLinear, kConvolution) || !kLinear.supported(n, kConvolution)) return 1;
    for (size_t i = 0; i < n->inputs.size(); ++i)
      if ((input(n, i) == e) != (i == 0)) return 1;  // e as its data, and only so
    Conv c = conv_attributes(n);
    if (c.kernel != Dims{1, 1} || c.pad != Dims{0, 0} || c.stride[0] != c.stride[1]) return 1;
    k = std::gcd(k, c.stride[0] * output_stride(r, n, fuse(r, n, kConvolution), known));
  }
  return k ? k : 1;
}

}  // namespace

// A residual operand is subsampled by pooling: it must be 4-d as the output.
// INT8 regions too: a subsample's range is within its tensor's calibrated
// one, so every encoding (scales folded, zero points) stays as it was.
int64_t output_stride(Plan* r, const Node* n, const Fusion& f, Strides* known) {
  auto it = known->find(n);
  if (it != known->end()) return it->second;
  bool can = f.sum_with < 0 || r->value(f.sum_with).dims.size() == 4;
  return (*known)[n] = can ? read_stride(r, f.last, known) : 1;
}

Conv planned(const Node* n, int64_t k, int64_t q) {
  Conv c = conv_attributes(n);
  for (int64_t& s : c.stride) {
    if (s * q % k) throw std::logic_error("Convolution " + n->name + " reads a subsampled input");
    s = s * q / k;
  }
  return c;
}

// A 1x1 max pooling striding by q (a copy: any INT8 encoding passes as it
// is), then a reorder where pooling writes another layout, type or
// encoding than `to`'s (an INT8 operand summed into a float output).
void subsample(Plan* r, Arg from, Arg to, int64_t q, Encoding from_enc, Encoding to_enc) {
  dnnl::pooling_forward::primitive_desc pd(
      cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max,
      from.second,
      memory::desc(to.second.get_dims(), from.second.get_data_type(), memory::format_tag::any),
      {q, q}, {1, 1}, {0, 0}, {0, 0}, {0, 0}, step_attr());
  bool direct = pd.dst_desc() == to.second && from_enc == to_enc;
  Arg pooled = direct ? to : Arg{r->new_buffer(pd.dst_desc()), pd.dst_desc()};
  r->add_step(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, from}, {DNNL_ARG_DST, pooled}});
  if (!direct) r->add_reorder(pooled, to, from_enc, to_enc);
}

}  // namespace mxamp_onednn
