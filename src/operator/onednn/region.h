// A region: a subgraph run as one chain of oneDNN primitives (and kernels
// of mxamp's own, region steps alike). The first call
// (and any call with new input shapes or changed parameters) plans it: each
// node's family adds its steps through the plan interface below; then
// buffers are assigned and every later call only executes the steps.
#ifndef MXAMP_ONEDNN_REGION_H_
#define MXAMP_ONEDNN_REGION_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attrs.h"
#include "common.h"
#include "graph.h"

namespace mxamp_onednn {

// How an INT8 value's integers q stand for real numbers:
// x = (q - zp) * scale. A zero point lets u8 hold signed values (a linear
// layer's signed source, GELU's output from its floor; encodings.cc
// decides where). Float values keep {1, 0}. Whatever passes a value on
// (casts, views, pooling) passes its whole encoding.
struct Encoding {
  float scale = 1;  // the real value of one step
  int zp = 0;       // the integer standing for 0
  bool operator==(const Encoding& o) const { return scale == o.scale && zp == o.zp; }
  bool operator!=(const Encoding& o) const { return !(*this == o); }
};

// A tensor inside the region: where it lives and its MXNet shape.
struct Value {
  int buf;
  memory::desc md;
  Dims dims;
  Encoding enc;   // INT8 values' encoding
  int uses = 0;   // reads still to come
  int input = -1;   // region input index, for parameters
  std::vector<int> copies;  // reordered (or requantized) versions
  // A strided view (views.cc): a transpose only batch_dots read, or a
  // batch_dot's output written in the order of the transpose reading it.
  // md's strides are not dense and its dims may group the batch axes
  // otherwise than dims; only batch_dot, and the views on the way, read it
  // as it lies.
  bool permuted = false;
  // A convolution's output of which only every k-th row and column is
  // computed: its readers, 1x1 convolutions, stride by k less (strides.cc).
  int64_t subsampled = 1;
};

// A parameter's data as a region input holds it.
struct Param {
  const void* data = nullptr;
  std::vector<int64_t> shape;
  MXDType dtype = kFloat32;
  int64_t size() const {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    return n;
  }
};

// What a step runs: a oneDNN primitive, or a kernel of mxamp's own
// (depthwise.h, softmax_int8.h), on the worker's stream and the step's memory objects.
using Kernel = std::function<void(dnnl::stream&, const std::unordered_map<int, memory>&)>;
// A call of a kernel of mxamp's own, on the step's memory objects.
using OwnKernel = std::function<void(const std::unordered_map<int, memory>&)>;

// One oneDNN primitive call, or one call of a kernel. Arguments refer to
// buffers by id; they become memory objects once all steps are known and
// buffers are assigned.
struct Step {
  Kernel run;
  std::vector<std::pair<int, Arg>> args;  // key -> (buffer, desc)
  std::unordered_map<int, memory> fixed;  // packed weights, bias, scales
};

// A buffer: an internal activation buffer, or a region input/output tensor.
struct Buffer {
  size_t size = 0;
  int first = -1, last = -1;    // steps using it
  int input = -1, output = -1;  // external tensor index
};

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
  // each region input. `exact`: see exact().
  Region(Graph* graph, memory::data_type compute, std::vector<Range> input_ranges,
         memory::data_type rest = kF32, bool exact = false);
  // The graph as MXNet gives a region node's subgraph (kept: the exact
  // plan reads it again; lib_api's toString orders inputs otherwise).
  Region(const std::string& json, memory::data_type compute, std::vector<Range> input_ranges,
         memory::data_type rest);
  ~Region() override;

  MXReturnValue Forward(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                        const OpResource&) override;

  // Creates the primitives of every node for these inputs (throws
  // dnnl::error if oneDNN cannot): the part of planning partitioning runs to
  // check a node, on small shapes.
  void plan(const std::vector<MXTensor>& ins);

  // ---- the plan interface, for the operator families
  // The float type computed in: in INT8 regions, by the operators INT8
  // does not cover (bfloat16 where oneDNN stores it: the narrowest).
  memory::data_type dt() const { return dt_; }
  // The float type of the layers kept out of INT8 (and left uncalibrated).
  memory::data_type rest() const { return rest_; }
  // The float type node n computes in outside INT8: rest() if it is kept.
  memory::data_type dt(const Node* n) const { return keeps_float(n) ? rest_ : dt_; }
  // The float type to write e in, computed in `computed`: rest() where a
  // kept node or the region's output reads it (through views too).
  memory::data_type float_out(Entry e, memory::data_type computed) const;
  bool int8() const { return int8_; }  // whether INT8 is planned
  // Whether NaN and +-Inf get MXNet's answers from every step: the plan a
  // call whose data holds them runs (float32; post-ops that lose them run
  // as steps of their own, eltwise.cc). INT8 holds neither, and oneDNN's
  // relu, clip and GELU lose them; without NaN or Inf in its inputs and
  // parameters a region makes none (but by overflow).
  bool exact() const { return exact_; }
  // Whether LayerNorm reads and writes s8/u8 (an INT8 region on a CPU
  // where oneDNN stores no bfloat16: its narrowest type; the table's
  // kNarrowest role).
  bool narrow_int8() const { return int8_ && dt_ == kF32; }
  const Readers& readers() const { return *readers_; }
  Value& value(int v) { return vals_[v]; }
  bool is_int8(int v) const { return mxamp_onednn::is_int8(vals_[v].md.get_data_type()); }
  bool has_value(Entry e) const { return entry_.count(e) > 0; }
  int value_of(Entry e);
  // The entries value v is so far: a region input MXNet gives once per
  // edge (same_tensors), a cast's outputs.
  std::vector<Entry> entries_of(int v) const;
  int new_buffer(const memory::desc& md);
  // A new value in buffer `buf` that entry `e` (and every read of it) is.
  int new_value(int buf, const memory::desc& md, const Dims& dims, Entry e, Encoding enc = {});
  void bind(Entry e, int v);
  void consume(Entry e);             // one read of e is done
  void fused(const Node* n);         // n is done: fused into an earlier step
  bool shared(int v) const;          // another live value sits in v's buffer
  bool writable(int v) const;        // v is read once more, in a buffer of its own
  void add_step(const dnnl::primitive& p, std::vector<std::pair<int, Arg>> args,
                std::unordered_map<int, memory> fixed = {});
  // A step calling a kernel of mxamp's own, logged as oneDNN's verbose mode
  // logs a primitive's call (run_logged, engine.h: `log`, its fields).
  void add_step(OwnKernel call, std::string log, std::vector<std::pair<int, Arg>> args);
  // A reorder step from one encoding to another (quantizing, dequantizing,
  // requantizing; floats have {1, 0}).
  void add_reorder(Arg from, Arg to, Encoding from_enc = {}, Encoding to_enc = {});
  // Value v in layout md, reordered once and reused by every later reader
  // asking for the same layout and encoding: an INT8 md in encoding `to`,
  // or, without it, in v's own (v must be INT8 then).
  Arg as(int v, const memory::desc& md, const Encoding* to = nullptr);
  Arg as(int v, const memory::desc& md, Encoding to) { return as(v, md, &to); }
  Arg view(int v, const Dims& dims);  // dense, of shape dims (same type, encoding)
  Arg computed(int v, memory::data_type dt);  // in dt, the layout oneDNN keeps it in
  Arg dense(int v, memory::data_type dt);     // dense, its MXNet shape, in dt
  const MXTensor& param_tensor(const NodeEntry& e);
  // A parameter's data (a region input, or a piece of one); the plan is
  // made again when it changes. With `piece` (a _split_v2 output cutting
  // what e's readers compute from e), the rows of e that it cuts.
  Param param_of(const NodeEntry& e, const NodeEntry* piece = nullptr);
  // float32, `expect` elements
  const float* param(const NodeEntry& e, size_t expect, const NodeEntry* piece = nullptr);
  // Packs float32 host data into md; s8 weights are divided by their scales
  // along the dimensions in `mask`.
  memory pack(const float* data, const Dims& dims, const memory::desc& md,
              const std::vector<float>& scale = {}, int mask = 0);
  // INT8: the calibrated range of an entry, and whether all of its readers
  // in the region take it as INT8.
  Range range_of(Entry e);
  bool int8_readers(Entry e);
  // Whether every read of e (one at least), through the operators that pass
  // an INT8 value on with its encoding (casts, views, pooling that pools
  // one with a zero point alike), is one `reads` accepts: what a writer
  // asks before it gives its output a zero point.
  bool zero_point_readers(Entry e, const std::function<bool(const Node*, Entry)>& reads);
  // Whether activation n reading e is a post-op of its producer.
  bool fused_activation(const Node* n, Entry e);

 private:
  bool stale(const std::vector<MXTensor>& ins);
  bool finite(const std::vector<MXTensor>& ins) const;  // the data (parameters: finite_params_)
  Region& exact_region();
  bool regrouped(const std::vector<MXTensor>& ins);  // stale(): shared inputs changed
  void build(const std::vector<MXTensor>& ins, const std::vector<MXTensor>& outs);
  void reset(const std::vector<MXTensor>& ins);
  void add_inputs(const std::vector<MXTensor>& ins);
  void uses(const std::vector<std::pair<int, Arg>>& args);  // by the next step
  void add_outputs(const std::vector<MXTensor>& outs);
  void add_node(const Node* n);
  void remember(const std::vector<MXTensor>& ins);
  bool takes_int8(const Node* n, Entry e);
  std::vector<int> assign_slots(std::vector<size_t>* sizes);
  void materialize();
  void run(std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs, int64_t k, int w);

  Graph* graph_;
  const memory::data_type compute_;  // the option: bf16, f32 or s8 (INT8)
  const memory::data_type rest_;     // kept layers' float type (INT8), else compute
  const memory::data_type dt_;       // what the chain computes in outside INT8
  const bool int8_;
  const bool exact_;
  const std::vector<Range> input_ranges_;
  std::string json_;                      // the graph's JSON, when given as JSON
  std::unique_ptr<Region> exact_region_;  // made at the first call holding NaN or Inf
  bool finite_params_ = true;             // as remember() found them
  bool built_ = false;
  const std::vector<MXTensor>* ins_ = nullptr;
  std::unique_ptr<Readers> readers_;
  dnnl::stream stream_;
  std::vector<Step> steps_;
  std::vector<Buffer> bufs_;
  std::vector<Value> vals_;
  std::map<Entry, int> entry_;
  std::map<Entry, bool> int8_readers_;
  std::set<const Node*> done_;
  std::vector<std::vector<int64_t>> in_shapes_;
  std::vector<size_t> same_;  // per input, the first input that is the same tensor
  std::vector<const void*> in_ptrs_;  // the inputs' data when same_ was found
  std::map<int, size_t> param_versions_;           // region input -> version packed
  std::map<int, std::vector<char>> param_copies_;  // inputs whose version moves
  Chunks chunks_;
  size_t scratchpad_ = 0;  // the largest scratchpad a step needs
  std::vector<Worker> workers_;
};

// Scales as a runtime argument (DNNL_ARG_ATTR_SCALES).
memory scales(const std::vector<float>& s);

// Zero points of the source and destination (none where 0), runtime
// arguments into `fixed`.
void zero_points(int src, int dst, dnnl::primitive_attr* attr,
                 std::unordered_map<int, memory>* fixed);

// md's layout holding data type dt; blocked layouts become dense (INT8
// activations are strided, nhwc, so they keep theirs).
memory::desc retyped(const memory::desc& md, memory::data_type dt);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_REGION_H_
