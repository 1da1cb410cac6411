// The operator table: one row per MXNet operator the backend runs, naming
// the family (the file) that runs it and the facts the partitioner, the
// region and mxamp's Python side (mxamp_onednn_table) read.
#ifndef MXAMP_ONEDNN_TABLE_H_
#define MXAMP_ONEDNN_TABLE_H_

#include <string>
#include <vector>

#include "common.h"

namespace mxamp_onednn {

class Plan;
class Readers;

// An operator family: one file that runs a few related operators. Its
// functions get the row's variant, which says which of them a node is.
// What planning needs to know of a family's operators beyond adding them is
// a field or hook here, asked through the functions below (passed_to,
// passes_zero_point, computes_int8): the plan (plan.h) names no family.
struct Family {
  // Whether the node's attributes are a configuration the family runs.
  bool (*supported)(const Node* n, int variant);
  // Adds the node (and what it fuses) to the plan.
  void (*add)(Plan* plan, const Node* n, int variant);
  // Small shapes of the node's inputs (data, then parameters) made from its
  // attributes: partitioning plans the node alone on them, so a node that
  // partitions is one oneDNN runs. nullptr for operators without primitives
  // of their own.
  std::vector<Dims> (*probe)(const Node* n, int variant);
  // For operators that run only fused into their producer: whether n does.
  bool (*fuses)(const Node* n, const Readers& readers) = nullptr;
  // Whether n passes an INT8 value on as it is, zero point included, so
  // that the readers of its output read that zero point; nullptr: never.
  bool (*passes_zero_point)(const Node* n, int variant) = nullptr;
  // For post-ops: whether n, not fused, computes on INT8 itself (a table of
  // its answers), so that it takes INT8 though its row computes in float;
  // nullptr: never.
  bool (*computes_int8)(Plan* plan, const Node* n) = nullptr;
  // Whether each input has an output of its own (output k is input k);
  // else every input goes into output 0.
  bool output_per_input = false;
  // For a family whose rows name their variant by a name of its own (a
  // kind, table.cc): the variant of that name, -1 for none.
  int (*kind)(const std::string& name) = nullptr;
};

// Makes a family known to the table under the name its rows give it
// (table.cc). Each family's file defines its Family and one of these, so
// that a new family is its file and its rows:
//   const FamilyName kPoolingName("pooling", kPooling);
struct FamilyName {
  FamilyName(const char* name, const Family& family);
};

// The families that other files ask about (is(), op_of()), each defined in
// its own file, and their variants. Eltwise names its variants by kinds of
// its own (eltwise.cc), so that a new eltwise operator is one row and, for a
// new kind, one entry there.
extern const Family kCasts;          // casts.cc
enum CastVariant { kCast, kMulticast };
extern const Family kLinear;         // linear.cc
enum LinearVariant { kConvolution, kFullyConnected };
extern const Family kNormalisation;  // normalisation.cc
enum NormalisationVariant { kBatchNorm, kLayerNorm, kSoftmax };
extern const Family kBinary;         // binary.cc
extern const Family kBatchDot;       // batch_dot.cc
extern const Family kViews;          // views.cc
enum ViewVariant { kFlatten, kReshape, kTranspose };

// The data types an operator computes in.
enum DtypeBit : unsigned { kF32Bit = 1, kBF16Bit = 2, kInt8Bit = 4 };

// Its part in an INT8 region.
enum class Int8Role {
  kQuantizes,  // quantizes its data inputs where calibrated: INT8 starts here
  kQuantized,  // reads s8/u8 where its inputs are (and may requantize its output)
  kFloat,      // computes in float (unless fused as a post-op); its output is
               // requantized where calibrated and every reader takes INT8
  kNarrowest,  // as kFloat, in the narrowest type the CPU allows: bfloat16
               // where it has it, else it reads and writes s8/u8 with scales
  kNone        // computes nothing of its own: casts, views, BatchNorm (folded);
               // moves INT8 data on where its readers take it
};

struct Row {
  const char* op;
  const Family* family;
  int variant;
  unsigned dtypes;
  Int8Role int8;
  bool post_op;         // fuses into the primitive before it
  bool takes_post_ops;  // activations fuse into it as post-ops
  bool fused_only;      // runs only fused into its producer (Family::fuses)
  bool computes;        // false for casts and views: they move no data
  bool f32_inside;      // float32 inside from bfloat16 data, so conversion may
                        // keep it in float32 and the region still takes it
  bool f32_in_bf16;     // in bfloat16 regions (not INT8) it writes float32, and
                        // the layers, adds, matmuls and normalisations whose
                        // output it reads write that in float32: LayerNorm, so
                        // a transformer's residual stream (its adds, summed
                        // into FullyConnected outputs) stays float32 as in
                        // MXNet's own bfloat16 graph (docs/onednn.md)
  bool apart;           // keeps images apart: each index of axis 0 of its
                        // output reads only that index of its data inputs',
                        // so a region of such operators runs a batch in chunks
  std::vector<int> params;  // inputs that are parameters the region packs
  std::vector<int> aux;     // inputs MXNet counts as auxiliary states: the
                            // operator updates them in place (FMutateInputs)

  bool computes_in(memory::data_type dt) const;
  bool is_param(int input) const;  // whether input `input` is in params
  bool is_aux(int input) const;    // whether input `input` is in aux
  // Whether its outputs carry its data as they are (Int8Role::kNone: it
  // computes nothing of its own), so that they are written in the type
  // their readers ask for.
  bool passes_data_on() const { return int8 == Int8Role::kNone; }
};

// The row of node n's operator; nullptr for variables and operators the
// table does not hold.
const Row* row_of(const Node* n);

// The operator of `variant` of `family` (its row's name), for nodes a pass
// adds.
const char* op_of(const Family& family, int variant);

// Whether n is a variable (a graph input), not an operator.
bool is_variable(const Node* n);

// Whether n's row is `variant` of `family`.
bool is(const Node* n, const Family& family, int variant = -1);

// The output of n that its input k goes into: output k where the family
// has an output per input (amp_multicast), else output 0.
Entry passed_to(const Node* n, size_t k);

// The input whose value output e of such a node (a cast) carries: the
// inverse of passed_to.
Entry passed_from(Entry e);

// Whether n passes an INT8 value on with its zero point
// (Family::passes_zero_point); false for nodes without a row.
bool passes_zero_point(const Node* n);

// Whether post-op n computes on INT8 itself (Family::computes_int8).
bool computes_int8(Plan* plan, const Node* n);

// Whether n is part of a weight's dequantization, as the finishing pass
// writes s8 weights into INT8 regions (s8_weights.h): weight = Cast(s8 weights) times a
// scale per output channel, the s8 weights, the scales (and folded biases)
// pieces that a _split_v2 cuts from a packed input. No row: the partitioner
// never chooses these; the layer reading the weight reads through them
// (weights.cc, Plan::param_of).
bool dequantizes(const Node* n);
bool casts_weights(const Node* n);  // the Cast of s8 weights to float32
bool cuts_pack(const Node* n);      // the _split_v2 cutting a packed input (its one input)
// An amp_cast of what one of the above computes (a float pack's piece that
// the layer reading it took through a cast): the plan reads the parameter
// under it, in float32.
bool casts_param(const Node* n);
// Whether n gives a layer s8 weights dequantized in the graph (a piece of a
// float pack, a _split_v2 of a variable, is float32 weights).
bool dequantizes_s8(const Node* n);
// Their operators, for the pass that writes them (s8_weights.cc).
extern const char kWeightCastOp[], kScaleMulOp[], kPackCutOp[];

// The table as a JSON list, for mxamp.backends.onednn.operator_table().
std::string table_json();

// The layers with weights of a graph (JSON: a model, or a region's subgraph
// with its inputs' ranges as review_subgraph writes them) as INT8 regions
// take them, a JSON list for mxamp.backends.onednn.int8_layers
// (int8_layers.cc).
std::string int8_layers(const std::string& graph_json, const std::string& input_ranges);

// The INT8 layers of a model's INT8 regions (JSON: the whole model, each
// region's subgraph read once) that read float32 weights, for
// mxamp.backends.onednn.float32_weight_layers: a "<region node> <layer's
// node in its subgraph>\t<the finishing pass's reason, "" where it gave
// none>" line each (int8_layers.cc).
std::string float32_weight_layers(const std::string& model_json);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_TABLE_H_
