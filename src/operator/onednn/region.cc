// A region: planning (build) and execution (Forward).
#include "region.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <map>
#include <new>
#include <stdexcept>
#include <tuple>

#include "engine.h"
#include "special.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// The types a region of option `compute` computes in.
Precision precision(memory::data_type compute, memory::data_type rest, bool exact) {
  const bool int8 = compute == kS8;
  const memory::data_type kept = int8 ? rest : compute;
  return {int8 && cpu_stores_bf16() ? kBF16 : kept, kept, int8, exact};
}

// A batch of 0 (MXNet's NumPy shapes) leaves every output empty: there is
// nothing to plan or run (a plan's chunks would divide by the batch). No
// operator of the table makes values from an empty input, so one with
// outputs to write is refused.
bool nothing_to_compute(const std::vector<MXTensor>& ins, const std::vector<MXTensor>& outs) {
  bool empty = std::all_of(outs.begin(), outs.end(), [](const MXTensor& t) { return !t.size(); });
  if (empty) return true;
  for (size_t i = 0; i < ins.size(); ++i)
    if (!ins[i].size())
      throw std::runtime_error("region input " + std::to_string(i) + " is empty, shape " +
                               tuple_text(ins[i].shape) + ", but its outputs are not");
  return false;
}

}  // namespace

Region::Region(Graph* graph, memory::data_type compute, std::vector<Range> input_ranges,
               memory::data_type rest, bool exact)
    : graph_(graph),
      compute_(compute),
      precision_(precision(compute, rest, exact)),
      input_ranges_(std::move(input_ranges)) {}

Region::Region(const std::string& json, memory::data_type compute,
               std::vector<Range> input_ranges, memory::data_type rest)
    : Region(Graph::fromString(json), compute, std::move(input_ranges), rest) {
  json_ = json;
}

Region::~Region() { delete graph_; }

MXReturnValue Region::Forward(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                              const OpResource& res) {
  try {
    if (nothing_to_compute(*inputs, *outputs)) return MX_SUCCESS;
    Team team(region_threads());  // planned and run on this team
    if (stale(*inputs)) build(*inputs, *outputs);
    if (!finite(*inputs)) return exact_region().Forward(inputs, outputs, res);
    // One worker runs outside a parallel region, so that a whole batch's
    // primitives use every thread.
    if (chunks_.workers == 1) {
      for (int64_t k = 0; k < chunks_.count; ++k) run(inputs, outputs, k, 0);
      return MX_SUCCESS;
    }
    std::exception_ptr failed;  // an exception must not leave an OpenMP region
#pragma omp parallel for num_threads(chunks_.workers) schedule(static)
    for (int64_t k = 0; k < chunks_.count; ++k) {
      try {
        run(inputs, outputs, k, omp_get_thread_num());
      } catch (...) {
#pragma omp critical(mxamp_region_failed)
        failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    return MX_SUCCESS;
  } catch (const dnnl::error& e) {
    MX_ERROR_MSG << "mxamp_onednn region failed in oneDNN: "
                 << (e.status == dnnl_out_of_memory ? "out of memory" : e.what()) << " (status "
                 << e.status << ")";
  } catch (const std::bad_alloc&) {
    MX_ERROR_MSG << "mxamp_onednn region failed: out of memory";
  } catch (const std::exception& e) {
    MX_ERROR_MSG << "mxamp_onednn region failed: " << e.what();
  }
  built_ = false;
  return MX_FAIL;
}

// The float32 data inputs (each tensor once) and the parameters finite:
// what the plan was made for.
bool Region::finite(const std::vector<MXTensor>& ins) const {
  if (precision_.exact) return true;
  if (!finite_params_) return false;
  for (size_t i = 0; i < ins.size(); ++i)
    if (same_[i] == i && !param_versions_.count(static_cast<int>(i)) &&
        ins[i].dtype == kFloat32 &&
        !all_finite(static_cast<const float*>(ins[i].data_ptr), ins[i].size()))
      return false;
  return true;
}

// The same graph in float32, exact: planned when first run, from the
// JSON (a graph's toString would order its inputs otherwise).
Region& Region::exact_region() {
  if (json_.empty())
    throw std::logic_error(
        "a region made from a Graph, not from JSON, has no exact plan for inputs holding NaN "
        "or Inf");
  if (!exact_region_)
    exact_region_.reset(new Region(Graph::fromString(json_), kF32, {}, kF32, true));
  return *exact_region_;
}

namespace {
// Region inputs are float32, or int8 for s8 weights (linear.cc).
size_t bytes(const MXTensor& t) { return t.size() * (t.dtype == kInt8 ? 1 : sizeof(float)); }
const char* data(const MXTensor& t) { return static_cast<const char*>(t.data_ptr); }

// Where chunk k of t starts: t's data, or its k-th of `count` along axis 0.
void* chunk(const MXTensor& t, bool split, int64_t k, int64_t count) {
  return const_cast<char*>(data(t)) + (split ? k * (bytes(t) / count) : 0);
}

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

// Chunk k of the batch, on worker w's buffers.
void Region::run(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs, int64_t k,
                 int w) {
  Worker& worker = workers_[w];
  for (auto& m : worker.in_mems)
    m.first.set_data_handle(chunk(inputs->at(m.second), chunks_.split[m.second], k, chunks_.count));
  for (auto& m : worker.out_mems)
    m.first.set_data_handle(chunk(outputs->at(m.second), true, k, chunks_.count));
  for (auto& s : worker.run) s.first(worker.stream, s.second);
  worker.stream.wait();
}

void Region::build(const std::vector<MXTensor>& ins, const std::vector<MXTensor>& outs) {
  chunks_ = chunks_of(graph_, ins, outs, omp_get_max_threads(), precision_.int8);
  std::vector<MXTensor> chunk_ins = chunks_.of(ins, false);
  Planned planned;
  {
    Team one(chunks_.workers > 1 ? 1 : 0);  // each worker runs its chunks alone
    planned = plan(chunk_ins)->finish(chunks_.of(outs, true));
  }
  materialize(planned);
  remember(ins, planned.params);
  built_ = true;
}

std::unique_ptr<Plan> Region::plan(const std::vector<MXTensor>& ins) {
  memory::data_type missing = !cpu_supports(compute_) ? compute_ : precision_.rest;
  if (!cpu_supports(missing))
    throw std::runtime_error(
        missing == kS8
            ? "this region computes in INT8 but oneDNN has no INT8 kernels for this CPU (or "
              "ONEDNN_MAX_CPU_ISA); apply the backend to the model without regions on this "
              "machine"
            : std::string(precision_.int8 ? "this INT8 region computes what is not INT8 in "
                                            "bfloat16 (rest_dtype)"
                                          : "this region computes in bfloat16") +
                  " but the CPU (or ONEDNN_MAX_CPU_ISA) offers no AVX512-BF16/AMX; apply the "
                  "backend to the model without regions on this machine");
  for (const MXTensor& t : ins)
    if (t.dtype != kFloat32 && t.dtype != kInt8)
      throw std::runtime_error("region inputs must be float32 (int8: s8 weights)");
  same_ = same_tensors(ins);
  in_ptrs_.clear();
  for (const MXTensor& t : ins) in_ptrs_.push_back(t.data_ptr);
  auto p = std::make_unique<Plan>(graph_, ins, same_, precision_, input_ranges_);
  p->add_nodes();
  return p;
}

// What the plan was made for: input shapes and parameter versions (and
// contents, for parameters whose version moves).
void Region::remember(const std::vector<MXTensor>& ins, const std::set<int>& params) {
  // The plan grouped the chunks' inputs: the full inputs group alike, but
  // for split and whole inputs of one tensor, which the plan kept apart.
  same_ = same_tensors(ins);
  in_shapes_.clear();
  for (const MXTensor& t : ins) in_shapes_.push_back(t.shape);
  param_versions_.clear();
  for (int i : params) param_versions_[i] = ins[i].verID;
  for (auto& c : param_copies_) {
    const MXTensor& t = ins[c.first];
    c.second.assign(data(t), data(t) + bytes(t));
  }
  finite_params_ = true;
  for (auto& p : param_versions_) {
    const MXTensor& t = ins[p.first];
    if (t.dtype == kFloat32 && !all_finite(static_cast<const float*>(t.data_ptr), t.size()))
      finite_params_ = false;
  }
}

namespace {

// The storage slot of each internal buffer, by lifetime: a slot freed by
// earlier steps is reused (the smallest that fits, else one grown); `sizes`
// gets the slots' sizes.
std::vector<int> assign_slots(const std::vector<Buffer>& bufs, std::vector<size_t>* sizes) {
  std::vector<int> order;
  for (size_t i = 0; i < bufs.size(); ++i)
    if (bufs[i].input < 0 && bufs[i].output < 0 && bufs[i].first >= 0) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return bufs[a].first < bufs[b].first; });
  std::vector<int> slot(bufs.size(), -1), free_after;
  std::vector<size_t>& size = *sizes;
  size.clear();
  for (int b : order) {
    int best = -1;
    for (size_t s = 0; s < size.size(); ++s)
      if (free_after[s] < bufs[b].first && (best < 0 || size[s] < size[best]) &&
          size[s] >= bufs[b].size)
        best = static_cast<int>(s);
    for (size_t s = 0; best < 0 && s < size.size(); ++s)  // grow a free slot instead
      if (free_after[s] < bufs[b].first) best = static_cast<int>(s);
    if (best < 0) {
      best = static_cast<int>(size.size());
      size.push_back(0);
      free_after.push_back(-1);
    }
    size[best] = std::max(size[best], bufs[b].size);
    free_after[best] = bufs[b].last;
    slot[b] = best;
  }
  return slot;
}

}  // namespace

// Turns every step's arguments into memory objects on each worker's storage
// (region inputs and outputs get their tensors' pointers on each call). The
// primitives, kernels and their packed weights are shared.
void Region::materialize(const Planned& planned) {
  const std::vector<Buffer>& bufs = planned.buffers;
  std::vector<size_t> sizes;
  std::vector<int> slot = assign_slots(bufs, &sizes);
  sizes.push_back(planned.scratchpad);  // the last slot
  workers_.clear();
  workers_.resize(chunks_.workers);
  for (Worker& w : workers_) {
    w.stream = dnnl::stream(cpu_engine());
    for (size_t s : sizes) w.storage.emplace_back(new char[s + 64]);
    auto ptr = [&](int s) {
      auto p = reinterpret_cast<uintptr_t>(w.storage[s].get());
      return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
    };
    memory scratchpad(plain({static_cast<int64_t>(planned.scratchpad)}, kU8), cpu_engine(),
                      ptr(static_cast<int>(sizes.size()) - 1));
    for (const Step& s : planned.steps) {
      std::unordered_map<int, memory> args = s.fixed;
      args[DNNL_ARG_SCRATCHPAD] = scratchpad;
      for (auto& a : s.args) {
        const Buffer& b = bufs[a.second.first];
        bool external = b.input >= 0 || b.output >= 0;
        memory m(a.second.second, cpu_engine(), external ? nullptr : ptr(slot[a.second.first]));
        if (b.input >= 0) w.in_mems.push_back({m, b.input});
        if (b.output >= 0) w.out_mems.push_back({m, b.output});
        args[a.first] = m;
      }
      w.run.push_back({s.run, std::move(args)});
    }
  }
}

}  // namespace mxamp_onednn
