// A region's plan interface: values and buffers, reorders, parameters and
// the INT8 questions the operator families ask.
#include <algorithm>

#include "engine.h"
#include "fusion.h"
#include "region.h"
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

// ---- values and buffers

int Region::new_buffer(const memory::desc& md) {
  bufs_.push_back(Buffer());
  bufs_.back().size = md.get_size();
  return static_cast<int>(bufs_.size()) - 1;
}

int Region::new_value(int buf, const memory::desc& md, const Dims& dims, Entry e, Encoding enc) {
  vals_.push_back({buf, md, dims, enc});
  int v = static_cast<int>(vals_.size()) - 1;
  bind(e, v);
  return v;
}

void Region::bind(Entry e, int v) {
  entry_[e] = v;
  vals_[v].uses += static_cast<int>(readers_->of(e).size());
}

int Region::value_of(Entry e) {
  auto it = entry_.find(e);
  if (it == entry_.end()) throw std::runtime_error("no value for an input of node " + e.first->name);
  return it->second;
}

std::vector<Entry> Region::entries_of(int v) const {
  std::vector<Entry> entries;
  for (const auto& e : entry_)
    if (e.second == v) entries.push_back(e.first);
  return entries;
}

void Region::consume(Entry e) { vals_[value_of(e)].uses--; }

void Region::fused(const Node* n) { done_.insert(n); }

bool Region::shared(int v) const {
  for (size_t i = 0; i < vals_.size(); ++i)
    if (static_cast<int>(i) != v && vals_[i].buf == vals_[v].buf && vals_[i].uses > 0) return true;
  return false;
}

bool Region::writable(int v) const {
  return vals_[v].uses == 1 && bufs_[vals_[v].buf].input < 0 && !shared(v);
}

void Region::add_step(const dnnl::primitive& p, std::vector<std::pair<int, Arg>> args,
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

void Region::add_step(OwnKernel call, std::string log, std::vector<std::pair<int, Arg>> args) {
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

void Region::uses(const std::vector<std::pair<int, Arg>>& args) {
  int s = static_cast<int>(steps_.size());
  for (auto& a : args) {
    Buffer& b = bufs_[a.second.first];
    if (b.first < 0) b.first = s;
    b.last = s;
  }
}

// A reorder step from one encoding to another; equal encodings need no
// attributes (the integers are copied as they are).
void Region::add_reorder(Arg from, Arg to, Encoding from_enc, Encoding to_enc) {
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

Arg Region::as(int v, const memory::desc& md, const Encoding* to) {
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

Arg Region::view(int v, const Dims& dims) {
  memory::data_type dt = vals_[v].md.get_data_type();
  auto dense = as(v, plain(vals_[v].md.get_dims(), dt));
  return {dense.first, plain(dims, dt)};
}

Arg Region::computed(int v, memory::data_type dt) {
  if (vals_[v].md.get_data_type() == dt) return {vals_[v].buf, vals_[v].md};
  return as(v, plain(vals_[v].md.get_dims(), dt));
}

Arg Region::dense(int v, memory::data_type dt) {
  auto d = as(v, plain(vals_[v].md.get_dims(), dt));
  return {d.first, plain(vals_[v].dims, dt)};
}

memory::data_type Region::float_out(Entry e, memory::data_type computed) const {
  for (const Node* r : readers_->of(e)) {
    if (!r || keeps_float(r)) return rest_;
    const Row* row = row_of(r);  // none for a weight's dequantization
    if (row && row->int8 == Int8Role::kNone && float_out({r, 0}, computed) != computed)
      return rest_;  // read through a view or a cast
  }
  return computed;
}

// ---- parameters

const MXTensor& Region::param_tensor(const NodeEntry& e) {
  int i = vals_[value_of({e.node, e.entry})].input;
  if (i < 0) throw std::runtime_error("parameter " + e.node->name + " is computed inside the region");
  return ins_->at(i);
}

namespace {

// The rows of p that the _split_v2 output `piece` cuts (along axis 0).
Param cut(Param p, const NodeEntry& piece) {
  const Node* split = piece.node;
  Dims at = ints(split, "indices");
  size_t k = static_cast<size_t>(piece.entry);
  int64_t rows = p.shape.empty() ? 0 : p.shape[0];
  int64_t end = k + 1 < at.size() ? at[k + 1] : rows;
  if (rows <= 0 || number(split, "axis", 1) != 0 || flag(split, "squeeze_axis", false) ||
      k >= at.size() || at[k] < 0 || at[k] > end || end > rows)
    throw std::runtime_error("parameter " + split->name +
                             " must cut its input along axis 0 by in-range `indices`, without"
                             " squeeze_axis (got axis=" + text(split, "axis", "1") +
                             ", indices=" + text(split, "indices", "none") + ")");
  size_t row = static_cast<size_t>(p.size() / rows) * (p.dtype == kInt8 ? 1 : sizeof(float));
  p.data = static_cast<const char*>(p.data) + at[k] * row;
  p.shape[0] = end - at[k];
  return p;
}

}  // namespace

// A parameter is a region input, or rows of one (along axis 0) that
// _split_v2s cut: mxamp's quantization packs a region's s8 weights of one
// row shape, its weight scales of one rank (cut into the row shapes' packs)
// and its folded biases so (fewer inputs and nodes: MXNet spends time on
// each on every call).
Param Region::param_of(const NodeEntry& e, const NodeEntry* piece) {
  Param p;
  if (cuts_pack(e.node)) {
    p = cut(param_of(e.node->inputs[0]), e);
  } else {
    const MXTensor& t = param_tensor(e);
    param_versions_[static_cast<int>(&t - ins_->data())] = t.verID;
    p = {t.data_ptr, t.shape, t.dtype};
  }
  return piece ? cut(p, *piece) : p;
}

const float* Region::param(const NodeEntry& e, size_t expect, const NodeEntry* piece) {
  Param p = param_of(e, piece);
  // A packed piece is named by its _split_v2 and its output.
  const NodeEntry& named = piece ? *piece : e;
  std::string name = named.node->name;
  if (!named.node->inputs.empty()) name += "[" + std::to_string(named.entry) + "]";
  if (p.dtype != kFloat32)
    throw std::runtime_error("parameter " + name + " is not float32; expected " +
                             std::to_string(expect) + " float32 elements");
  if (static_cast<size_t>(p.size()) != expect)
    throw std::runtime_error("parameter " + name + " has " + std::to_string(p.size()) +
                             " elements, expected " + std::to_string(expect) + " float32");
  return static_cast<const float*>(p.data);
}

memory Region::pack(const float* data, const Dims& dims, const memory::desc& md,
                    const std::vector<float>& scale, int mask) {
  memory src(plain(dims, kF32), cpu_engine(), const_cast<float*>(data));
  memory dst(md, cpu_engine());
  dnnl::primitive_attr attr;
  std::unordered_map<int, memory> args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  if (!scale.empty()) {
    attr.set_scales_mask(DNNL_ARG_DST, mask);
    args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales(scale);
  }
  dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src.get_desc(), cpu_engine(), md, attr))
      .execute(stream_, args);
  stream_.wait();
  return dst;
}

// ---- INT8

Range Region::range_of(Entry e) {
  if (!int8_) return {};
  Entry s = source(e);
  if (!is_variable(s.first)) return source_range(s);
  size_t i = static_cast<size_t>(vals_[value_of(s)].input);
  return i < input_ranges_.size() ? input_ranges_[i] : Range();
}

// Whether node n reads entry e as INT8. Operators that quantize their data
// (weighted layers, batch_dot) do, in a data input; LayerNorm does where
// oneDNN stores no bfloat16 (its narrowest type); the other INT8
// operators, casts, views and activations fused as post-ops pass INT8 on:
// they take it when their output is read as INT8, else they compute in
// float and requantizing before them only adds error.
bool Region::takes_int8(const Node* n, Entry e) {
  const Row* row = row_of(n);
  if (keeps_float(n)) return false;
  if (row->post_op && row->int8 == Int8Role::kFloat)
    return table_activation(this, n) || (fused_activation(n, e) && int8_readers({n, 0}));
  if (row->int8 == Int8Role::kFloat) return false;
  if (row->int8 == Int8Role::kNarrowest) return narrow_int8() && input(n, 0) == e;
  if (row->int8 == Int8Role::kQuantizes) {
    for (size_t k = 0; k < n->inputs.size(); ++k)
      if (input(n, k) == e && !row->is_param(static_cast<int>(k))) return true;
    return false;
  }
  for (size_t k = 0; k < n->inputs.size(); ++k) {  // a multicast has one output per input
    Entry out{n, is(n, kCasts, kMulticast) ? static_cast<int>(k) : 0};
    if (input(n, k) == e && !int8_readers(out)) return false;
  }
  return true;
}

bool Region::zero_point_readers(Entry e,
                                const std::function<bool(const Node*, Entry)>& reads) {
  const std::vector<const Node*>& readers = readers_->of(e);
  for (const Node* n : readers) {
    if (!n) return false;  // the region's output
    if (is(n, kCasts)) {
      for (size_t k = 0; k < n->inputs.size(); ++k) {  // a multicast has one output per input
        Entry out{n, is(n, kCasts, kMulticast) ? static_cast<int>(k) : 0};
        if (input(n, k) == e && !zero_point_readers(out, reads)) return false;
      }
    } else if (is(n, kViews) || (is(n, kPooling) && !keeps_float(n) && pools_zero_point(n))) {
      if (!zero_point_readers({n, 0}, reads)) return false;
    } else if (!reads(n, e)) {
      return false;
    }
  }
  return !readers.empty();
}

bool Region::fused_activation(const Node* n, Entry e) {
  Entry s = source(e);
  const Row* producer = row_of(s.first);
  return s.second == 0 && readers_->sole(s) == n && producer && producer->takes_post_ops;
}

// Memoized: paths through adds can be many.
bool Region::int8_readers(Entry e) {
  auto known = int8_readers_.find(e);
  if (known != int8_readers_.end()) return known->second;
  bool any = false, all = true;
  for (const Node* r : readers_->of(e)) {
    if (!r) continue;
    any = true;
    all = all && takes_int8(r, e);
  }
  return int8_readers_[e] = any && all;
}

}  // namespace mxamp_onednn
