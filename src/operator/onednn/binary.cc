// elemwise_add not fused into the convolution / FullyConnected producing an
// operand (see linear.cc): a binary add, with an activation that is its
// only reader as post-op.
#include "engine.h"
#include "fusion.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

bool supported(const Node*, int) { return true; }

std::vector<Dims> probe(const Node*, int) { return {{2, 16}, {2, 16}}; }

// The add's operand v as read: INT8 values in place or as dense views,
// float values in dt (operands kept as 2-d views, such as
// FullyConnected outputs, are read as dense tensors of the MXNet shape).
Arg operand(Plan* r, int v, bool q, const memory::desc* like, memory::data_type dt) {
  bool shaped = r->value(v).md.get_dims() == r->value(v).dims;
  if (like) return shaped ? r->as(v, *like) : q ? r->view(v, r->value(v).dims) : r->dense(v, dt);
  if (q) return shaped ? Arg{r->value(v).buf, r->value(v).md} : r->view(v, r->value(v).dims);
  return shaped ? r->computed(v, dt) : r->dense(v, dt);
}

// INT8 operands are added in INT8 when the result is requantized (oneDNN's
// INT8 add with a float32 output is a reference kernel): their scales make
// them real, a last linear post-op scales to the output's. oneDNN's binary
// takes no zero points: an operand with one is added in float.
void add(Plan* r, const Node* n, int) {
  Entry a = input(n, 0), b = input(n, 1);
  int va = r->value_of(a), vb = r->value_of(b);
  if (r->value(va).dims != r->value(vb).dims)
    throw std::runtime_error("add of different shapes in " + n->name);
  std::vector<const Node*> fused;
  Entry last{n, 0};
  Eltwise act;
  const Node* next = r->readers().sole(last, &fused);
  bool has_act = next && post_op_of(r, next, &act);
  if (has_act) {
    fused.push_back(next);
    last = {next, 0};
  } else {
    fused.clear();  // casts before other readers
  }
  Range out = r->range_of(last);
  bool q = r->is_int8(va) && r->is_int8(vb) && !r->value(va).enc.zp && !r->value(vb).enc.zp &&
           !keeps_float(n) && out.known() && r->int8_readers(last);
  Arg src0 = operand(r, va, q, nullptr, r->dt(n));
  memory::desc like = q ? retyped(src0.second, r->value(vb).md.get_data_type()) : src0.second;
  Arg src1 = operand(r, vb, q, &like, r->dt(n));
  // A float sum is written in the type its readers ask for (Plan::float_out).
  memory::data_type float_dt = r->float_out(last, src0.second.get_data_type());
  memory::desc dst = q ? retyped(src0.second, out.type())
                     : float_dt == src0.second.get_data_type() ? src0.second
                                                               : retyped(src0.second, float_dt);
  dnnl::primitive_attr attr = step_attr();
  dnnl::post_ops ops;
  std::unordered_map<int, memory> fixed;
  if (has_act) ops.append_eltwise(act.alg, act.alpha, act.beta);
  if (q) {
    for (auto arg : {std::make_pair(DNNL_ARG_SRC_0, va), std::make_pair(DNNL_ARG_SRC_1, vb)}) {
      attr.set_scales_mask(arg.first, 0);
      fixed[DNNL_ARG_ATTR_SCALES | arg.first] = scales({r->value(arg.second).enc.scale});
    }
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, 1 / out.scale(), 0.f);
  }
  attr.set_post_ops(ops);
  dnnl::binary::primitive_desc pd(cpu_engine(), dnnl::algorithm::binary_add, src0.second,
                                  src1.second, dst, attr);
  int buf = r->new_buffer(dst);
  r->new_value(buf, dst, r->value(va).dims, last, {q ? out.scale() : 1, 0});
  r->add_step(dnnl::binary(pd), {{DNNL_ARG_SRC_0, src0}, {DNNL_ARG_SRC_1, src1},
                                 {DNNL_ARG_DST, {buf, dst}}}, std::move(fixed));
  r->consume(a);
  r->consume(b);
  for (const Node* f : fused) r->fused(f);
}

}  // namespace

const Family kBinary = {supported, add, probe};
const FamilyName kBinaryName("binary", kBinary);

}  // namespace mxamp_onednn
