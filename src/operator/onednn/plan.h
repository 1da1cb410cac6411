// A region's plan: what the operator families see of a region. The region
// (region.h) makes a plan for its input shapes: each node's family adds its
// steps through the interface below (values, buffers, reorders, parameters
// and the INT8 questions), and the region then executes those steps.
#ifndef MXAMP_ONEDNN_PLAN_H_
#define MXAMP_ONEDNN_PLAN_H_

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
// decides where). Float values keep {1, 0}. An operator that passes a value
// on (the table's Family::passes_zero_point) passes its whole encoding.
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
  // A strided view: md's strides are not dense and its dims may group the
  // leading (batch) axes otherwise than dims. Only the readers that ask for
  // it (a matmul over the batch axes, and the views on the way) read it as
  // it lies; as(), view() and dense() give the others dense copies.
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

// The types a region computes in.
struct Precision {
  // Outside INT8: in INT8 regions, what the operators INT8 does not cover
  // compute in (bfloat16 where oneDNN stores it: the narrowest).
  memory::data_type dt;
  memory::data_type rest;  // the layers kept out of INT8 (and left uncalibrated)
  bool int8;               // whether INT8 is planned
  // Whether NaN and +-Inf get MXNet's answers from every step: the plan a
  // call whose data holds them runs (float32; post-ops that lose them run
  // as steps of their own, eltwise.cc). INT8 holds neither, and oneDNN's
  // relu, clip and GELU lose them; without NaN or Inf in its inputs and
  // parameters a region makes none (but by overflow).
  bool exact;
};

// What executing a plan needs.
struct Planned {
  std::vector<Step> steps;
  std::vector<Buffer> buffers;
  size_t scratchpad = 0;  // the largest scratchpad a step needs
  std::set<int> params;   // the region inputs packed as parameters
};

class Plan {
 public:
  // A plan of graph g on inputs `ins` (which it reads until finish()):
  // `same` gives per input the first input that is the same tensor (read as
  // one value), `ranges` the INT8 calibration of each input.
  Plan(const Graph* g, const std::vector<MXTensor>& ins, const std::vector<size_t>& same,
       Precision precision, const std::vector<Range>& ranges);
  // Adds every node's steps (throws dnnl::error if oneDNN cannot make one).
  void add_nodes();
  // Adds the steps writing the region's outputs; what executing needs.
  Planned finish(const std::vector<MXTensor>& outs);

  // ---- the interface of the operator families
  // The float type computed in outside INT8 (Precision::dt).
  memory::data_type dt() const { return precision_.dt; }
  // The float type of the layers kept out of INT8 (and left uncalibrated).
  memory::data_type rest() const { return precision_.rest; }
  // The float type node n computes in outside INT8: rest() if it is kept,
  // float32 in bfloat16 regions where its row says so (Row::f32_in_bf16).
  memory::data_type dt(const Node* n) const;
  // The float type to write e in, computed in `computed`: rest() where a
  // kept node or the region's output reads it (float32 if computed so),
  // float32 where a node computing in float32 does (through the nodes that
  // pass it on too: Row::passes_data_on).
  memory::data_type float_out(Entry e, memory::data_type computed) const;
  bool int8() const { return precision_.int8; }  // whether INT8 is planned
  bool exact() const { return precision_.exact; }  // Precision::exact
  // Whether the table's kNarrowest operators read and write s8/u8: an INT8
  // region on a CPU where oneDNN stores no bfloat16.
  bool narrow_int8() const { return int8() && dt() == kF32; }
  const Readers& readers() const { return readers_; }
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
  void bind(Entry e, int v);         // e is value v too
  void consume(Entry e);             // one read of e is done
  void fused(const Node* n);         // n is done: fused into an earlier step
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

  // Parameters (parameters.cc).
  const MXTensor& param_tensor(const NodeEntry& e);
  // A parameter's data (a region input, or a piece of one); the plan is
  // made again when it changes. With `piece` (a _split_v2 output cutting
  // what e's readers compute from e), the rows of e that it cuts.
  Param param_of(const NodeEntry& e, const NodeEntry* piece = nullptr);
  // A _split_v2's `indices`, read once: a region's pack is cut into a piece
  // per layer, and reading them per piece made planning quadratic.
  const Dims& cut_indices(const Node* split);
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
  // an INT8 value on with its zero point (Family::passes_zero_point), is one
  // `reads` accepts: what a writer asks before it gives its output a zero
  // point.
  bool zero_point_readers(Entry e, const std::function<bool(const Node*, Entry)>& reads);

 private:
  void add_inputs();
  void add_node(const Node* n);
  void add_outputs(const std::vector<MXTensor>& outs);
  void uses(const std::vector<std::pair<int, Arg>>& args);  // by the next step
  bool shared(int v) const;  // another live value sits in v's buffer
  bool takes_int8(const Node* n, Entry e);
  bool fused_activation(const Node* n, Entry e);  // a post-op of its producer

  const Graph* graph_;
  const std::vector<MXTensor>* ins_;
  const std::vector<size_t>& same_;
  const Precision precision_;
  const std::vector<Range>& input_ranges_;
  const Readers readers_;
  dnnl::stream stream_;  // packing parameters
  std::vector<Step> steps_;
  std::vector<Buffer> bufs_;
  std::vector<Value> vals_;
  std::map<Entry, int> entry_;
  std::map<Entry, bool> int8_readers_;
  std::set<const Node*> done_;
  std::set<int> params_;   // region inputs packed as parameters
  std::map<const Node*, Dims> cut_indices_;
  size_t scratchpad_ = 0;  // the largest scratchpad a step needs
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

#endif  // MXAMP_ONEDNN_PLAN_H_
