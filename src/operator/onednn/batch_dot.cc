// batch_dot of (..., M, K) by (..., K, N), either side transposed, as one
// matmul over the flattened batch axes; transposes are strides. INT8 where
// both operands are INT8 already or calibrated: s8/u8 by s8 with a scale
// each, the output requantized where calibrated and every reader takes INT8.
#include "engine.h"
#include "region.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

bool supported(const Node*, int) { return true; }

std::vector<Dims> probe(const Node* n, int) {
  Dims a = flag(n, "transpose_a", false) ? Dims{2, 8, 4} : Dims{2, 4, 8};
  Dims b = flag(n, "transpose_b", false) ? Dims{2, 4, 8} : Dims{2, 8, 4};
  return {a, b};
}

// How operand k is read in INT8: an INT8 value as it is, else quantized
// with its calibration. The second operand is the matmul's weights: s8 (the
// only INT8 weights oneDNN's matmul takes), at the levels its kernels
// multiply without overflow on this CPU (weight_levels).
struct Quantized {
  bool known = false;
  memory::data_type type = kS8;
  float scale = 1;
};

Quantized quantized(Region* r, const Node* n, int k) {
  int v = r->value_of(input(n, k));
  Quantized q;
  if (r->is_int8(v)) {
    q = {true, r->value(v).md.get_data_type(), r->value(v).scale};
  } else {
    Range range = r->range_of(input(n, k));
    q = {range.known(), range.type(), range.scale()};
  }
  int levels = weight_levels(false, kU8);
  if (k == 1 && (q.type == kU8 || levels < 127))
    q = {q.known, kS8, q.scale * (q.type == kU8 ? 255 : 127) / levels};
  return q;
}

// Operand k as a 3-d (batch, rows, columns) tensor, transposed by strides:
// INT8 as `q` says when `int8`, else dense in the float type of layers
// kept out of INT8.
Arg as_3d(Region* r, const Node* n, int k, bool int8, const Quantized& q) {
  int v = r->value_of(input(n, k));
  const Dims d = r->value(v).dims;
  if (d.size() < 3) throw std::runtime_error("batch_dot " + n->name + " needs 3-d inputs");
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < d.size(); ++i) batch *= d[i];
  int64_t rows = d[d.size() - 2], cols = d.back();
  Arg src = int8 ? r->as(v, plain(r->value(v).md.get_dims(), q.type), q.scale)
                 : r->dense(v, r->rest());
  bool transpose = flag(n, k == 0 ? "transpose_a" : "transpose_b", false);
  Dims dims = transpose ? Dims{batch, cols, rows} : Dims{batch, rows, cols};
  Dims strides = transpose ? Dims{rows * cols, 1, cols} : Dims{rows * cols, cols, 1};
  return {src.first, memory::desc(dims, src.second.get_data_type(), strides)};
}

void add(Region* r, const Node* n, int) {
  Quantized qa = quantized(r, n, 0), qb = quantized(r, n, 1);
  Range out = r->range_of({n, 0});
  bool q = r->int8() && !keeps_float(n) && qa.known && qb.known;
  bool q_out = q && out.known() && r->int8_readers({n, 0});
  Arg src0 = as_3d(r, n, 0, q, qa), src1 = as_3d(r, n, 1, q, qb);
  Dims m = src0.second.get_dims(), k = src1.second.get_dims();
  if (m[0] != k[0] || m[2] != k[1])
    throw std::runtime_error("batch_dot " + n->name + ": shapes do not match");
  Dims out_dims(r->value(r->value_of(input(n, 0))).dims);
  out_dims.resize(out_dims.size() - 2);
  out_dims.push_back(m[1]);
  out_dims.push_back(k[2]);
  memory::data_type dst = q_out ? out.type() : r->float_out({n, 0}, q ? r->dt() : r->rest());
  memory::desc dst_md({m[0], m[1], k[2]}, dst, memory::format_tag::abc);
  dnnl::primitive_attr attr;
  std::unordered_map<int, memory> fixed;
  if (q) {
    for (auto s : {std::make_pair(DNNL_ARG_SRC, qa), std::make_pair(DNNL_ARG_WEIGHTS, qb)}) {
      attr.set_scales_mask(s.first, 0);
      fixed[DNNL_ARG_ATTR_SCALES | s.first] = scales({s.second.scale});
    }
  }
  if (q_out) {
    attr.set_scales_mask(DNNL_ARG_DST, 0);
    fixed[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales({out.scale()});
  }
  dnnl::matmul::primitive_desc pd(cpu_engine(), src0.second, src1.second, dst_md, attr);
  int buf = r->new_buffer(dst_md);
  r->add_step(dnnl::matmul(pd), {{DNNL_ARG_SRC, src0}, {DNNL_ARG_WEIGHTS, src1},
                                 {DNNL_ARG_DST, {buf, dst_md}}}, std::move(fixed));
  r->new_value(buf, dst_md, out_dims, {n, 0}, q_out ? out.scale() : 1);
  r->consume(input(n, 0));
  r->consume(input(n, 1));
}

}  // namespace

const Family kBatchDot = {supported, add, nullptr, probe};

}  // namespace mxamp_onednn
