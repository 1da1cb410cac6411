// A region: a subgraph run as one chain of oneDNN primitives (and kernels
// of mxamp's own, region steps alike). The first call (and any call with
// new input shapes or changed parameters) plans it (plan.h); then buffers
// are assigned and every later call only executes the plan's steps.
#ifndef MXAMP_ONEDNN_REGION_H_
#define MXAMP_ONEDNN_REGION_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "plan.h"

namespace mxamp_onednn {

// A batch run in chunks (chunks.cc): where every operator of a region keeps
// images apart (the table's `apart`), the region plans a chunk of a few
// images and runs the batch chunk by chunk, spread over the threads, each
// with buffers of its own and primitives made for one thread. A chunk's
// tensors stay in cache between layers, and the threads never wait for each
// other inside a layer.
struct Chunks {
  int64_t images = 0;       // per chunk; 0: the whole batch at once
  int64_t count = 1;        // chunks in the batch
  int workers = 1;          // threads running them
  std::vector<bool> split;  // per region input: cut along axis 0 (not a parameter)
  // The tensors a chunk sees: split inputs (or every output) with
  // `images` along axis 0.
  std::vector<MXTensor> of(const std::vector<MXTensor>& ts, bool outputs) const;
};

// How region `g` runs a batch of these inputs and outputs on `threads`
// (`int8`: an INT8 region).
Chunks chunks_of(const Graph* g, const std::vector<MXTensor>& ins,
                 const std::vector<MXTensor>& outs, int threads, bool int8);

// What one thread runs a chunk with: the steps as primitives with their
// memory objects on its own storage (its scratchpad included).
struct Worker {
  dnnl::stream stream;
  std::vector<std::pair<memory, int>> in_mems, out_mems;  // memory, tensor index
  std::vector<std::pair<Kernel, std::unordered_map<int, memory>>> run;
  std::vector<std::unique_ptr<char[]>> storage;
};

class Region : public CustomStatefulOp {
 public:
  // Runs `graph` (owned from now on). `compute`: bf16, f32 or s8 (INT8
  // where calibrated; layers kept out of INT8 compute in `rest`: f32, or
  // bf16 for mixed INT8 + bfloat16); `input_ranges`: INT8 calibration of
  // each region input. `exact`: Precision::exact (plan.h). Without the
  // JSON there is no exact plan: unless `exact`, Forward refuses inputs
  // holding NaN or Inf.
  Region(Graph* graph, memory::data_type compute, std::vector<Range> input_ranges,
         memory::data_type rest = kF32, bool exact = false);
  // The graph as MXNet gives a region node's subgraph (kept: the exact
  // plan reads it again; lib_api's toString orders inputs otherwise).
  Region(const std::string& json, memory::data_type compute, std::vector<Range> input_ranges,
         memory::data_type rest);
  ~Region() override;

  MXReturnValue Forward(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                        const OpResource& res) override;

  // Plans every node for these inputs (throws dnnl::error if oneDNN cannot
  // create a primitive): the part of planning partitioning runs to check a
  // node, on small shapes.
  std::unique_ptr<Plan> plan(const std::vector<MXTensor>& ins);

 private:
  bool stale(const std::vector<MXTensor>& ins);
  bool finite(const std::vector<MXTensor>& ins) const;  // the data (parameters: finite_params_)
  Region& exact_region();
  bool regrouped(const std::vector<MXTensor>& ins);  // stale(): shared inputs changed
  void build(const std::vector<MXTensor>& ins, const std::vector<MXTensor>& outs);
  void remember(const std::vector<MXTensor>& ins, const std::set<int>& params);
  void materialize(const Planned& planned);
  void run(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs, int64_t k, int w);

  Graph* graph_;
  const memory::data_type compute_;  // the option: bf16, f32 or s8 (INT8)
  const Precision precision_;
  const std::vector<Range> input_ranges_;
  std::string json_;                      // the graph's JSON, when given as JSON
  std::unique_ptr<Region> exact_region_;  // made at the first call holding NaN or Inf
  bool finite_params_ = true;             // as remember() found them
  bool built_ = false;
  std::vector<std::vector<int64_t>> in_shapes_;
  std::vector<size_t> same_;  // per input, the first input that is the same tensor
  std::vector<const void*> in_ptrs_;  // the inputs' data when same_ was found
  std::map<int, size_t> param_versions_;           // region input -> version packed
  std::map<int, std::vector<char>> param_copies_;  // inputs whose version moves
  Chunks chunks_;
  std::vector<Worker> workers_;
};

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_REGION_H_
