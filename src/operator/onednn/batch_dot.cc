// batch_dot of (..., M, K) by (..., K, N), either side transposed, as one
// matmul over the flattened batch axes; transposes are strides.
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

// Value v as a 3-d (batch, rows, columns) operand, transposed by strides.
Arg as_3d(Region* r, const Node* n, int v, bool transpose) {
  const Dims d = r->value(v).dims;
  if (d.size() < 3) throw std::runtime_error("batch_dot " + n->name + " needs 3-d inputs");
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < d.size(); ++i) batch *= d[i];
  int64_t rows = d[d.size() - 2], cols = d.back();
  Arg src = r->dense(v);
  Dims dims = transpose ? Dims{batch, cols, rows} : Dims{batch, rows, cols};
  Dims strides = transpose ? Dims{rows * cols, 1, cols} : Dims{rows * cols, cols, 1};
  return {src.first, memory::desc(dims, r->dt(), strides)};
}

void add(Region* r, const Node* n, int) {
  Entry a = input(n, 0), b = input(n, 1);
  int va = r->value_of(a), vb = r->value_of(b);
  Arg src0 = as_3d(r, n, va, flag(n, "transpose_a", false));
  Arg src1 = as_3d(r, n, vb, flag(n, "transpose_b", false));
  Dims m = src0.second.get_dims(), k = src1.second.get_dims();
  if (m[0] != k[0] || m[2] != k[1])
    throw std::runtime_error("batch_dot " + n->name + ": shapes do not match");
  const Dims& da = r->value(va).dims;
  Dims out_dims(da.begin(), da.end() - 2);
  out_dims.push_back(m[1]);
  out_dims.push_back(k[2]);
  memory::desc dst_md({m[0], m[1], k[2]}, r->dt(), memory::format_tag::abc);
  dnnl::matmul::primitive_desc pd(cpu_engine(), src0.second, src1.second, dst_md);
  int out = r->new_buffer(dst_md);
  r->add_step(dnnl::matmul(pd), {{DNNL_ARG_SRC, src0}, {DNNL_ARG_WEIGHTS, src1},
                                 {DNNL_ARG_DST, {out, dst_md}}});
  r->new_value(out, dst_md, out_dims, {n, 0});
  r->consume(a);
  r->consume(b);
}

}  // namespace

const Family kBatchDot = {supported, add, nullptr, probe};

}  // namespace mxamp_onednn
