// A region: planning (build) and execution (Forward).
#include "region.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "engine.h"
#include "table.h"

namespace mxamp_onednn {

Region::Region(Graph* graph, memory::data_type compute, std::vector<Range> input_ranges,
               memory::data_type rest)
    : graph_(graph),
      compute_(compute),
      rest_(compute == kS8 ? rest : compute),
      dt_(compute == kS8 && cpu_stores_bf16() ? kBF16 : rest_),
      int8_(compute == kS8),
      input_ranges_(std::move(input_ranges)) {}

Region::~Region() { delete graph_; }

MXReturnValue Region::Forward(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                              const OpResource&) {
  try {
    if (stale(*inputs)) build(*inputs, *outputs);
    for (auto& m : in_mems_) m.first.set_data_handle(inputs->at(m.second).data_ptr);
    for (auto& m : out_mems_) m.first.set_data_handle(outputs->at(m.second).data_ptr);
    for (auto& s : run_) s.first.execute(stream_, s.second);
    stream_.wait();
    return MX_SUCCESS;
  } catch (const dnnl::error& e) {
    MX_ERROR_MSG << "mxamp_onednn region failed in oneDNN: " << e.what() << " (status "
                 << e.status << ")";
  } catch (const std::exception& e) {
    MX_ERROR_MSG << "mxamp_onednn region failed: " << e.what();
  }
  built_ = false;
  return MX_FAIL;
}

namespace {
// Region inputs are float32, or int8 for s8 weights (linear.cc).
size_t bytes(const MXTensor& t) { return t.size() * (t.dtype == kInt8 ? 1 : sizeof(float)); }
const char* data(const MXTensor& t) { return static_cast<const char*>(t.data_ptr); }

// Per input, the first input that is the same tensor (the same data,
// type and shape), or itself. MXNet gives a region one input per edge, so
// q, k and v reading one tensor are three inputs; read as one value, it is
// converted once for all of them.
std::vector<size_t> same_tensors(const std::vector<MXTensor>& ins) {
  std::map<std::tuple<const char*, int, std::vector<int64_t>>, size_t> first;
  std::vector<size_t> same(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) {
    const MXTensor& t = ins[i];
    auto key = std::make_tuple(data(t), static_cast<int>(t.dtype), t.shape);
    same[i] = t.data_ptr ? first.emplace(key, i).first->second : i;
  }
  return same;
}
}  // namespace

// The plan depends on input shapes and on parameter contents (packed). A
// parameter's version tells when it was written, but MXNet also bumps the
// version of auxiliary states (BatchNorm statistics) on every call, so a
// parameter seen moving is kept as a copy and compared by content.
bool Region::stale(const std::vector<MXTensor>& ins) {
  if (!built_) return true;
  for (size_t i = 0; i < ins.size(); ++i)
    if (ins[i].shape != in_shapes_[i]) return true;
  if (regrouped(ins)) return true;
  bool changed = false;
  for (auto& p : param_versions_) {
    const MXTensor& t = ins[p.first];
    if (t.verID == p.second) continue;
    auto copy = param_copies_.find(p.first);
    if (copy != param_copies_.end() && copy->second.size() == bytes(t) &&
        std::equal(copy->second.begin(), copy->second.end(), data(t))) {
      p.second = t.verID;
      continue;
    }
    param_copies_[p.first].clear();  // copied by build()
    changed = true;
  }
  return changed;
}

// Whether the inputs that are one tensor (read once by the plan) changed.
// Checked by their data pointers first: same_tensors' map on every call
// would cost hundreds of allocations where parameters are inputs.
bool Region::regrouped(const std::vector<MXTensor>& ins) {
  bool moved = false;
  for (size_t i = 0; i < ins.size() && !moved; ++i) moved = ins[i].data_ptr != in_ptrs_[i];
  if (!moved) return false;
  if (same_tensors(ins) != same_) return true;
  for (size_t i = 0; i < ins.size(); ++i) in_ptrs_[i] = ins[i].data_ptr;
  return false;
}

void Region::build(const std::vector<MXTensor>& ins, const std::vector<MXTensor>& outs) {
  plan(ins);
  add_outputs(outs);
  materialize();
  remember(ins);
  built_ = true;
}

void Region::plan(const std::vector<MXTensor>& ins) {
  memory::data_type missing = !cpu_supports(compute_) ? compute_ : rest_;
  if (!cpu_supports(missing))
    throw std::runtime_error(
        missing == kS8
            ? "this region computes in INT8 but oneDNN has no INT8 kernels for this CPU (or "
              "ONEDNN_MAX_CPU_ISA); apply the backend to the model without regions on this "
              "machine"
            : std::string(int8_ ? "this INT8 region computes what is not INT8 in bfloat16 "
                                  "(rest_dtype)"
                                : "this region computes in bfloat16") +
                  " but the CPU (or ONEDNN_MAX_CPU_ISA) offers no AVX512-BF16/AMX; apply the "
                  "backend to the model without regions on this machine");
  for (const MXTensor& t : ins)
    if (t.dtype != kFloat32 && t.dtype != kInt8)
      throw std::runtime_error("region inputs must be float32 (int8: s8 weights)");
  reset(ins);
  add_inputs(ins);
  for (size_t i = 0; i < graph_->size(); ++i) {  // JSON order is topological
    const Node* n = graph_->getNode(i);
    if (!is_variable(n) && !done_.count(n) && !dequantizes(n)) add_node(n);
  }
}

void Region::reset(const std::vector<MXTensor>& ins) {
  steps_.clear(); bufs_.clear(); vals_.clear(); entry_.clear(); done_.clear();
  int8_readers_.clear(); param_versions_.clear();
  in_mems_.clear(); out_mems_.clear(); run_.clear(); storage_.clear();
  ins_ = &ins;
  readers_.reset(new Readers(graph_));
  stream_ = dnnl::stream(cpu_engine());
}

void Region::add_inputs(const std::vector<MXTensor>& ins) {
  same_ = same_tensors(ins);
  in_ptrs_.clear();
  for (const MXTensor& t : ins) in_ptrs_.push_back(t.data_ptr);
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

void Region::add_outputs(const std::vector<MXTensor>& outs) {
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

void Region::add_node(const Node* n) {
  const Row* row = row_of(n);
  if (!row || !row->family->supported(n, row->variant))
    throw std::runtime_error("operator " + n->op + " (" + n->name + ") is not supported");
  row->family->add(this, n, row->variant);
}

// What the plan was made for: input shapes and parameter versions (and
// contents, for parameters whose version moves).
void Region::remember(const std::vector<MXTensor>& ins) {
  in_shapes_.clear();
  for (const MXTensor& t : ins) in_shapes_.push_back(t.shape);
  for (auto& p : param_versions_) p.second = ins[p.first].verID;
  for (auto& c : param_copies_) {
    const MXTensor& t = ins[c.first];
    c.second.assign(data(t), data(t) + bytes(t));
  }
  ins_ = nullptr;
}

// The storage slot of each internal buffer, by lifetime: a slot freed by
// earlier steps is reused (the smallest that fits, else one grown).
std::vector<int> Region::assign_slots() {
  std::vector<int> order;
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (bufs_[i].input < 0 && bufs_[i].output < 0 && bufs_[i].first >= 0) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return bufs_[a].first < bufs_[b].first; });
  std::vector<int> slot(bufs_.size(), -1), free_after;
  std::vector<size_t> size;
  for (int b : order) {
    int best = -1;
    for (size_t s = 0; s < size.size(); ++s)
      if (free_after[s] < bufs_[b].first && (best < 0 || size[s] < size[best]) &&
          size[s] >= bufs_[b].size)
        best = static_cast<int>(s);
    for (size_t s = 0; best < 0 && s < size.size(); ++s)  // grow a free slot instead
      if (free_after[s] < bufs_[b].first) best = static_cast<int>(s);
    if (best < 0) {
      best = static_cast<int>(size.size());
      size.push_back(0);
      free_after.push_back(-1);
    }
    size[best] = std::max(size[best], bufs_[b].size);
    free_after[best] = bufs_[b].last;
    slot[b] = best;
  }
  for (size_t s : size) storage_.emplace_back(new char[s + 64]);
  return slot;
}

// Turns every step's arguments into memory objects on the assigned storage
// (region inputs and outputs get their tensors' pointers on each call).
void Region::materialize() {
  std::vector<int> slot = assign_slots();
  auto ptr = [&](int s) {
    auto p = reinterpret_cast<uintptr_t>(storage_[s].get());
    return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
  };
  for (Step& s : steps_) {
    std::unordered_map<int, memory> args = s.fixed;
    for (auto& a : s.args) {
      const Buffer& b = bufs_[a.second.first];
      bool external = b.input >= 0 || b.output >= 0;
      memory m(a.second.second, cpu_engine(), external ? nullptr : ptr(slot[a.second.first]));
      if (b.input >= 0) in_mems_.push_back({m, b.input});
      if (b.output >= 0) out_mems_.push_back({m, b.output});
      args[a.first] = m;
    }
    run_.push_back({s.prim, std::move(args)});
  }
  steps_.clear();
}

}  // namespace mxamp_onednn
