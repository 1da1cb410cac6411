// mxamp's oneDNN 3 execution backend: an MXNet 1.9.1 extension library.
//
// The partitioner "mxamp_onednn" groups supported operators into regions; each
// region becomes one "_mxamp_onednn_region" node whose stateful operator runs
// the region as a chain of oneDNN primitives in bfloat16: weights are packed
// once (BatchNorm folded in), activations stay in oneDNN's blocked layouts,
// bias / residual add / activation are post-ops, and float32 <-> bfloat16
// reorders happen only at the region's inputs and outputs.
//
// Region inputs and outputs are always float32: lib_api 1.9.1 has no bfloat16
// tensor type, so mxamp.onednn puts amp_cast nodes at region edges where the
// surrounding graph holds bfloat16.
//
// The partitioner option "compute" (bfloat16 by default, or float32) sets the
// data type the regions compute in; float32 runs the same chains on any x86
// CPU oneDNN supports, so regions can be checked tightly against MXNet there.
#include <dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mxnet/lib_api.h"

using namespace mxnet::ext;  // NOLINT

namespace {

using dnnl::memory;
using Dims = std::vector<int64_t>;
using Attrs = std::unordered_map<std::string, std::string>;
using Entry = std::pair<const Node*, int>;

constexpr const char* kRegionOp = "_mxamp_onednn_region";

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// bfloat16 dot products in hardware (AVX512-BF16 or AMX); oneDNN honours
// ONEDNN_MAX_CPU_ISA, so a capped ISA turns the backend off.
bool cpu_has_bf16() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_fp16:
    case dnnl::cpu_isa::avx512_core_amx:
    case dnnl::cpu_isa::avx512_core_amx_fp16:
      return true;
    default:
      return false;
  }
}

// The compute data type named by the partitioner option "compute".
memory::data_type compute_type(const Attrs& options) {
  auto it = options.find("compute");
  if (it == options.end() || it->second == "bfloat16") return memory::data_type::bf16;
  if (it->second == "float32") return memory::data_type::f32;
  throw std::invalid_argument("option compute must be bfloat16 or float32, got '" + it->second +
                              "'");
}

// ---------------------------------------------------------------- attributes

std::string attr(const Node* n, const std::string& key, const std::string& fallback = "") {
  auto it = n->attrs.find(key);
  return it == n->attrs.end() ? fallback : it->second;
}

bool flag(const Node* n, const std::string& key, bool fallback) {
  std::string v = attr(n, key);
  if (v.empty()) return fallback;
  return v == "True" || v == "true" || v == "1";
}

// All integers in an MXNet tuple attribute such as "(3, 3)" or "[1,2]".
Dims ints(const std::string& s) {
  Dims out;
  size_t i = 0;
  while (i < s.size()) {
    if (isdigit(s[i]) || (s[i] == '-' && i + 1 < s.size() && isdigit(s[i + 1]))) {
      size_t end;
      out.push_back(std::stoll(s.substr(i), &end));
      i += end;
    } else {
      ++i;
    }
  }
  return out;
}

double number(const Node* n, const std::string& key, double fallback) {
  std::string v = attr(n, key);
  return v.empty() || v == "None" ? fallback : std::stod(v);
}

// -------------------------------------------------------- supported operators

struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
};

// The oneDNN eltwise for an activation node, if it is one we run.
bool eltwise_of(const Node* n, Eltwise* e) {
  const std::string act = attr(n, "act_type");
  if (n->op == "Activation") {
    if (act == "relu") *e = {dnnl::algorithm::eltwise_relu};
    else if (act == "sigmoid") *e = {dnnl::algorithm::eltwise_logistic};
    else if (act == "tanh") *e = {dnnl::algorithm::eltwise_tanh};
    else if (act == "softrelu") *e = {dnnl::algorithm::eltwise_soft_relu, 1.f};
    else return false;
    return true;
  }
  if (n->op == "LeakyReLU") {
    if (act == "gelu") *e = {dnnl::algorithm::eltwise_gelu_erf};
    else if (act == "leaky" || act.empty())
      *e = {dnnl::algorithm::eltwise_relu, static_cast<float>(number(n, "slope", 0.25))};
    else return false;
    return true;
  }
  if (n->op == "_mul_scalar" || n->op == "_div_scalar") {
    double scalar = number(n, "scalar", 1);
    if (n->op == "_div_scalar" && scalar == 0) return false;
    *e = {dnnl::algorithm::eltwise_linear,
          static_cast<float>(n->op == "_mul_scalar" ? scalar : 1 / scalar), 0.f};
    return true;
  }
  if (n->op == "clip") {
    *e = {dnnl::algorithm::eltwise_clip, static_cast<float>(number(n, "a_min", 0)),
          static_cast<float>(number(n, "a_max", 0))};
    return true;
  }
  return false;
}

bool is_cast(const Node* n) { return n->op == "amp_cast" || n->op == "amp_multicast"; }
bool is_add(const Node* n) {
  return n->op == "elemwise_add" || n->op == "_Plus" || n->op == "_plus";
}
bool layout_nchw(const Node* n) {
  std::string l = attr(n, "layout", "None");
  return l == "None" || l == "NCHW";
}

// Whether the node, taken alone, is an operator configuration this backend
// runs. BatchNorm additionally needs a convolution to fold into (foldable).
bool supported(const Node* n) {
  Eltwise e;
  if (is_cast(n) || is_add(n) || n->op == "Flatten" || eltwise_of(n, &e)) return true;
  // Reshape with plain sizes, 0 (keep) and -1 (infer); transpose with axes.
  if (n->op == "Reshape") {
    Dims shape = ints(attr(n, "shape"));
    return !flag(n, "reverse", false) && !shape.empty() &&
           std::all_of(shape.begin(), shape.end(), [](int64_t x) { return x >= -1; });
  }
  if (n->op == "transpose") return !ints(attr(n, "axes")).empty();
  if (n->op == "Convolution")
    return ints(attr(n, "kernel")).size() == 2 && layout_nchw(n);
  if (n->op == "FullyConnected" || n->op == "batch_dot") return true;
  // Normalised over the last axis only (what oneDNN runs), no extras.
  if (n->op == "softmax")
    return attr(n, "axis", "-1") == "-1" && !flag(n, "use_length", false) &&
           number(n, "temperature", 1) == 1;
  if (n->op == "LayerNorm")
    return attr(n, "axis", "-1") == "-1" && !flag(n, "output_mean_var", false);
  if (n->op == "BatchNorm") {
    std::string axis = attr(n, "axis", "1");
    return axis == "1" && !flag(n, "output_mean_var", false);
  }
  if (n->op == "Pooling") {
    std::string type = attr(n, "pool_type", "max");
    std::string conv = attr(n, "pooling_convention", "valid");
    bool global = flag(n, "global_pool", false);
    return (type == "max" || type == "avg") && layout_nchw(n) &&
           (conv == "valid" || conv == "full") &&
           (global || ints(attr(n, "kernel")).size() == 2);
  }
  return false;
}

// Operators conversion keeps in float32 for accuracy that oneDNN computes in
// float32 internally from bfloat16 data (only the output is rounded).
bool f32_inside(const Node* n) { return n->op == "softmax" || n->op == "LayerNorm"; }

bool computes(const Node* n) {
  return !is_cast(n) && n->op != "Flatten" && n->op != "Reshape";
}

// Who reads each output of each node of a graph (graph outputs count as a
// reader without a node).
class Readers {
 public:
  explicit Readers(const Graph* g) {
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* n = g->getNode(i);
      for (const NodeEntry& in : n->inputs) readers_[{in.node, in.entry}].push_back(n);
    }
    for (const NodeEntry& out : g->outputs) readers_[{out.node, out.entry}].push_back(nullptr);
  }
  const std::vector<const Node*>& of(Entry e) const {
    static const std::vector<const Node*> none;
    auto it = readers_.find(e);
    return it == readers_.end() ? none : it->second;
  }
  // The single node reading `e`, looking through casts; nullptr if the value
  // is read more than once or is a graph output. `passed` gets the casts.
  const Node* sole(Entry e, std::vector<const Node*>* passed = nullptr) const {
    for (;;) {
      const auto& r = of(e);
      if (r.size() != 1 || r[0] == nullptr) return nullptr;
      if (r[0]->op != "amp_cast") return r[0];
      if (passed) passed->push_back(r[0]);
      e = {r[0], 0};
    }
  }

 private:
  std::map<Entry, std::vector<const Node*>> readers_;
};

// The node producing `e`, looking through casts.
const Node* producer(Entry e) {
  const Node* n = e.first;
  while (n->op == "amp_cast") n = n->inputs[0].node;
  return n;
}

// A BatchNorm folds into the convolution before it when it is that
// convolution's only reader and only its output 0 is read.
bool foldable(const Node* bn, const Readers& readers) {
  const Node* conv = producer({bn->inputs[0].node, bn->inputs[0].entry});
  return conv->op == "Convolution" && readers.sole({conv, 0}) == bn &&
         readers.of({bn, 1}).empty() && readers.of({bn, 2}).empty();
}

// A region is worth running when it computes something, and can run when
// each BatchNorm folds into a convolution of the region.
bool review_region(const Graph* g) {
  Readers readers(g);
  bool any_compute = false;
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    if (n->op == "null") continue;
    any_compute |= computes(n);
    if (n->op == "BatchNorm" && !foldable(n, readers)) return false;
  }
  return any_compute;
}

// ------------------------------------------------------------ the partitioner

class Selector : public CustomOpSelector {
 public:
  Selector(const Graph* g, const Attrs& options) : ok_(g->size(), false) {
    if (compute_type(options) == memory::data_type::bf16 && !cpu_has_bf16()) return;
    // With a converted model (option bf16_nodes given), only nodes the
    // conversion put in bfloat16 are offloaded (plus casts); a float32 model
    // is offloaded whole.
    std::set<std::string> bf16_nodes;
    auto it = options.find("bf16_nodes");
    bool converted = it != options.end();
    if (converted) {
      size_t start = 0;
      const std::string& s = it->second;
      while (start < s.size()) {
        size_t end = s.find(',', start);
        if (end == std::string::npos) end = s.size();
        bf16_nodes.insert(s.substr(start, end - start));
        start = end + 1;
      }
    }
    std::map<const Node*, size_t> index;
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* n = g->getNode(i);
      index[n] = i;
      if (n->op == "null" || !supported(n)) continue;
      ok_[i] = !converted || is_cast(n) || bf16_nodes.count(n->name) || f32_inside(n);
    }
    // A BatchNorm goes only with the convolution it folds into.
    Readers readers(g);
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* n = g->getNode(i);
      if (ok_[i] && n->op == "BatchNorm")
        ok_[i] = foldable(n, readers) &&
                 ok_[index[producer({n->inputs[0].node, n->inputs[0].entry})]];
    }
  }
  bool Select(int id) override { return ok_[id]; }
  bool SelectInput(int, int in) override { return ok_[in]; }
  bool SelectOutput(int, int out) override { return ok_[out]; }

 private:
  std::vector<bool> ok_;
};

MXReturnValue create_selector(const Graph* g, CustomOpSelector** sel, const Attrs& options) {
  try {
    *sel = new Selector(g, options);
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    MX_ERROR_MSG << "mxamp_onednn: selecting nodes failed: " << e.what();
    return MX_FAIL;
  }
}

// The region node records its compute type, so a saved model keeps it.
MXReturnValue review_subgraph(const Graph* g, int, bool* accept, const Attrs& options,
                              Attrs* node_attrs) {
  *accept = review_region(g);
  (*node_attrs)["compute"] = compute_type(options) == memory::data_type::f32 ? "float32"
                                                                             : "bfloat16";
  return MX_SUCCESS;
}

// ------------------------------------------------------------- the executor

memory::format_tag plain_tag(size_t ndims) {
  using tag = memory::format_tag;
  static const tag tags[] = {tag::undef, tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde};
  if (ndims == 0 || ndims > 5) throw std::runtime_error("unsupported rank " + std::to_string(ndims));
  return tags[ndims];
}

memory::desc plain(const Dims& dims, memory::data_type dt) {
  return memory::desc(dims, dt, plain_tag(dims.size()));
}

const auto kF32 = memory::data_type::f32;

// One oneDNN primitive call. Arguments refer to buffers by id; they become
// memory objects once all steps are known and buffers are assigned.
struct Step {
  dnnl::primitive prim;
  std::vector<std::pair<int, std::pair<int, memory::desc>>> args;  // key -> (buffer, desc)
  std::unordered_map<int, memory> fixed;                             // packed weights, bias
};

// A buffer: an internal activation buffer, or a region input/output tensor.
struct Buffer {
  size_t size = 0;
  int first = -1, last = -1;     // steps using it
  int input = -1, output = -1;   // external tensor index
};

// A tensor inside the region: where it lives and its MXNet shape.
struct Value {
  int buf;
  memory::desc md;
  Dims dims;
  int uses = 0;     // reads still to come
  int input = -1;   // region input index, for parameters
  std::vector<std::pair<memory::desc, int>> copies;  // reordered versions
};

class Region : public CustomStatefulOp {
 public:
  Region(const std::string& json, memory::data_type compute)
      : graph_(Graph::fromString(json)), dt_(compute) {}
  ~Region() override { delete graph_; }

  MXReturnValue Forward(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                        const OpResource&) override {
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

 private:
  // The plan depends on input shapes and on parameter contents (packed).
  // A parameter's version tells when it was written, but MXNet also bumps
  // the version of auxiliary states (BatchNorm statistics) on every call, so
  // a parameter seen moving is kept as a copy and compared by content.
  bool stale(const std::vector<MXTensor>& ins) {
    if (!built_) return true;
    for (size_t i = 0; i < ins.size(); ++i)
      if (ins[i].shape != in_shapes_[i]) return true;
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

  static size_t bytes(const MXTensor& t) { return t.size() * sizeof(float); }
  static const char* data(const MXTensor& t) { return static_cast<const char*>(t.data_ptr); }

  void build(const std::vector<MXTensor>& ins, const std::vector<MXTensor>& outs) {
    if (dt_ == memory::data_type::bf16 && !cpu_has_bf16())
      throw std::runtime_error(
          "this region computes in bfloat16 but the CPU (or ONEDNN_MAX_CPU_ISA) offers no "
          "AVX512-BF16/AMX; apply the backend to the model without regions on this machine");
    for (const MXTensor& t : ins)
      if (t.dtype != kFloat32) throw std::runtime_error("region inputs must be float32");
    for (const MXTensor& t : outs)
      if (t.dtype != kFloat32) throw std::runtime_error("region outputs must be float32");
    steps_.clear(); bufs_.clear(); vals_.clear(); entry_.clear(); done_.clear();
    param_versions_.clear(); in_mems_.clear(); out_mems_.clear(); run_.clear(); storage_.clear();
    ins_ = &ins;
    readers_.reset(new Readers(graph_));
    stream_ = dnnl::stream(cpu_engine());

    for (size_t i = 0; i < graph_->inputs.size(); ++i) {
      Dims dims(ins[i].shape.begin(), ins[i].shape.end());
      int b = new_buffer(plain(dims, kF32));
      bufs_[b].input = static_cast<int>(i);
      int v = new_value(b, plain(dims, kF32), dims, {graph_->inputs[i], 0});
      vals_[v].input = static_cast<int>(i);
    }
    for (size_t i = 0; i < graph_->size(); ++i) {  // JSON order is topological
      const Node* n = graph_->getNode(i);
      if (n->op == "null" || done_.count(n)) continue;
      add_node(n);
    }
    for (size_t j = 0; j < graph_->outputs.size(); ++j) {
      const NodeEntry& e = graph_->outputs[j];
      int v = value_of({e.node, e.entry});
      Dims dims(outs[j].shape.begin(), outs[j].shape.end());
      int b = new_buffer(plain(dims, kF32));
      bufs_[b].output = static_cast<int>(j);
      auto src = view(v, dims);
      add_step(dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src.second, cpu_engine(),
                                                          plain(dims, kF32))),
               {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, {b, plain(dims, kF32)}}});
    }
    materialize();
    in_shapes_.clear();
    for (const MXTensor& t : ins) in_shapes_.push_back(t.shape);
    for (auto& p : param_versions_) p.second = ins[p.first].verID;
    for (auto& c : param_copies_) {
      const MXTensor& t = ins[c.first];
      c.second.assign(data(t), data(t) + bytes(t));
    }
    built_ = true;
  }

  // ---- values and buffers

  int new_buffer(const memory::desc& md) {
    bufs_.push_back(Buffer());
    bufs_.back().size = md.get_size();
    return static_cast<int>(bufs_.size()) - 1;
  }

  int new_value(int buf, const memory::desc& md, const Dims& dims, Entry e) {
    vals_.push_back({buf, md, dims});
    int v = static_cast<int>(vals_.size()) - 1;
    bind(e, v);
    return v;
  }

  // Entry `e` (and every read of it) now refers to value v.
  void bind(Entry e, int v) {
    entry_[e] = v;
    vals_[v].uses += static_cast<int>(readers_->of(e).size());
  }

  int value_of(Entry e) {
    auto it = entry_.find(e);
    if (it == entry_.end())
      throw std::runtime_error("no value for an input of node " + e.first->name);
    return it->second;
  }

  // The node reads `e` once.
  void consume(Entry e) { vals_[value_of(e)].uses--; }

  // Value v in layout md (reordered once and reused by later readers).
  std::pair<int, memory::desc> as(int v, const memory::desc& md) {
    if (vals_[v].md == md) return {vals_[v].buf, md};
    for (auto& c : vals_[v].copies)
      if (c.first == md) return {vals_[c.second].buf, md};
    int b = new_buffer(md);
    vals_.push_back({b, md, vals_[v].dims});
    int copy = static_cast<int>(vals_.size()) - 1;
    vals_[v].copies.push_back({md, copy});
    add_step(dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), vals_[v].md, cpu_engine(),
                                                        md)),
             {{DNNL_ARG_FROM, {vals_[v].buf, vals_[v].md}}, {DNNL_ARG_TO, {b, md}}});
    return {b, md};
  }

  // Value v as a dense row-major tensor of shape dims (same element count).
  std::pair<int, memory::desc> view(int v, const Dims& dims) {
    memory::data_type dt = vals_[v].md.get_data_type();
    auto dense = as(v, plain(vals_[v].md.get_dims(), dt));
    return {dense.first, plain(dims, dt)};
  }

  // Value v in the compute type with the layout oneDNN keeps it in (region
  // inputs become dense tensors of the compute type).
  std::pair<int, memory::desc> computed(int v) {
    if (vals_[v].md.get_data_type() == dt_) return {vals_[v].buf, vals_[v].md};
    return as(v, plain(vals_[v].md.get_dims(), dt_));
  }

  // Value v as a dense tensor of its MXNet shape in the compute type.
  std::pair<int, memory::desc> dense(int v) {
    auto d = as(v, plain(vals_[v].md.get_dims(), dt_));
    return {d.first, plain(vals_[v].dims, dt_)};
  }

  // The region input read as a parameter (weights, bias, BN statistics).
  const MXTensor& param_tensor(const NodeEntry& e) {
    int i = vals_[value_of({e.node, e.entry})].input;
    if (i < 0)
      throw std::runtime_error("parameter " + e.node->name + " is computed inside the region");
    return ins_->at(i);
  }

  const float* param(const NodeEntry& e, size_t expect) {
    const MXTensor& t = param_tensor(e);
    int i = static_cast<int>(&t - ins_->data());
    if (static_cast<size_t>(t.size()) != expect)
      throw std::runtime_error("parameter " + e.node->name + " has " + std::to_string(t.size()) +
                               " elements, expected " + std::to_string(expect));
    param_versions_[i] = t.verID;
    return static_cast<const float*>(t.data_ptr);
  }

  void add_step(const dnnl::primitive& p,
                std::vector<std::pair<int, std::pair<int, memory::desc>>> args,
                std::unordered_map<int, memory> fixed = {}) {
    int s = static_cast<int>(steps_.size());
    for (auto& a : args) {
      Buffer& b = bufs_[a.second.first];
      if (b.first < 0) b.first = s;
      b.last = s;
    }
    steps_.push_back({p, std::move(args), std::move(fixed)});
  }

  // Whether another live value (a view) sits in value v's buffer.
  bool shared(int v) const {
    for (size_t i = 0; i < vals_.size(); ++i)
      if (static_cast<int>(i) != v && vals_[i].buf == vals_[v].buf && vals_[i].uses > 0) return true;
    return false;
  }

  // Packs float32 host data into `md` (bf16 blocked weights or f32 bias).
  memory pack(const float* data, const Dims& dims, const memory::desc& md) {
    memory src(plain(dims, kF32), cpu_engine(), const_cast<float*>(data));
    memory dst(md, cpu_engine());
    dnnl::reorder(src, dst).execute(stream_, src, dst);
    stream_.wait();
    return dst;
  }

  // ---- operators

  void add_node(const Node* n) {
    Eltwise e;
    if (is_cast(n)) {
      // Casts vanish: every value inside the region is computed in bfloat16.
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        int v = value_of({n->inputs[i].node, n->inputs[i].entry});
        bind({n, static_cast<int>(i)}, v);
        vals_[v].uses--;
      }
    } else if (n->op == "Convolution" || n->op == "FullyConnected") {
      add_linear(n);
    } else if (n->op == "Pooling") {
      add_pooling(n);
    } else if (n->op == "softmax" || n->op == "LayerNorm") {
      add_normalisation(n);
    } else if (n->op == "batch_dot") {
      add_batch_dot(n);
    } else if (n->op == "Flatten" || n->op == "Reshape") {
      int v = value_of({n->inputs[0].node, n->inputs[0].entry});
      Dims shape = reshaped(n, vals_[v].dims);
      auto src = view(v, shape);
      new_value(src.first, src.second, shape, {n, 0});
      consume({n->inputs[0].node, n->inputs[0].entry});
    } else if (n->op == "transpose") {
      add_transpose(n);
    } else if (is_add(n)) {
      add_binary(n);
    } else if (eltwise_of(n, &e)) {
      int v = value_of({n->inputs[0].node, n->inputs[0].entry});
      auto src = computed(v);
      dnnl::eltwise_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference,
                                               e.alg, src.second, src.second, e.alpha, e.beta);
      int b = new_buffer(pd.dst_desc());
      new_value(b, pd.dst_desc(), vals_[v].dims, {n, 0});
      add_step(dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {b, pd.dst_desc()}}});
      consume({n->inputs[0].node, n->inputs[0].entry});
    } else {
      throw std::runtime_error("operator " + n->op + " (" + n->name + ") is not supported");
    }
  }

  void add_binary(const Node* n) {
    Entry a{n->inputs[0].node, n->inputs[0].entry}, b{n->inputs[1].node, n->inputs[1].entry};
    int va = value_of(a), vb = value_of(b);
    if (vals_[va].dims != vals_[vb].dims)
      throw std::runtime_error("add of different shapes in " + n->name);
    // Operands kept as 2-d views (FullyConnected outputs) are read as dense
    // tensors of the MXNet shape.
    auto src0 = vals_[va].md.get_dims() == vals_[va].dims ? computed(va) : dense(va);
    auto src1 = vals_[vb].md.get_dims() == vals_[vb].dims ? as(vb, src0.second) : dense(vb);
    dnnl::binary::primitive_desc pd(cpu_engine(), dnnl::algorithm::binary_add, src0.second,
                                    src1.second, src0.second);
    int out = new_buffer(pd.dst_desc());
    new_value(out, pd.dst_desc(), vals_[va].dims, {n, 0});
    add_step(dnnl::binary(pd), {{DNNL_ARG_SRC_0, src0}, {DNNL_ARG_SRC_1, src1},
                                {DNNL_ARG_DST, {out, pd.dst_desc()}}});
    consume(a);
    consume(b);
  }

  // The shape a Flatten or Reshape node gives a tensor of shape d.
  static Dims reshaped(const Node* n, const Dims& d) {
    int64_t total = 1;
    for (int64_t x : d) total *= x;
    if (n->op == "Flatten") return {d[0], total / d[0]};
    Dims shape = ints(attr(n, "shape"));
    int64_t known = 1;
    int infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 0) {
        if (i >= d.size()) throw std::runtime_error("Reshape " + n->name + ": 0 past the rank");
        shape[i] = d[i];
      }
      if (shape[i] == -1) infer = static_cast<int>(i);
      else known *= shape[i];
    }
    if (infer >= 0 && known > 0) shape[infer] = total / known;
    int64_t count = 1;
    for (int64_t x : shape) count *= x;
    if (count != total) throw std::runtime_error("Reshape " + n->name + ": sizes do not match");
    return shape;
  }

  // transpose: one reorder reading the dense source through permuted strides.
  void add_transpose(const Node* n) {
    Entry data{n->inputs[0].node, n->inputs[0].entry};
    int v = value_of(data);
    const Dims& d = vals_[v].dims;
    Dims axes = ints(attr(n, "axes"));
    if (axes.size() != d.size())
      throw std::runtime_error("transpose " + n->name + ": axes do not match the rank");
    Dims strides(d.size(), 1), out(d.size()), out_strides(d.size());
    for (size_t i = d.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * d[i];
    for (size_t i = 0; i < d.size(); ++i) {
      int64_t a = axes[i] < 0 ? axes[i] + static_cast<int64_t>(d.size()) : axes[i];
      out[i] = d[a];
      out_strides[i] = strides[a];
    }
    auto src = dense(v);
    memory::desc permuted(out, dt_, out_strides), dst = plain(out, dt_);
    int b = new_buffer(dst);
    add_step(dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), permuted, cpu_engine(), dst)),
             {{DNNL_ARG_FROM, {src.first, permuted}}, {DNNL_ARG_TO, {b, dst}}});
    new_value(b, dst, out, {n, 0});
    consume(data);
  }

  // softmax or LayerNorm over the last axis of a dense tensor.
  void add_normalisation(const Node* n) {
    Entry data{n->inputs[0].node, n->inputs[0].entry};
    int v = value_of(data);
    const Dims& d = vals_[v].dims;
    auto src = dense(v);
    int out = new_buffer(src.second);
    auto dst = std::make_pair(out, src.second);
    if (n->op == "softmax") {
      dnnl::softmax_forward::primitive_desc pd(
          cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate,
          src.second, src.second, static_cast<int>(d.size()) - 1);
      add_step(dnnl::softmax_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
    } else {
      Dims c = {d.back()};
      const float* gamma = param(n->inputs[1], c[0]);
      const float* beta = param(n->inputs[2], c[0]);
      memory::desc cmd(c, kF32, memory::format_tag::a);
      dnnl::layer_normalization_forward::primitive_desc pd(
          cpu_engine(), dnnl::prop_kind::forward_inference, src.second, src.second,
          static_cast<float>(number(n, "eps", 1e-5)),
          dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift);
      add_step(dnnl::layer_normalization_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
               {{DNNL_ARG_SCALE, pack(gamma, c, cmd)}, {DNNL_ARG_SHIFT, pack(beta, c, cmd)}});
    }
    new_value(out, src.second, d, {n, 0});
    consume(data);
  }

  // batch_dot of (..., M, K) by (..., K, N), either side transposed, as one
  // matmul over the flattened batch axes; transposes are strides.
  void add_batch_dot(const Node* n) {
    Entry a{n->inputs[0].node, n->inputs[0].entry}, b{n->inputs[1].node, n->inputs[1].entry};
    int va = value_of(a), vb = value_of(b);
    auto as_3d = [&](int v, bool transpose) {
      const Dims& d = vals_[v].dims;
      if (d.size() < 3) throw std::runtime_error("batch_dot " + n->name + " needs 3-d inputs");
      int64_t batch = 1;
      for (size_t i = 0; i + 2 < d.size(); ++i) batch *= d[i];
      int64_t r = d[d.size() - 2], c = d.back();
      auto src = dense(v);
      Dims dims = transpose ? Dims{batch, c, r} : Dims{batch, r, c};
      Dims strides = transpose ? Dims{r * c, 1, c} : Dims{r * c, c, 1};
      return std::make_pair(src.first, memory::desc(dims, dt_, strides));
    };
    auto src0 = as_3d(va, flag(n, "transpose_a", false));
    auto src1 = as_3d(vb, flag(n, "transpose_b", false));
    Dims m = src0.second.get_dims(), k = src1.second.get_dims();
    if (m[0] != k[0] || m[2] != k[1])
      throw std::runtime_error("batch_dot " + n->name + ": shapes do not match");
    Dims out_dims(vals_[va].dims.begin(), vals_[va].dims.end() - 2);
    out_dims.push_back(m[1]);
    out_dims.push_back(k[2]);
    memory::desc dst_md({m[0], m[1], k[2]}, dt_, memory::format_tag::abc);
    dnnl::matmul::primitive_desc pd(cpu_engine(), src0.second, src1.second, dst_md);
    int out = new_buffer(dst_md);
    add_step(dnnl::matmul(pd), {{DNNL_ARG_SRC, src0}, {DNNL_ARG_WEIGHTS, src1},
                                {DNNL_ARG_DST, {out, dst_md}}});
    new_value(out, dst_md, out_dims, {n, 0});
    consume(a);
    consume(b);
  }

  void add_pooling(const Node* n) {
    int v = value_of({n->inputs[0].node, n->inputs[0].entry});
    const Dims& d = vals_[v].dims;
    if (d.size() != 4) throw std::runtime_error("Pooling " + n->name + " needs a 4-d input");
    bool global = flag(n, "global_pool", false);
    Dims kernel = global ? Dims{d[2], d[3]} : ints(attr(n, "kernel"));
    Dims stride = global ? Dims{1, 1} : ints(attr(n, "stride", "(1, 1)"));
    Dims pad = global ? Dims{0, 0} : ints(attr(n, "pad", "(0, 0)"));
    if (stride.empty()) stride = {1, 1};
    if (pad.empty()) pad = {0, 0};
    bool full = attr(n, "pooling_convention", "valid") == "full";
    Dims out = {d[0], d[1], 0, 0}, pad_r = pad;
    for (int i = 0; i < 2; ++i) {
      int64_t span = d[2 + i] + 2 * pad[i] - kernel[i];
      out[2 + i] = (full ? (span + stride[i] - 1) / stride[i] : span / stride[i]) + 1;
      pad_r[i] = (out[2 + i] - 1) * stride[i] + kernel[i] - d[2 + i] - pad[i];
    }
    bool max = attr(n, "pool_type", "max") == "max";
    auto alg = max ? dnnl::algorithm::pooling_max
               : flag(n, "count_include_pad", true) ? dnnl::algorithm::pooling_avg_include_padding
                                                    : dnnl::algorithm::pooling_avg_exclude_padding;
    auto src = computed(v);
    memory::desc dst_any(out, dt_, memory::format_tag::any);
    dnnl::pooling_forward::primitive_desc pd(cpu_engine(), dnnl::prop_kind::forward_inference, alg,
                                             src.second, dst_any, stride, kernel, {0, 0}, pad,
                                             pad_r);
    int b = new_buffer(pd.dst_desc());
    new_value(b, pd.dst_desc(), out, {n, 0});
    add_step(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {b, pd.dst_desc()}}});
    consume({n->inputs[0].node, n->inputs[0].entry});
  }

  // Convolution or FullyConnected with what follows it folded in: BatchNorm
  // into the weights, a residual add as sum post-op, an activation as
  // eltwise post-op.
  void add_linear(const Node* n) {
    bool conv = n->op == "Convolution";
    Entry data{n->inputs[0].node, n->inputs[0].entry};
    int v = value_of(data);
    const Dims& d = vals_[v].dims;
    const Dims wshape = param_tensor(n->inputs[1]).shape;
    int64_t out_ch = wshape[0];
    size_t wsize = 1;
    for (int64_t x : wshape) wsize *= x;
    const float* w = param(n->inputs[1], wsize);
    std::vector<float> weights(w, w + wsize), bias(out_ch, 0.f);
    if (!flag(n, "no_bias", false)) {
      const float* b = param(n->inputs[2], out_ch);
      bias.assign(b, b + out_ch);
    }

    // What follows, fused while each step has a single reader.
    std::vector<const Node*> fused, casts;
    Entry last{n, 0};
    const Node* next = readers_->sole(last, &casts);
    if (conv && next && next->op == "BatchNorm") {
      fold_batchnorm(next, &weights, &bias);
      fused.insert(fused.end(), casts.begin(), casts.end());
      fused.push_back(next);
      last = {next, 0};
      casts.clear();
      next = readers_->sole(last, &casts);
    }
    int sum_with = -1;
    Entry sum_entry;
    if (next && is_add(next)) {
      Entry other = {next->inputs[0].node, next->inputs[0].entry};
      if (producer(other) == producer(last) && other.second == last.second)
        other = {next->inputs[1].node, next->inputs[1].entry};
      if (entry_.count(other) && other != last) {
        sum_with = entry_[other];
        sum_entry = other;
        fused.insert(fused.end(), casts.begin(), casts.end());
        fused.push_back(next);
        last = {next, 0};
        casts.clear();
        next = readers_->sole(last, &casts);
      }
    }
    Eltwise act;
    bool has_act = next && eltwise_of(next, &act);
    if (has_act) {
      fused.insert(fused.end(), casts.begin(), casts.end());
      fused.push_back(next);
      last = {next, 0};
    }

    dnnl::post_ops ops;
    if (sum_with >= 0) ops.append_sum(1.f);
    if (has_act) ops.append_eltwise(act.alg, act.alpha, act.beta);
    dnnl::primitive_attr pattr;
    pattr.set_post_ops(ops);

    memory::desc bias_md({out_ch}, kF32, memory::format_tag::a);
    std::pair<int, memory::desc> src;
    memory::desc dst_md, w_md;
    Dims out_dims;
    dnnl::primitive prim;
    Dims wdims = wshape;
    if (conv) {
      if (d.size() != 4) throw std::runtime_error("Convolution " + n->name + " needs a 4-d input");
      Dims k = ints(attr(n, "kernel"));
      Dims stride = ints(attr(n, "stride", "(1, 1)")), pad = ints(attr(n, "pad", "(0, 0)"));
      Dims dil = ints(attr(n, "dilate", "(1, 1)"));
      if (stride.empty()) stride = {1, 1};
      if (pad.empty()) pad = {0, 0};
      if (dil.empty()) dil = {1, 1};
      int64_t groups = static_cast<int64_t>(number(n, "num_group", 1));
      out_dims = {d[0], out_ch, 0, 0};
      for (int i = 0; i < 2; ++i) {
        out_dims[2 + i] = (d[2 + i] + 2 * pad[i] - ((k[i] - 1) * dil[i] + 1)) / stride[i] + 1;
        dil[i] -= 1;  // oneDNN counts dilation from 0
      }
      if (groups > 1) wdims = {groups, out_ch / groups, wshape[1], k[0], k[1]};
      auto any = memory::format_tag::any;
      dnnl::convolution_forward::primitive_desc pd(
          cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
          memory::desc(d, dt_, any), memory::desc(wdims, dt_, any), bias_md,
          memory::desc(out_dims, dt_, any), stride, dil, pad, pad, pattr);
      src = as(v, pd.src_desc());
      dst_md = pd.dst_desc();
      w_md = pd.weights_desc();
      prim = dnnl::convolution_forward(pd);
    } else {
      // FullyConnected on a dense 2-d view: flatten=True keeps the batch
      // axis, flatten=False keeps all but the last axis.
      bool flatten = flag(n, "flatten", true);
      int64_t rows = 1, cols = 1;
      for (size_t i = 0; i < d.size(); ++i) {
        bool row = flatten ? i == 0 : i + 1 < d.size();
        (row ? rows : cols) *= d[i];
      }
      out_dims = flatten ? Dims{d[0], out_ch} : d;
      out_dims.back() = out_ch;
      wdims = {out_ch, cols};
      memory::desc src_md({rows, cols}, dt_, memory::format_tag::ab);
      dnnl::inner_product_forward::primitive_desc pd(
          cpu_engine(), dnnl::prop_kind::forward_inference, src_md,
          memory::desc(wdims, dt_, memory::format_tag::any), bias_md,
          memory::desc({rows, out_ch}, dt_, memory::format_tag::ab), pattr);
      auto dense = as(v, plain(vals_[v].md.get_dims(), dt_));
      src = {dense.first, src_md};
      dst_md = pd.dst_desc();
      w_md = pd.weights_desc();
      prim = dnnl::inner_product_forward(pd);
    }

    // The residual operand is written into dst first; when nothing else
    // reads it and its layout matches, the add happens in its own buffer.
    int out_buf;
    if (sum_with >= 0) {
      const Value& o = vals_[sum_with];
      if (o.uses == 1 && bufs_[o.buf].input < 0 && !shared(sum_with) && o.md == dst_md) {
        out_buf = o.buf;
      } else {
        out_buf = new_buffer(dst_md);
        auto from = o.md.get_dims() == dst_md.get_dims() ? std::make_pair(o.buf, o.md)
                                                         : view(sum_with, dst_md.get_dims());
        add_step(dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), from.second,
                                                            cpu_engine(), dst_md)),
                 {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, {out_buf, dst_md}}});
      }
      consume(sum_entry);
    } else {
      out_buf = new_buffer(dst_md);
    }
    add_step(prim, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {out_buf, dst_md}}},
             {{DNNL_ARG_WEIGHTS, pack(weights.data(), wdims, w_md)},
              {DNNL_ARG_BIAS, pack(bias.data(), {out_ch}, bias_md)}});
    consume(data);
    for (const Node* f : fused) done_.insert(f);
    new_value(out_buf, dst_md, out_dims, last);
  }

  // w' = w * gamma / sqrt(var + eps); b' = (b - mean) * gamma / sqrt(var + eps) + beta
  void fold_batchnorm(const Node* bn, std::vector<float>* w, std::vector<float>* b) {
    size_t c = b->size();
    const float* gamma = flag(bn, "fix_gamma", true) ? nullptr : param(bn->inputs[1], c);
    const float* beta = param(bn->inputs[2], c);
    const float* mean = param(bn->inputs[3], c);
    const float* var = param(bn->inputs[4], c);
    double eps = number(bn, "eps", 1e-3);
    size_t per = w->size() / c;
    for (size_t o = 0; o < c; ++o) {
      float s = static_cast<float>((gamma ? gamma[o] : 1.0) / std::sqrt(var[o] + eps));
      for (size_t i = 0; i < per; ++i) (*w)[o * per + i] *= s;
      (*b)[o] = ((*b)[o] - mean[o]) * s + beta[o];
    }
  }

  // Assigns internal buffers by lifetime (reusing memory freed by earlier
  // steps) and turns every step's arguments into memory objects.
  void materialize() {
    std::vector<int> order;
    for (size_t i = 0; i < bufs_.size(); ++i)
      if (bufs_[i].input < 0 && bufs_[i].output < 0 && bufs_[i].first >= 0) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return bufs_[a].first < bufs_[b].first; });
    std::vector<int> slot(bufs_.size(), -1), slot_free_after;
    std::vector<size_t> slot_size;
    for (int b : order) {
      int best = -1;
      for (size_t s = 0; s < slot_size.size(); ++s)
        if (slot_free_after[s] < bufs_[b].first &&
            (best < 0 || slot_size[s] < slot_size[best]) && slot_size[s] >= bufs_[b].size)
          best = static_cast<int>(s);
      if (best < 0) {
        for (size_t s = 0; s < slot_size.size(); ++s)  // grow a free slot instead
          if (slot_free_after[s] < bufs_[b].first) { best = static_cast<int>(s); break; }
      }
      if (best < 0) {
        best = static_cast<int>(slot_size.size());
        slot_size.push_back(0);
        slot_free_after.push_back(-1);
      }
      slot_size[best] = std::max(slot_size[best], bufs_[b].size);
      slot_free_after[best] = bufs_[b].last;
      slot[b] = best;
    }
    for (size_t s : slot_size) storage_.emplace_back(new char[s + 64]);
    auto ptr = [&](int s) {
      auto p = reinterpret_cast<uintptr_t>(storage_[s].get());
      return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
    };
    for (Step& s : steps_) {
      std::unordered_map<int, memory> args = s.fixed;
      for (auto& a : s.args) {
        const Buffer& b = bufs_[a.second.first];
        memory m(a.second.second, cpu_engine(), b.input >= 0 || b.output >= 0 ? nullptr
                                                                              : ptr(slot[a.second.first]));
        if (b.input >= 0) in_mems_.push_back({m, b.input});
        if (b.output >= 0) out_mems_.push_back({m, b.output});
        args[a.first] = m;
      }
      run_.push_back({s.prim, std::move(args)});
    }
    steps_.clear();
  }

  Graph* graph_;
  const memory::data_type dt_;  // what the chain computes in
  bool built_ = false;
  const std::vector<MXTensor>* ins_ = nullptr;
  std::unique_ptr<Readers> readers_;
  dnnl::stream stream_;
  std::vector<Step> steps_;
  std::vector<Buffer> bufs_;
  std::vector<Value> vals_;
  std::map<Entry, int> entry_;
  std::set<const Node*> done_;
  std::vector<std::vector<int64_t>> in_shapes_;
  std::map<int, size_t> param_versions_;         // region input -> version packed
  std::map<int, std::vector<char>> param_copies_;  // inputs whose version moves
  std::vector<std::pair<memory, int>> in_mems_, out_mems_;
  std::vector<std::pair<dnnl::primitive, std::unordered_map<int, memory>>> run_;
  std::vector<std::unique_ptr<char[]>> storage_;
};

MXReturnValue create_region(const Attrs& attrs, const MXContext& ctx,
                            const std::vector<std::vector<unsigned int>>&, const std::vector<int>,
                            CustomStatefulOp** state) {
  auto it = attrs.find(MX_STR_SUBGRAPH_SYM_JSON);
  if (it == attrs.end()) {
    MX_ERROR_MSG << kRegionOp << " has no subgraph";
    return MX_FAIL;
  }
  try {
    *state = CustomStatefulOp::create<Region>(it->second, compute_type(attrs));
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    MX_ERROR_MSG << kRegionOp << ": cannot read the subgraph: " << e.what();
    return MX_FAIL;
  }
}

}  // namespace

REGISTER_OP(_mxamp_onednn_region)
    .setIsSubgraphOp()
    .setCreateOpState(create_region, "cpu");

REGISTER_PARTITIONER(mxamp_onednn)
    .addStrategy("bf16_regions", kRegionOp)
    .setCreateSelector("bf16_regions", create_selector)
    .setReviewSubgraph("bf16_regions", review_subgraph);

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "mxamp_onednn needs MXNet 1.9, found version " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
