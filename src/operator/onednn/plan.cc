// A region's plan: its inputs, nodes and outputs; values and buffers,
// reorders, and the INT8 questions the operator families ask.
#include "plan.h"

#include <algorithm>

#include "engine.h"
#include "table.h"

namespace mxamp_onednn {

memory scales(const std::vector<float>& s) {
  memory m(memory::desc({static_cast<int64_t>(s.size())}, kF32, memory::format_tag::a),
           cpu_engine());
  std::copy(s.begin(), s.end(), static_cast<float*>(m.get_data_handle()));
  return m;
}

void zero_points(int src, int dst, dnnl::primitive_attr* attr,
                 std::unordered_map<int, memory>* fixed) {
  for (auto zp : {std::make_pair(DNNL_ARG_SRC, src), std::make_pair(DNNL_ARG_DST, dst)}) {
    if (!zp.second) continue;
    memory m(memory::desc({1}, memory::data_type::s32, memory::format_tag::a), cpu_engine());
    *static_cast<int32_t*>(m.get_data_handle()) = zp.second;
    attr->set_zero_points_mask(zp.first, 0);
    (*fixed)[DNNL_ARG_ATTR_ZERO_POINTS | zp.first] = m;
  }
}

memory::desc retyped(const memory::desc& md, memory::data_type dt) {
  if (md.get_inner_nblks() == 0) return memory::desc(md.get_dims(), dt, md.get_strides());
  return plain(md.get_dims(), dt);
}

Plan::Plan(const Graph* g, const std::vector<MXTensor>& ins, const std::vector<size_t>& same,
           Precision precision, const std::vector<Range>& ranges)
    : graph_(g),
      ins_(&ins),
      same_(same),
      precision_(precision),
      input_ranges_(ranges),
      readers_(g),
      stream_(cpu_engine()) {
  add_inputs();
}

void Plan::add_inputs() {
  const std::vector<MXTensor>& ins = *ins_;
  for (size_t i = 0; i < graph_->inputs.size(); ++i) {
    if (same_[i] != i) {
      bind({graph_->inputs[i], 0}, value_of({graph_->inputs[same_[i]], 0}));
      continue;
    }
    Dims dims(ins[i].shape.begin(), ins[i].shape.end());
    memory::desc md = plain(dims, ins[i].dtype == kInt8 ? kS8 : kF32);
    int b = new_buffer(md);
    bufs_[b].input = static_cast<int>(i);
    int v = new_value(b, md, dims, {graph_->inputs[i], 0});
    vals_[v].input = static_cast<int>(i);
  }
}

void Plan::add_nodes() {
  for (size_t i = 0; i < graph_->size(); ++i) {  // JSON order is topological
    const Node* n = graph_->getNode(i);
    if (!is_variable(n) && !done_.count(n) && !dequantizes(n)) add_node(n);
  }
}

void Plan::add_node(const Node* n) {
  const Row* row = row_of(n);
  if (!row || !row->family->supported(n, row->variant))
    throw std::runtime_error("operator " + n->op + " (" + n->name + ") is not supported");
  row->family->add(this, n, row->variant);
}

Planned Plan::finish(const std::vector<MXTensor>& outs) {
  add_outputs(outs);
  ins_ = nullptr;
  return {std::move(steps_), std::move(bufs_), scratchpad_, std::move(params_)};
}

void Plan::add_outputs(const std::vector<MXTensor>& outs) {
  for (const MXTensor& t : outs)
    if (t.dtype != kFloat32) throw std::runtime_error("region outputs must be float32");
  for (size_t j = 0; j < graph_->outputs.size(); ++j) {
    const NodeEntry& e = graph_->outputs[j];
    int v = value_of({e.node, e.entry});
    Dims dims(outs[j].shape.begin(), outs[j].shape.end());
    int b = new_buffer(plain(dims, kF32));
    bufs_[b].output = static_cast<int>(j);
    // One reorder from the layout the value is in, unless its shape differs
    // (a view needs a dense copy first).
    Arg from = vals_[v].md.get_dims() == dims ? Arg{vals_[v].buf, vals_[v].md} : view(v, dims);
    add_reorder(from, {b, plain(dims, kF32)}, vals_[v].enc);
  }
}

// ---- values and buffers

int Plan::new_buffer(const memory::desc& md) {
  bufs_.push_back(Buffer());
  bufs_.back().size = md.get_size();
  return static_cast<int>(bufs_.size()) - 1;
}

int Plan::new_value(int buf, const memory::desc& md, const Dims& dims, Entry e, Encoding enc) {
  vals_.push_back({buf, md, dims, enc});
  int v = static_cast<int>(vals_.size()) - 1;
  bind(e, v);
  return v;
}

void Plan::bind(Entry e, int v) {
  entry_[e] = v;
  vals_[v].uses += static_cast<int>(readers_.of(e).size());
}

int Plan::value_of(Entry e) {
  auto it = entry_.find(e);
  if (it == entry_.end()) throw std::runtime_error("no value for an input of node " + e.first->name);
  return it->second;
}

std::vector<Entry> Plan::entries_of(int v) const {
  std::vector<Entry> entries;
  for (const auto& e : entry_)
    if (e.second == v) entries.push_back(e.first);
  return entries;
}

void Plan::consume(Entry e) { vals_[value_of(e)].uses--; }

void Plan::fused(const Node* n) { done_.insert(n); }

bool Plan::shared(int v) const {
  for (size_t i = 0; i < vals_.size(); ++i)
    if (static_cast<int>(i) != v && vals_[i].buf == vals_[v].buf && vals_[i].uses > 0) return true;
  return false;
}

bool Plan::writable(int v) const {
  return vals_[v].uses == 1 && bufs_[vals_[v].buf].input < 0 && !shared(v);
}

void Plan::add_step(const dnnl::primitive& p, std::vector<std::pair<int, Arg>> args,
                    std::unordered_map<int, memory> fixed) {
  dnnl::primitive_desc_base pd(const_cast<dnnl_primitive_desc_t>(p.get_primitive_desc()), true);
  if (pd.get_primitive_attr().get_scratchpad_mode() != dnnl::scratchpad_mode::user)
    throw std::logic_error("a region step's primitive must be made with step_attr()");
  scratchpad_ = std::max(scratchpad_, pd.scratchpad_desc().get_size());
  uses(args);
  steps_.push_back({[p](dnnl::stream& stream, const std::unordered_map<int, memory>& a) {
                      p.execute(stream, a);
                    },
                    std::move(args), std::move(fixed)});
}

void Plan::add_step(OwnKernel call, std::string log, std::vector<std::pair<int, Arg>> args) {
  uses(args);
  Kernel k = [call = std::move(call), log = std::move(log)](
                 dnnl::stream& stream, const std::unordered_map<int, memory>& a) {
    // The primitives before it may still be running where oneDNN's CPU
    // runtime is asynchronous (SYCL, oneDNN 3.13's wheel); a no-op on OpenMP.
    stream.wait();
    run_logged(log, [&] { call(a); });
  };
  steps_.push_back({std::move(k), std::move(args), {}});
}

void Plan::uses(const std::vector<std::pair<int, Arg>>& args) {
  int s = static_cast<int>(steps_.size());
  for (auto& a : args) {
    Buffer& b = bufs_[a.second.first];
    if (b.first < 0) b.first = s;
    b.last = s;
  }
}

// A reorder step from one encoding to another; equal encodings need no
// attributes (the integers are copied as they are).
void Plan::add_reorder(Arg from, Arg to, Encoding from_enc, Encoding to_enc) {
  dnnl::primitive_attr attr = step_attr();
  std::unordered_map<int, memory> fixed;
  if (from_enc != to_enc) {
    if (from_enc.scale != to_enc.scale) {
      attr.set_scales_mask(DNNL_ARG_SRC, 0);
      fixed[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = scales({from_enc.scale / to_enc.scale});
    }
    zero_points(from_enc.zp, to_enc.zp, &attr, &fixed);
  }
  add_step(dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), from.second, cpu_engine(),
                                                      to.second, attr)),
           {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}, std::move(fixed));
}

Arg Plan::as(int v, const memory::desc& md, const Encoding* to) {
  Encoding enc;  // floats'
  if (mxamp_onednn::is_int8(md.get_data_type())) {
    if (!to && !is_int8(v)) throw std::logic_error("quantizing without a scale");
    enc = to ? *to : vals_[v].enc;
  }
  if (vals_[v].md == md && vals_[v].enc == enc) return {vals_[v].buf, md};
  for (int c : vals_[v].copies)
    if (vals_[c].md == md && vals_[c].enc == enc) return {vals_[c].buf, md};
  // Quantizing into another layout quantizes in v's own layout first (a
  // copy later readers share), then moves the bytes: oneDNN's one reorder
  // doing both takes up to twice as long (f32 nchw to s8 nhwc, 1x3x224x224:
  // 125 against 64 us; 1x64x56x56: 172 against 86 us).
  Arg from{vals_[v].buf, vals_[v].md};
  Encoding from_enc = vals_[v].enc;
  memory::desc in_place = retyped(vals_[v].md, md.get_data_type());
  if (mxamp_onednn::is_int8(md.get_data_type()) &&
      !mxamp_onednn::is_int8(vals_[v].md.get_data_type()) &&
      vals_[v].md.get_inner_nblks() == 0 && in_place != md) {
    from = as(v, in_place, enc);
    from_enc = enc;
  }
  int b = new_buffer(md);
  vals_.push_back({b, md, vals_[v].dims, enc});
  vals_[v].copies.push_back(static_cast<int>(vals_.size()) - 1);
  add_reorder(from, {b, md}, from_enc, enc);
  return {b, md};
}

Arg Plan::view(int v, const Dims& dims) {
  memory::data_type dt = vals_[v].md.get_data_type();
  auto dense = as(v, plain(vals_[v].md.get_dims(), dt));
  return {dense.first, plain(dims, dt)};
}

Arg Plan::computed(int v, memory::data_type dt) {
  if (vals_[v].md.get_data_type() == dt) return {vals_[v].buf, vals_[v].md};
  return as(v, plain(vals_[v].md.get_dims(), dt));
}

Arg Plan::dense(int v, memory::data_type dt) {
  auto d = as(v, plain(vals_[v].md.get_dims(), dt));
  return {d.first, plain(vals_[v].dims, dt)};
}

memory::data_type Plan::dt(const Node* n) const {
  if (keeps_float(n)) return rest();
  const Row* row = row_of(n);  // none for a weight's dequantization
  return row && row->f32_in_bf16 && !int8() && dt() == kBF16 ? kF32 : dt();
}

memory::data_type Plan::float_out(Entry e, memory::data_type computed) const {
  for (const Node* r : readers_.of(e)) {
    // The region's outputs are float32: a float32 value is written so.
    if (!r && computed == kF32) return kF32;
    if (!r || keeps_float(r)) return rest();
    if (dt(r) == kF32) return kF32;
    const Row* row = row_of(r);
    if (!row || !row->passes_data_on()) continue;
    for (size_t k = 0; k < r->inputs.size(); ++k) {
      if (input(r, k) != e) continue;
      // r passes e on: written as r's readers ask
      memory::data_type through = float_out(passed_to(r, k), computed);
      if (through != computed) return through;
    }
  }
  return computed;
}

// ---- INT8

Range Plan::range_of(Entry e) {
  if (!int8()) return {};
  Entry s = source(e);
  if (!is_variable(s.first)) return source_range(s);
  size_t i = static_cast<size_t>(vals_[value_of(s)].input);
  return i < input_ranges_.size() ? input_ranges_[i] : Range();
}

// Whether node n reads entry e as INT8 (by its row's INT8 role). Operators
// that quantize their data do, in a data input; the narrowest do where
// oneDNN stores no bfloat16; post-ops do where their family computes them
// on INT8 (Family::computes_int8); the other INT8 operators, those that
// compute nothing and post-ops fused into their producer pass INT8 on: they
// take it when their output is read as INT8, else they compute in float
// and requantizing before them only adds error.
bool Plan::takes_int8(const Node* n, Entry e) {
  const Row* row = row_of(n);
  if (keeps_float(n)) return false;
  if (row->post_op && row->int8 == Int8Role::kFloat)
    return computes_int8(this, n) || (fused_activation(n, e) && int8_readers({n, 0}));
  if (row->int8 == Int8Role::kFloat) return false;
  if (row->int8 == Int8Role::kNarrowest) return narrow_int8() && input(n, 0) == e;
  if (row->int8 == Int8Role::kQuantizes) {
    for (size_t k = 0; k < n->inputs.size(); ++k)
      if (input(n, k) == e && !row->is_param(static_cast<int>(k))) return true;
    return false;
  }
  for (size_t k = 0; k < n->inputs.size(); ++k)
    if (input(n, k) == e && !int8_readers(passed_to(n, k))) return false;
  return true;
}

bool Plan::zero_point_readers(Entry e, const std::function<bool(const Node*, Entry)>& reads) {
  const std::vector<const Node*>& readers = readers_.of(e);
  for (const Node* n : readers) {
    if (!n) return false;  // the region's output
    if (passes_zero_point(n)) {
      for (size_t k = 0; k < n->inputs.size(); ++k)
        if (input(n, k) == e && !zero_point_readers(passed_to(n, k), reads)) return false;
    } else if (!reads(n, e)) {
      return false;
    }
  }
  return !readers.empty();
}

bool Plan::fused_activation(const Node* n, Entry e) {
  Entry s = source(e);
  const Row* producer = row_of(s.first);
  return s.second == 0 && readers_.sole(s) == n && producer && producer->takes_post_ops;
}

// Memoized: paths through adds can be many.
bool Plan::int8_readers(Entry e) {
  auto known = int8_readers_.find(e);
  if (known != int8_readers_.end()) return known->second;
  bool any = false, all = true;
  for (const Node* r : readers_.of(e)) {
    if (!r) continue;
    any = true;
    all = all && takes_int8(r, e);
  }
  return int8_readers_[e] = any && all;
}

}  // namespace mxamp_onednn
