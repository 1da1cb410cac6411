// batch_dot of (..., M, K) by (..., K, N), either side transposed, as one
// matmul over the batch axes; transposes are strides. A head transpose
// feeding it (a strided view, views.cc) is read where it lies, and the
// output is written in the order of a transpose reading it, so that
// attention's head transposes move no data. INT8 where both operands are
// INT8 already or calibrated: s8/u8 by s8 with a scale each, the output
// requantized where calibrated and every reader takes INT8 (u8 with zero
// point 128 where only linear layers read it, with VNNI).
#include "engine.h"
#include "fusion.h"
#include "linear.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

bool supported(const Node*, int) { return true; }

std::vector<Dims> probe(const Node* n, int) {
  Dims a = flag(n, "transpose_a", false) ? Dims{2, 8, 4} : Dims{2, 4, 8};
  Dims b = flag(n, "transpose_b", false) ? Dims{2, 4, 8} : Dims{2, 8, 4};
  return {a, b};
}

// How operand k is read in INT8: an INT8 value as it is (in its encoding;
// the matmul takes the first operand's zero point), else quantized with its
// calibration. The second operand is the matmul's weights: s8 without a
// zero point (the only INT8 weights oneDNN's matmul takes), at the levels
// its kernels multiply without overflow on this CPU (weight_levels); u8
// holds at most 255 steps from its zero point, so it fits at levels / 255.
struct Quantized {
  bool known = false;
  memory::data_type type = kS8;
  Encoding enc;
};

Quantized quantized(Plan* r, const Node* n, int k) {
  int v = r->value_of(input(n, k));
  Quantized q;
  if (r->is_int8(v)) {
    q = {true, r->value(v).md.get_data_type(), r->value(v).enc};
  } else {
    Range range = r->range_of(input(n, k));
    q = {range.known(), range.type(), {range.scale(), 0}};
  }
  int levels = weight_levels(false, kU8);
  if (k == 1 && (q.type == kU8 || levels < 127))
    q = {q.known, kS8, {q.enc.scale * (q.type == kU8 ? 255 : 127) / levels, 0}};
  return q;
}

// An operand: its value, as read (type, encoding), its MXNet matrix shape.
struct Operand {
  int v;
  memory::data_type dt;
  Encoding enc;
  Arg arg;
  int64_t batch, rows, cols;
  bool transpose;
};

Dims leading(const memory::desc& md) {
  Dims d = md.get_dims();
  d.resize(d.size() - 2);
  return d;
}

// Operand k in type dt: a strided view where it lies when it has that type
// (and encoding) already, else dense.
Operand operand(Plan* r, const Node* n, int k, memory::data_type dt, Encoding enc) {
  int v = r->value_of(input(n, k));
  const Value& x = r->value(v);
  if (x.dims.size() < 3) throw std::runtime_error("batch_dot " + n->name + " needs 3-d inputs");
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < x.dims.size(); ++i) batch *= x.dims[i];
  bool transpose = flag(n, k == 0 ? "transpose_a" : "transpose_b", false);
  if (!is_int8(dt)) enc = {};
  Operand o{v, dt, enc, {x.buf, x.md}, batch, x.dims[x.dims.size() - 2], x.dims.back(),
            transpose};
  if (!x.permuted || dt != x.md.get_data_type() || (is_int8(dt) && enc != x.enc))
    o.arg = r->as(v, plain(x.md.get_dims(), dt), enc);
  return o;
}

// Dims lead + (rows, cols): dense, or with the strides of `like` where it
// is strided; the last two axes swapped when transposed.
memory::desc matrices(Dims lead, int64_t rows, int64_t cols, const memory::desc& like,
                      bool transpose) {
  lead.push_back(rows);
  lead.push_back(cols);
  memory::data_type dt = like.get_data_type();
  Dims strides = is_plain(like) ? plain(lead, dt).get_strides() : like.get_strides();
  size_t last = lead.size() - 1;
  if (transpose) {
    std::swap(lead[last], lead[last - 1]);
    std::swap(strides[last], strides[last - 1]);
  }
  return memory::desc(lead, dt, strides);
}

// The matmul's view of operand o over batch axes lead: a strided view
// whose batch axes are others is made dense first.
memory::desc batched(Plan* r, Operand* o, const Dims& lead) {
  if (!is_plain(o->arg.second) && leading(o->arg.second) != lead)
    o->arg = r->as(o->v, plain(o->arg.second.get_dims(), o->dt), o->enc);
  return matrices(lead, o->rows, o->cols, o->arg.second, o->transpose);
}

// The batch axes all three share: those of the first strided one among the
// operands and the output's layout, else one.
Dims batch_axes(const Operand& a, const Operand& b, const memory::desc& dst) {
  for (const memory::desc* md : {&a.arg.second, &b.arg.second, &dst})
    if (!is_plain(*md)) return leading(*md);
  return {a.batch};
}

// The matmul's scales: each operand's, the output's where it is requantized.
dnnl::primitive_attr scaled(const std::vector<std::pair<int, float>>& of,
                            std::unordered_map<int, memory>* fixed) {
  dnnl::primitive_attr attr = step_attr();
  for (const auto& s : of) {
    attr.set_scales_mask(s.first, 0);
    (*fixed)[DNNL_ARG_ATTR_SCALES | s.first] = scales({s.second});
  }
  return attr;
}

void add(Plan* r, const Node* n, int) {
  Quantized qa = quantized(r, n, 0), qb = quantized(r, n, 1);
  Range out = r->range_of({n, 0});
  bool q = r->int8() && !keeps_float(n) && qa.known && qb.known;
  bool q_out = q && out.known() && r->int8_readers({n, 0});
  Operand a = operand(r, n, 0, q ? qa.type : r->rest(), qa.enc);
  Operand b = operand(r, n, 1, q ? qb.type : r->rest(), qb.enc);
  int64_t m = a.transpose ? a.cols : a.rows, k = a.transpose ? a.rows : a.cols;
  int64_t bk = b.transpose ? b.cols : b.rows, cols = b.transpose ? b.rows : b.cols;
  if (a.batch != b.batch || k != bk)
    throw std::runtime_error("batch_dot " + n->name + ": shapes do not match");
  Dims out_dims(r->value(a.v).dims);
  out_dims.resize(out_dims.size() - 2);
  out_dims.push_back(m);
  out_dims.push_back(cols);
  memory::data_type dt = q_out ? out.type() : r->float_out({n, 0}, q ? r->dt() : r->rest());
  Encoding out_enc{q_out ? out.scale() : 1, 0};
  if (dt == kS8 && linear_readers_take_zero_point(r, {n, 0})) {
    dt = kU8;
    out_enc.zp = 128;
  }
  memory::desc dst = layout_for_views(*r, {n, 0}, out_dims, dt);
  Dims lead = batch_axes(a, b, dst);
  bool strided = !is_plain(dst) && leading(dst) == lead;
  memory::desc dst_mm = strided ? dst : matrices(lead, m, cols, plain(out_dims, dt), false);
  memory::desc src0 = batched(r, &a, lead), src1 = batched(r, &b, lead);
  std::vector<std::pair<int, float>> of;
  if (q) of = {{DNNL_ARG_SRC, qa.enc.scale}, {DNNL_ARG_WEIGHTS, qb.enc.scale}};
  if (q_out) of.push_back({DNNL_ARG_DST, out.scale()});
  std::unordered_map<int, memory> fixed;
  dnnl::primitive_attr attr = scaled(of, &fixed);
  zero_points(a.enc.zp, out_enc.zp, &attr, &fixed);
  dnnl::matmul::primitive_desc pd(cpu_engine(), src0, src1, dst_mm, attr);
  int buf = r->new_buffer(dst_mm);
  r->add_step(dnnl::matmul(pd), {{DNNL_ARG_SRC, {a.arg.first, src0}},
                                 {DNNL_ARG_WEIGHTS, {b.arg.first, src1}},
                                 {DNNL_ARG_DST, {buf, dst_mm}}}, std::move(fixed));
  int v = r->new_value(buf, strided ? dst : plain(out_dims, dt), out_dims, {n, 0}, out_enc);
  r->value(v).permuted = strided;
  r->consume(input(n, 0));
  r->consume(input(n, 1));
}

}  // namespace

const Family kBatchDot = {supported, add, probe};
const FamilyName kBatchDotName("matmul", kBatchDot);  // operator names are the table's

}  // namespace mxamp_onednn
