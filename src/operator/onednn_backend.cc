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
// The partitioner option "compute" (bfloat16 by default, float32 or int8) sets
// the data type the regions compute in; float32 runs the same chains on any x86
// CPU oneDNN supports, so regions can be checked tightly against MXNet there.
//
// INT8 (compute "int8") uses calibration the graph carries as node attributes:
// __mxamp_amax__ (symmetric threshold T) and __mxamp_min__ (smallest value) of
// an operator's output 0 or of a variable; __mxamp_float__ = "1" keeps a node
// in float32. Convolution / FullyConnected whose input is INT8 or calibrated
// run in INT8: activations u8 when min >= 0, else s8, with oneDNN's scale
// convention real = int * scale, scale = T / 255 (u8) or T / 127 (s8);
// weights s8 with a scale per output channel (max |w| / 127 after BatchNorm
// folding; / 64 where CPUs without VNNI would saturate, see weight_levels); s32
// accumulation; bias float32 (oneDNN 3 adds it after the scales, so it needs
// no requantization). The output is requantized to u8/s8 when its node (the
// last one fused) is calibrated and every reader in the region takes INT8,
// else it is float32. Pooling, Flatten / Reshape and adds pass INT8 on (same
// scale; an add, with an activation after it as post-op, requantizes to its
// own) where what reads them takes INT8; everything else (activations not
// fused as post-ops too), and every node without calibration, computes in
// float32.
// Region inputs are quantized where first read, INT8 values dequantized at
// region outputs or before a float32 reader.
#include <dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
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

const auto kF32 = memory::data_type::f32;
const auto kS8 = memory::data_type::s8;
const auto kU8 = memory::data_type::u8;

bool is_int8(memory::data_type t) { return t == kS8 || t == kU8; }

// Whether oneDNN creates an INT8 convolution with an optimised (not
// reference) kernel: the INT8 instructions it needs are there.
bool int8_convolution_runs() {
  try {
    const auto any = memory::format_tag::any;
    dnnl::convolution_forward::primitive_desc pd(
        cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc({1, 8, 8, 8}, kU8, any), memory::desc({8, 8, 3, 3}, kS8, any),
        memory::desc({1, 8, 6, 6}, kU8, any), {1, 1}, {0, 0}, {0, 0});
    return std::string(pd.impl_info_str()).rfind("ref", 0) != 0;
  } catch (const dnnl::error&) {
    return false;
  }
}

// Whether oneDNN runs on one of `isas` (it honours ONEDNN_MAX_CPU_ISA).
bool cpu_isa_in(std::initializer_list<dnnl::cpu_isa> isas) {
  return std::count(isas.begin(), isas.end(), dnnl::get_effective_cpu_isa()) > 0;
}

// AVX-512 (F, BW, VL, DQ: oneDNN's avx512_core) or more.
bool cpu_has_avx512() {
  using isa = dnnl::cpu_isa;
  return cpu_isa_in({isa::avx512_core, isa::avx512_core_vnni, isa::avx512_core_bf16,
                     isa::avx512_core_fp16, isa::avx512_core_amx, isa::avx512_core_amx_fp16});
}

// bfloat16 dot products in hardware (AVX512-BF16 or AMX).
bool cpu_has_bf16() {
  using isa = dnnl::cpu_isa;
  return cpu_isa_in({isa::avx512_core_bf16, isa::avx512_core_fp16, isa::avx512_core_amx,
                     isa::avx512_core_amx_fp16});
}

// INT8 dot products in one instruction (VNNI).
bool cpu_has_vnni() {
  using isa = dnnl::cpu_isa;
  return cpu_has_bf16() || cpu_isa_in({isa::avx2_vnni, isa::avx2_vnni_2, isa::avx512_core_vnni});
}

// The levels of s8 weights read with data of type src. Without VNNI oneDNN's
// kernels multiply u8 data by s8 weights with vpmaddubsw, which sums pairs
// into a saturating s16: 255 * 127 * 2 overflows, 255 * 64 * 2 = 32640 fits.
// s8 data is shifted by +128 to u8 first; oneDNN 3.2's convolutions then
// halve the weights themselves (scale_adjust 0.5), its inner products (gemm,
// brgemm) do not. So +-64 for u8 data, and for s8 data in FullyConnected.
// For data >= 0, u8 stays the better choice: s8 would halve the data's levels
// as well. u8 data at T / 127 would allow +-127 but needs clipping at T,
// which reorders cannot do.
int weight_levels(bool conv, memory::data_type src) {
  return cpu_has_vnni() || (conv && src == kS8) ? 127 : 64;
}

// Whether this CPU computes in `compute` (s8 for INT8); a capped ISA turns
// the backend off.
bool cpu_supports(memory::data_type compute) {
  if (compute == kS8) {
    static const bool int8 = int8_convolution_runs();
    return int8;
  }
  return compute != memory::data_type::bf16 || cpu_has_bf16();
}

// The compute data type named by the partitioner option "compute"; s8
// stands for "int8" (INT8 where calibrated, float32 elsewhere).
memory::data_type compute_type(const Attrs& options) {
  auto it = options.find("compute");
  if (it == options.end() || it->second == "bfloat16") return memory::data_type::bf16;
  if (it->second == "float32") return kF32;
  if (it->second == "int8") return kS8;
  throw std::invalid_argument("option compute must be bfloat16, float32 or int8, got '" +
                              it->second + "'");
}

std::string compute_name(memory::data_type compute) {
  return compute == kS8 ? "int8" : compute == kF32 ? "float32" : "bfloat16";
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
  if (v.empty() || v == "None") return fallback;
  try {
    return std::stod(v);
  } catch (const std::logic_error&) {  // invalid_argument, out_of_range
    throw std::invalid_argument("node " + n->name + ": attribute " + key + " = '" + v +
                                "' is not a number");
  }
}

// A calibrated tensor: its symmetric threshold and the smallest value seen.
struct Range {
  double amax = 0, min = 0;
  bool known() const { return amax > 0 && std::isfinite(amax); }
  // Unsigned when the tensor never goes negative (after ReLU): a bit more
  // resolution for the same threshold.
  memory::data_type type() const { return min >= 0 ? kU8 : kS8; }
  // The real value of one INT8 step.
  float scale() const { return static_cast<float>(amax / (min >= 0 ? 255 : 127)); }
};

Range range_attr(const Node* n) {
  return {number(n, "__mxamp_amax__", 0), number(n, "__mxamp_min__", 0)};
}

bool keeps_float(const Node* n) { return flag(n, "__mxamp_float__", false); }

// ------------------------------------------------------------ the operator table
//
// One row per operator this backend runs: everything the partitioner, the
// region and mxamp's Python side (through mxamp_onednn_table) know about it.
// Operator names appear only here.

// How the code tells rows apart (a family and, within it, the variant).
enum class Kind {
  kCast, kMulticast, kConvolution, kFullyConnected, kBatchNorm, kAdd, kPooling, kSoftmax,
  kLayerNorm, kBatchDot, kFlatten, kReshape, kTranspose,
  kActivation,  // act_type picks the eltwise
  kEltwise,     // the operator picks it: relu, sigmoid, tanh
  kLeakyReLU, kMulScalar, kDivScalar, kClip
};

// The data types an operator computes in (DtypeBit flags).
enum DtypeBit : unsigned { kF32Bit = 1, kBF16Bit = 2, kInt8Bit = 4 };
constexpr unsigned kFloats = kF32Bit | kBF16Bit, kAllTypes = kFloats | kInt8Bit;

// Its part in an INT8 region.
enum class Int8Role {
  kQuantized,  // reads s8/u8 (and may requantize its output)
  kFloat,      // computes in float32 (unless fused as a post-op)
  kNone        // computes nothing of its own: casts, views, BatchNorm (folded)
};

struct Row {
  const char* op;
  Kind kind;
  unsigned dtypes;
  Int8Role int8;
  bool post_op;         // fuses into the primitive before it
  bool takes_post_ops;  // what post-ops fuse into
  bool computes;        // false for casts and views: they move no data
  bool f32_inside;      // float32 inside from bfloat16 data (see f32_inside())
  std::vector<int> params;  // inputs that are parameters the region packs

  bool computes_in(memory::data_type dt) const {
    unsigned bit = dt == memory::data_type::f32 ? kF32Bit
                   : dt == memory::data_type::bf16 ? kBF16Bit : kInt8Bit;
    return (dtypes & bit) != 0;
  }
};

const std::vector<Row>& table() {
  using K = Kind;
  using R = Int8Role;
  const std::vector<int> none, weights = {1, 2}, norm = {1, 2, 3, 4}, scale_shift = {1, 2};
  // op, kind, dtypes, int8 role, post_op, takes_post_ops, computes, f32_inside, params
  static const std::vector<Row> rows = {
      {"amp_cast", K::kCast, kAllTypes, R::kNone, false, false, false, false, none},
      {"amp_multicast", K::kMulticast, kAllTypes, R::kNone, false, false, false, false, none},
      {"Convolution", K::kConvolution, kAllTypes, R::kQuantized, false, true, true, false, weights},
      {"FullyConnected", K::kFullyConnected, kAllTypes, R::kQuantized, false, true, true, false,
       weights},
      {"BatchNorm", K::kBatchNorm, kAllTypes, R::kNone, true, true, true, false, norm},
      {"elemwise_add", K::kAdd, kAllTypes, R::kQuantized, false, true, true, false, none},
      {"Pooling", K::kPooling, kAllTypes, R::kQuantized, false, false, true, false, none},
      {"softmax", K::kSoftmax, kFloats, R::kFloat, false, false, true, true, none},
      {"LayerNorm", K::kLayerNorm, kFloats, R::kFloat, false, false, true, true, scale_shift},
      {"batch_dot", K::kBatchDot, kFloats, R::kFloat, false, false, true, false, none},
      {"Flatten", K::kFlatten, kAllTypes, R::kNone, false, false, false, false, none},
      {"Reshape", K::kReshape, kAllTypes, R::kNone, false, false, false, false, none},
      {"transpose", K::kTranspose, kFloats, R::kFloat, false, false, true, false, none},
      {"Activation", K::kActivation, kFloats, R::kFloat, true, false, true, false, none},
      {"relu", K::kEltwise, kFloats, R::kFloat, true, false, true, false, none},
      {"sigmoid", K::kEltwise, kFloats, R::kFloat, true, false, true, false, none},
      {"tanh", K::kEltwise, kFloats, R::kFloat, true, false, true, false, none},
      {"LeakyReLU", K::kLeakyReLU, kFloats, R::kFloat, true, false, true, false, none},
      {"_mul_scalar", K::kMulScalar, kFloats, R::kFloat, true, false, true, false, none},
      {"_div_scalar", K::kDivScalar, kFloats, R::kFloat, true, false, true, false, none},
      {"clip", K::kClip, kFloats, R::kFloat, true, false, true, false, none},
  };
  return rows;
}

// The row of node n's operator; nullptr for variables and operators the
// table does not hold.
const Row* row_of(const Node* n) {
  static const std::map<std::string, const Row*> by_op = [] {
    std::map<std::string, const Row*> out;
    for (const Row& r : table()) out[r.op] = &r;
    return out;
  }();
  auto it = by_op.find(n->op);
  return it == by_op.end() ? nullptr : it->second;
}

bool is_variable(const Node* n) { return n->op == "null"; }
bool is_kind(const Node* n, Kind k) {
  const Row* r = row_of(n);
  return r && r->kind == k;
}

// The table as JSON for mxamp.backends.onednn.operator_table().
std::string table_json() {
  static const std::pair<unsigned, const char*> dtypes[] = {
      {kF32Bit, "float32"}, {kBF16Bit, "bfloat16"}, {kInt8Bit, "int8"}};
  std::ostringstream out;
  out << '[';
  for (const Row& r : table()) {
    out << (&r == &table().front() ? "" : ",") << "{\"op\":\"" << r.op << "\",\"dtypes\":[";
    const char* sep = "";
    for (const auto& d : dtypes)
      if (r.dtypes & d.first) out << sep << '"' << d.second << '"', sep = ",";
    out << "],\"int8\":\""
        << (r.int8 == Int8Role::kQuantized ? "quantized"
            : r.int8 == Int8Role::kFloat   ? "float"
                                           : "none")
        << "\",\"post_op\":" << (r.post_op ? "true" : "false")
        << ",\"f32_inside\":" << (r.f32_inside ? "true" : "false") << ",\"params\":[";
    for (size_t i = 0; i < r.params.size(); ++i) out << (i ? "," : "") << r.params[i];
    out << "]}";
  }
  out << ']';
  return out.str();
}

// -------------------------------------------------------- supported operators

struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
};

// The oneDNN eltwise for an activation node, if it is one we run.
bool eltwise_of(const Node* n, Eltwise* e) {
  // Activation's act_type values, and the operators of the same names
  // (mx.sym.relu ...).
  static const std::map<std::string, Eltwise> activations = {
      {"relu", {dnnl::algorithm::eltwise_relu}},
      {"sigmoid", {dnnl::algorithm::eltwise_logistic}},
      {"tanh", {dnnl::algorithm::eltwise_tanh}},
      {"softrelu", {dnnl::algorithm::eltwise_soft_relu, 1.f}}};
  const Row* row = row_of(n);
  if (!row) return false;
  const std::string act = attr(n, "act_type");
  double scalar = number(n, "scalar", 1);
  switch (row->kind) {
    case Kind::kActivation:
    case Kind::kEltwise: {
      auto found = activations.find(row->kind == Kind::kActivation ? act : n->op);
      if (found == activations.end()) return false;
      *e = found->second;
      return true;
    }
    case Kind::kLeakyReLU:
      if (act == "gelu") *e = {dnnl::algorithm::eltwise_gelu_erf};
      else if (act == "leaky" || act.empty())
        *e = {dnnl::algorithm::eltwise_relu, static_cast<float>(number(n, "slope", 0.25))};
      else return false;
      return true;
    case Kind::kMulScalar:
      *e = {dnnl::algorithm::eltwise_linear, static_cast<float>(scalar), 0.f};
      return true;
    case Kind::kDivScalar:
      if (scalar == 0) return false;
      *e = {dnnl::algorithm::eltwise_linear, static_cast<float>(1 / scalar), 0.f};
      return true;
    case Kind::kClip:
      *e = {dnnl::algorithm::eltwise_clip, static_cast<float>(number(n, "a_min", 0)),
            static_cast<float>(number(n, "a_max", 0))};
      return true;
    default:
      return false;
  }
}

bool is_cast(const Node* n) { return is_kind(n, Kind::kCast) || is_kind(n, Kind::kMulticast); }
bool is_add(const Node* n) { return is_kind(n, Kind::kAdd); }
bool layout_nchw(const Node* n) {
  std::string l = attr(n, "layout", "None");
  return l == "None" || l == "NCHW";
}

// Whether oneDNN pools as MXNet does with this Pooling's attributes.
bool pooling_supported(const Node* n) {
  std::string type = attr(n, "pool_type", "max");
  std::string conv = attr(n, "pooling_convention", "valid");
  if ((type != "max" && type != "avg") || !layout_nchw(n) || (conv != "valid" && conv != "full"))
    return false;
  if (flag(n, "global_pool", false)) return true;
  Dims kernel = ints(attr(n, "kernel")), stride = ints(attr(n, "stride"));
  Dims pad = ints(attr(n, "pad"));
  if (kernel.size() != 2) return false;
  if (stride.size() != 2) stride = {1, 1};
  if (pad.size() != 2) pad = {0, 0};
  bool padded = false;
  for (int i = 0; i < 2; ++i) {
    // oneDNN needs every window to reach into the input: pad < kernel, and
    // with "full" (the last window ends up to stride - 1 past the pad)
    // pad + stride <= kernel.
    if (pad[i] >= kernel[i] || (conv == "full" && pad[i] + stride[i] > kernel[i])) return false;
    padded |= pad[i] != 0;
  }
  // An average "full" window may run past input + pad; MXNet then divides
  // by its part inside input + pad, oneDNN by the whole window or by the
  // part inside the input, which agree with it only without pad.
  return !(type == "avg" && conv == "full" && padded && flag(n, "count_include_pad", true));
}

// Whether the node, taken alone, is an operator configuration this backend
// runs. BatchNorm additionally needs a convolution to fold into (foldable).
bool supported(const Node* n) {
  const Row* row = row_of(n);
  if (!row) return false;
  Eltwise e;
  switch (row->kind) {
    case Kind::kCast: case Kind::kMulticast: case Kind::kAdd: case Kind::kFlatten:
    case Kind::kFullyConnected: case Kind::kBatchDot:
      return true;
    case Kind::kReshape: {  // plain sizes, 0 (keep) and -1 (infer)
      Dims shape = ints(attr(n, "shape"));
      return !flag(n, "reverse", false) && !shape.empty() &&
             std::all_of(shape.begin(), shape.end(), [](int64_t x) { return x >= -1; });
    }
    case Kind::kTranspose:
      return !ints(attr(n, "axes")).empty();
    case Kind::kConvolution:
      return ints(attr(n, "kernel")).size() == 2 && layout_nchw(n);
    // Normalised over the last axis only (what oneDNN runs), no extras.
    case Kind::kSoftmax:
      return attr(n, "axis", "-1") == "-1" && !flag(n, "use_length", false) &&
             number(n, "temperature", 1) == 1;
    case Kind::kLayerNorm:
      return attr(n, "axis", "-1") == "-1" && !flag(n, "output_mean_var", false);
    case Kind::kBatchNorm:
      return attr(n, "axis", "1") == "1" && !flag(n, "output_mean_var", false);
    case Kind::kPooling:
      return pooling_supported(n);
    default:
      return eltwise_of(n, &e);
  }
}

// Operators conversion keeps in float32 for accuracy that oneDNN computes in
// float32 internally from bfloat16 data (only the output is rounded).
bool f32_inside(const Node* n) { return row_of(n)->f32_inside; }

bool computes(const Node* n) { return row_of(n)->computes; }

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
      if (!is_kind(r[0], Kind::kCast)) return r[0];
      if (passed) passed->push_back(r[0]);
      e = {r[0], 0};
    }
  }

 private:
  std::map<Entry, std::vector<const Node*>> readers_;
};

// The entry `e` is a cast of (or `e` itself).
Entry source(Entry e) {
  while (is_cast(e.first)) {
    const NodeEntry& in = e.first->inputs[is_kind(e.first, Kind::kCast) ? 0 : e.second];
    e = {in.node, in.entry};
  }
  return e;
}

// The node producing `e`, looking through casts.
const Node* producer(Entry e) { return source(e).first; }

// The calibrated range of `e` given on the node producing it: an operator's
// output 0 or a variable.
Range source_range(Entry e) {
  Entry s = source(e);
  return s.second == 0 ? range_attr(s.first) : Range();
}

// The ranges of the tensors each node reads, by (node name, input slot),
// noted by the selector for review_subgraph: MXNet gives a region's input
// variables none of the attributes of the nodes they stand for.
// Partitioning handles one graph at a time; the lock guards against threads.
std::map<std::pair<std::string, int>, Range> read_ranges;
std::mutex read_ranges_lock;

void note_ranges(const Graph* g) {
  std::lock_guard<std::mutex> hold(read_ranges_lock);
  read_ranges.clear();
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    for (size_t k = 0; k < n->inputs.size(); ++k) {
      Range r = source_range({n->inputs[k].node, n->inputs[k].entry});
      if (r.known()) read_ranges[{n->name, static_cast<int>(k)}] = r;
    }
  }
}

void check(const Node* n, memory::data_type dt);

// What the last partitioning tells mxamp.backends.onednn, which reads it
// (mxamp_onednn_fallbacks / _error) under its partitioning lock: the nodes
// left on MXNet because oneDNN cannot run them here, one "name\top\treason"
// line each, and its error (MXNet drops a partitioner's own message).
struct Report {
  std::string fallbacks, error;
};
Report last_report;
std::mutex last_report_lock;

void report_error(const std::string& message) {
  std::lock_guard<std::mutex> hold(last_report_lock);
  last_report.error = message;
  MX_ERROR_MSG << message;
}

// A BatchNorm folds into the convolution before it when it is that
// convolution's only reader and only its output 0 is read.
bool foldable(const Node* bn, const Readers& readers) {
  const Node* conv = producer({bn->inputs[0].node, bn->inputs[0].entry});
  return is_kind(conv, Kind::kConvolution) && readers.sole({conv, 0}) == bn &&
         readers.of({bn, 1}).empty() && readers.of({bn, 2}).empty();
}

// A region is worth running when it computes something, and can run when
// each BatchNorm folds into a convolution of the region.
bool review_region(const Graph* g) {
  Readers readers(g);
  bool any_compute = false;
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    if (is_variable(n)) continue;
    any_compute |= computes(n);
    if (is_kind(n, Kind::kBatchNorm) && !foldable(n, readers)) return false;
  }
  return any_compute;
}

// ------------------------------------------------------------ the partitioner

// The comma-separated node names of option `key` (none when not given).
std::set<std::string> names(const Attrs& options, const std::string& key) {
  std::set<std::string> out;
  auto it = options.find(key);
  if (it == options.end()) return out;
  std::istringstream in(it->second);
  for (std::string name; std::getline(in, name, ',');) out.insert(name);
  return out;
}


class Selector : public CustomOpSelector {
 public:
  Selector(const Graph* g, const Attrs& options) : ok_(g->size(), false) {
    memory::data_type compute = compute_type(options);
    if (compute == kS8) note_ranges(g);
    if (!cpu_supports(compute)) return;
    // With a converted model (option bf16_nodes given), only nodes the
    // conversion put in bfloat16 are offloaded (plus casts); a float32 model
    // is offloaded whole. Nodes reading or writing other types (other_types:
    // float64, integers) stay out: regions read and write float32.
    bool converted = options.count("bf16_nodes") > 0;
    std::set<std::string> bf16_nodes = names(options, "bf16_nodes");
    std::set<std::string> other_types = names(options, "other_types");
    // INT8 regions compute in float32 where not INT8.
    memory::data_type dt = compute == kS8 ? kF32 : compute;
    std::map<const Node*, size_t> index;
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* n = g->getNode(i);
      index[n] = i;
      if (is_variable(n) || !supported(n) || other_types.count(n->name)) continue;
      if (!row_of(n)->computes_in(dt)) continue;
      ok_[i] = !converted || is_cast(n) || bf16_nodes.count(n->name) || f32_inside(n);
    }
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* n = g->getNode(i);
      if (!ok_[i]) continue;
      // Parameters (weights, bias, statistics) are packed from the region's
      // inputs, so what computes them stays outside.
      for (int k : row_of(n)->params) {
        if (static_cast<size_t>(k) >= n->inputs.size()) continue;
        const Node* p = producer({n->inputs[k].node, n->inputs[k].entry});
        if (!is_variable(p)) ok_[index[p]] = false;
      }
    }
    std::ostringstream fallbacks;
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* n = g->getNode(i);
      if (!ok_[i]) continue;
      try {
        check(n, dt);
      } catch (const dnnl::error& e) {
        ok_[i] = false;
        fallbacks << n->name << '\t' << n->op << '\t' << e.what() << " in "
                  << compute_name(dt) << '\n';
      }
    }
    std::lock_guard<std::mutex> hold(last_report_lock);
    last_report.fallbacks = fallbacks.str();
    // A BatchNorm goes only with the convolution it folds into.
    Readers readers(g);
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* n = g->getNode(i);
      if (ok_[i] && is_kind(n, Kind::kBatchNorm))
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
  {
    std::lock_guard<std::mutex> hold(last_report_lock);
    last_report = Report();
  }
  try {
    *sel = new Selector(g, options);
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    report_error(std::string("mxamp_onednn: selecting nodes failed: ") + e.what());
    return MX_FAIL;
  }
}

// The ranges of the region's inputs, in order, as "amax,min" (empty when
// not calibrated) separated by ';', found by a node reading each input.
std::string input_ranges(const Graph* g) {
  std::lock_guard<std::mutex> hold(read_ranges_lock);
  std::ostringstream out;
  out.precision(17);
  for (size_t i = 0; i < g->inputs.size(); ++i) {
    if (i) out << ';';
    for (size_t j = 0; j < g->size(); ++j) {
      const Node* n = g->getNode(j);
      for (size_t k = 0; k < n->inputs.size(); ++k) {
        auto r = read_ranges.find({n->name, static_cast<int>(k)});
        if (n->inputs[k].node != g->inputs[i] || r == read_ranges.end()) continue;
        out << r->second.amax << ',' << r->second.min;
        j = g->size();
        break;
      }
    }
  }
  return out.str();
}

std::vector<Range> parse_ranges(const std::string& s) {
  std::vector<Range> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ';');) {
    Range r;
    size_t comma = item.find(',');
    if (comma != std::string::npos)
      r = {std::stod(item.substr(0, comma)), std::stod(item.substr(comma + 1))};
    out.push_back(r);
  }
  return out;
}

// The region node records its compute type, so a saved model keeps it, and
// for INT8 its inputs' ranges.
MXReturnValue review_subgraph(const Graph* g, int, bool* accept, const Attrs& options,
                              Attrs* node_attrs) {
  try {
    *accept = review_region(g);
    memory::data_type compute = compute_type(options);
    (*node_attrs)["compute"] = compute_name(compute);
    if (compute == kS8) (*node_attrs)["input_ranges"] = input_ranges(g);
    // apply_backend partitions without shape inference, so MXNet annotates
    // this region node with an empty shape per output ("[,]"); its
    // getShapeAt throws std::out_of_range on such a list for any output
    // index past 0, i.e. when a later region reads this region's second
    // output. One well-formed unknown shape per output avoids that.
    std::string shapes = "[";
    for (size_t i = 0; i < g->outputs.size(); ++i) shapes += i ? ",[None]" : "[None]";
    (*node_attrs)[MX_STR_SHAPE] = shapes + "]";
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    report_error(std::string("mxamp_onednn: reviewing a region failed: ") + e.what());
    return MX_FAIL;
  }
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

// ------------------------------------------------ primitive descriptors
//
// Builders shared by the executor and by check(): what a region runs is what
// partitioning checked.

// MXNet's Pooling of a 4-d src (its data type; dst layout left to oneDNN);
// `out` gets MXNet's output shape.
dnnl::pooling_forward::primitive_desc pooling_pd(const Node* n, const memory::desc& src,
                                                 Dims* out) {
  Dims d = src.get_dims();
  bool global = flag(n, "global_pool", false);
  Dims kernel = global ? Dims{d[2], d[3]} : ints(attr(n, "kernel"));
  Dims stride = global ? Dims{1, 1} : ints(attr(n, "stride", "(1, 1)"));
  Dims pad = global ? Dims{0, 0} : ints(attr(n, "pad", "(0, 0)"));
  if (stride.empty()) stride = {1, 1};
  if (pad.empty()) pad = {0, 0};
  bool full = attr(n, "pooling_convention", "valid") == "full";
  *out = {d[0], d[1], 0, 0};
  Dims pad_r = pad;
  for (int i = 0; i < 2; ++i) {
    int64_t span = d[2 + i] + 2 * pad[i] - kernel[i];
    (*out)[2 + i] = (full ? (span + stride[i] - 1) / stride[i] : span / stride[i]) + 1;
    pad_r[i] = ((*out)[2 + i] - 1) * stride[i] + kernel[i] - d[2 + i] - pad[i];
  }
  // MXNet divides an average by the window's part inside input + pad. That
  // is the whole window for "valid"; for "full" (without pad, see
  // supported()) it is the part inside the input.
  bool include_pad = flag(n, "count_include_pad", true) && !full;
  auto alg = attr(n, "pool_type", "max") == "max" ? dnnl::algorithm::pooling_max
             : include_pad ? dnnl::algorithm::pooling_avg_include_padding
                           : dnnl::algorithm::pooling_avg_exclude_padding;
  memory::desc dst_any(*out, src.get_data_type(), memory::format_tag::any);
  return dnnl::pooling_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_inference,
                                               alg, src, dst_any, stride, kernel, {0, 0}, pad,
                                               pad_r);
}

// softmax or LayerNorm (with scale and shift) over the last axis of md.
dnnl::primitive_desc normalisation_pd(const Node* n, const memory::desc& md) {
  if (is_kind(n, Kind::kSoftmax))
    return dnnl::softmax_forward::primitive_desc(
        cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, md,
        md, md.get_ndims() - 1);
  return dnnl::layer_normalization_forward::primitive_desc(
      cpu_engine(), dnnl::prop_kind::forward_inference, md, md,
      static_cast<float>(number(n, "eps", 1e-5)),
      dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift);
}

// Checks, when partitioning, that oneDNN runs node n in data type dt on this
// CPU: creates its primitive descriptors on small shapes made from its
// attributes (the real shapes are not known yet). Throws dnnl::error if not.
// Casts, views and BatchNorm (folded into weights) need no primitive of
// their own.
void check(const Node* n, memory::data_type dt) {
  const auto any = memory::format_tag::any;
  Eltwise e;
  const Kind kind = row_of(n)->kind;
  if (kind == Kind::kConvolution) {
    Dims k = ints(attr(n, "kernel")), stride = ints(attr(n, "stride", "(1, 1)"));
    Dims pad = ints(attr(n, "pad", "(0, 0)")), dil = ints(attr(n, "dilate", "(1, 1)"));
    if (stride.empty()) stride = {1, 1};
    if (pad.empty()) pad = {0, 0};
    if (dil.empty()) dil = {1, 1};
    int64_t groups = static_cast<int64_t>(number(n, "num_group", 1));
    int64_t filters = static_cast<int64_t>(number(n, "num_filter", 1));
    int64_t per_group = filters == groups ? 1 : 4;  // depthwise has one channel a group
    Dims src = {1, groups * per_group, 0, 0}, dst = {1, filters, 0, 0};
    for (int i = 0; i < 2; ++i) {
      int64_t extent = (k[i] - 1) * dil[i] + 1;
      src[2 + i] = extent + stride[i];
      dst[2 + i] = (src[2 + i] + 2 * pad[i] - extent) / stride[i] + 1;
      dil[i] -= 1;
    }
    Dims w = {groups, filters / groups, per_group, k[0], k[1]};
    dnnl::convolution_forward::primitive_desc(
        cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(src, dt, any), memory::desc(w, dt, any),
        memory::desc({filters}, kF32, memory::format_tag::a), memory::desc(dst, dt, any), stride,
        dil, pad, pad);
  } else if (kind == Kind::kFullyConnected) {
    int64_t hidden = static_cast<int64_t>(number(n, "num_hidden", 1));
    dnnl::inner_product_forward::primitive_desc(
        cpu_engine(), dnnl::prop_kind::forward_inference, plain({2, 16}, dt),
        memory::desc({hidden, 16}, dt, any), memory::desc({hidden}, kF32, memory::format_tag::a),
        plain({2, hidden}, dt));
  } else if (kind == Kind::kPooling) {
    Dims k = ints(attr(n, "kernel")), stride = ints(attr(n, "stride", "(1, 1)")), out;
    int64_t h = k.size() == 2 ? k[0] + (stride.empty() ? 1 : stride[0]) : 4;
    int64_t w = k.size() == 2 ? k[1] + (stride.empty() ? 1 : stride[1]) : 4;
    pooling_pd(n, memory::desc({1, 16, h, w}, dt, memory::format_tag::nchw), &out);
  } else if (kind == Kind::kSoftmax || kind == Kind::kLayerNorm) {
    normalisation_pd(n, plain({2, 3, 16}, dt));
  } else if (kind == Kind::kBatchDot) {
    auto side = [&](const char* key, int64_t r, int64_t c) {
      bool t = flag(n, key, false);
      return memory::desc({2, r, c}, dt, t ? Dims{r * c, 1, r} : Dims{r * c, c, 1});
    };
    dnnl::matmul::primitive_desc(cpu_engine(), side("transpose_a", 4, 8),
                                 side("transpose_b", 8, 4), plain({2, 4, 4}, dt));
  } else if (is_add(n)) {
    dnnl::binary::primitive_desc(cpu_engine(), dnnl::algorithm::binary_add, plain({2, 16}, dt),
                                 plain({2, 16}, dt), plain({2, 16}, dt));
  } else if (eltwise_of(n, &e)) {
    dnnl::eltwise_forward::primitive_desc(cpu_engine(), dnnl::prop_kind::forward_inference,
                                          e.alg, plain({2, 16}, dt), plain({2, 16}, dt), e.alpha,
                                          e.beta);
  } else if (kind == Kind::kTranspose) {
    dnnl::reorder::primitive_desc(cpu_engine(), plain({2, 16}, dt), cpu_engine(),
                                  memory::desc({2, 16}, dt, Dims{1, 2}));
  }
}

// md's layout holding data type dt; blocked layouts become dense (INT8
// activations are strided, nhwc, so they keep theirs).
memory::desc retyped(const memory::desc& md, memory::data_type dt) {
  if (md.get_inner_nblks() == 0) return memory::desc(md.get_dims(), dt, md.get_strides());
  return plain(md.get_dims(), dt);
}

// Scales as a runtime argument (DNNL_ARG_ATTR_SCALES).
memory scales(const std::vector<float>& s) {
  memory m(memory::desc({static_cast<int64_t>(s.size())}, kF32, memory::format_tag::a),
           cpu_engine());
  std::copy(s.begin(), s.end(), static_cast<float*>(m.get_data_handle()));
  return m;
}

// Per output channel of the weights w: the real value of one s8 step, for
// weights quantized to [-levels, levels].
std::vector<float> channel_scales(const std::vector<float>& w, int64_t channels, int levels) {
  size_t per = w.size() / channels;
  std::vector<float> out(channels);
  for (int64_t o = 0; o < channels; ++o) {
    float m = 0;
    for (size_t i = 0; i < per; ++i) m = std::max(m, std::abs(w[o * per + i]));
    out[o] = m > 0 ? m / levels : 1;
  }
  return out;
}

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
  float scale = 1;  // INT8: the real value of one step
  int uses = 0;     // reads still to come
  int input = -1;   // region input index, for parameters
  std::vector<int> copies;  // reordered (or requantized) versions
};

class Region : public CustomStatefulOp {
 public:
  Region(const std::string& json, memory::data_type compute, std::vector<Range> input_ranges)
      : graph_(Graph::fromString(json)),
        compute_(compute),
        dt_(compute == kS8 ? kF32 : compute),
        int8_(compute == kS8),
        input_ranges_(std::move(input_ranges)) {}
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
    if (!cpu_supports(compute_))
      throw std::runtime_error(
          compute_ == kS8
              ? "this region computes in INT8 but oneDNN has no INT8 kernels for this CPU (or "
                "ONEDNN_MAX_CPU_ISA); apply the backend to the model without regions on this "
                "machine"
              : "this region computes in bfloat16 but the CPU (or ONEDNN_MAX_CPU_ISA) offers no "
                "AVX512-BF16/AMX; apply the backend to the model without regions on this "
                "machine");
    for (const MXTensor& t : ins)
      if (t.dtype != kFloat32) throw std::runtime_error("region inputs must be float32");
    for (const MXTensor& t : outs)
      if (t.dtype != kFloat32) throw std::runtime_error("region outputs must be float32");
    steps_.clear(); bufs_.clear(); vals_.clear(); entry_.clear(); done_.clear();
    int8_readers_.clear();
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
      if (is_variable(n) || done_.count(n)) continue;
      add_node(n);
    }
    for (size_t j = 0; j < graph_->outputs.size(); ++j) {
      const NodeEntry& e = graph_->outputs[j];
      int v = value_of({e.node, e.entry});
      Dims dims(outs[j].shape.begin(), outs[j].shape.end());
      int b = new_buffer(plain(dims, kF32));
      bufs_[b].output = static_cast<int>(j);
      add_reorder(view(v, dims), {b, plain(dims, kF32)}, vals_[v].scale);
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

  int new_value(int buf, const memory::desc& md, const Dims& dims, Entry e, float scale = 1) {
    vals_.push_back({buf, md, dims, scale});
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

  bool is_int8(int v) const { return ::is_int8(vals_[v].md.get_data_type()); }

  // The calibrated range of an entry of the region (none unless INT8).
  Range range_of(Entry e) {
    if (!int8_) return {};
    Entry s = source(e);
    if (!is_variable(s.first)) return source_range(s);
    size_t i = static_cast<size_t>(vals_[value_of(s)].input);
    return i < input_ranges_.size() ? input_ranges_[i] : Range();
  }

  // Whether node n reads entry e as INT8. Operators with weights do (they
  // quantize their data); the other INT8 operators, casts and views, and
  // activations fused as post-ops pass INT8 on: they take it when their
  // output is read as INT8, else they compute in float32 and requantizing
  // before them only adds error.
  bool takes_int8(const Node* n, Entry e) {
    const Row* row = row_of(n);
    if (keeps_float(n)) return false;
    if (row->post_op && row->int8 == Int8Role::kFloat)
      return fused_activation(n, e) && int8_readers({n, 0});
    if (row->int8 == Int8Role::kFloat) return false;
    if (row->int8 == Int8Role::kQuantized && !row->params.empty())
      return Entry{n->inputs[0].node, n->inputs[0].entry} == e;
    for (size_t k = 0; k < n->inputs.size(); ++k) {  // a multicast has one output per input
      Entry out{n, row->kind == Kind::kMulticast ? static_cast<int>(k) : 0};
      if (Entry{n->inputs[k].node, n->inputs[k].entry} == e && !int8_readers(out)) return false;
    }
    return true;
  }

  // Whether activation n reading e is a post-op: the only reader of the
  // output of an operator post-ops fuse into (a convolution,
  // FullyConnected, BatchNorm (folded) or add).
  bool fused_activation(const Node* n, Entry e) {
    Entry s = source(e);
    const Row* producer = row_of(s.first);
    return s.second == 0 && readers_->sole(s) == n && producer && producer->takes_post_ops;
  }

  // Whether some node in the region reads e and all of them take INT8
  // (region outputs dequantize). Memoized: paths through adds can be many.
  bool int8_readers(Entry e) {
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

  // A reorder step, multiplying by `ratio` (to quantize, dequantize or
  // requantize).
  void add_reorder(std::pair<int, memory::desc> from, std::pair<int, memory::desc> to,
                   float ratio = 1) {
    dnnl::primitive_attr attr;
    std::unordered_map<int, memory> fixed;
    if (ratio != 1) {
      attr.set_scales_mask(DNNL_ARG_SRC, 0);
      fixed[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = scales({ratio});
    }
    add_step(dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), from.second, cpu_engine(),
                                                        to.second, attr)),
             {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}, std::move(fixed));
  }

  // Value v in layout md (reordered once and reused by later readers). An
  // INT8 md gets the given scale, or v's own for an INT8 v.
  std::pair<int, memory::desc> as(int v, const memory::desc& md, float scale = 0) {
    if (!::is_int8(md.get_data_type())) scale = 1;
    else if (scale == 0 && is_int8(v)) scale = vals_[v].scale;
    else if (scale == 0) throw std::logic_error("quantizing without a scale");
    if (vals_[v].md == md && vals_[v].scale == scale) return {vals_[v].buf, md};
    for (int c : vals_[v].copies)
      if (vals_[c].md == md && vals_[c].scale == scale) return {vals_[c].buf, md};
    int b = new_buffer(md);
    vals_.push_back({b, md, vals_[v].dims, scale});
    int copy = static_cast<int>(vals_.size()) - 1;
    vals_[v].copies.push_back(copy);
    add_reorder({vals_[v].buf, vals_[v].md}, {b, md}, vals_[v].scale / scale);
    return {b, md};
  }

  // Value v as a dense row-major tensor of shape dims (same element count,
  // data type and scale).
  std::pair<int, memory::desc> view(int v, const Dims& dims) {
    memory::data_type dt = vals_[v].md.get_data_type();
    auto dense = as(v, plain(vals_[v].md.get_dims(), dt));
    return {dense.first, plain(dims, dt)};
  }

  // Value v in the compute type with the layout oneDNN keeps it in (region
  // inputs and INT8 values become dense tensors of the compute type).
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

  // Packs float32 host data into `md` (blocked weights or f32 bias); s8
  // weights are divided by their scales along the dimensions in `mask`.
  memory pack(const float* data, const Dims& dims, const memory::desc& md,
              const std::vector<float>& scale = {}, int mask = 0) {
    memory src(plain(dims, kF32), cpu_engine(), const_cast<float*>(data));
    memory dst(md, cpu_engine());
    dnnl::primitive_attr attr;
    std::unordered_map<int, memory> args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    if (!scale.empty()) {
      attr.set_scales_mask(DNNL_ARG_DST, mask);
      args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales(scale);
    }
    dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src.get_desc(), cpu_engine(), md,
                                                attr))
        .execute(stream_, args);
    stream_.wait();
    return dst;
  }

  // ---- operators

  void add_node(const Node* n) {
    Eltwise e;
    const Row* row = row_of(n);
    const Kind kind = row ? row->kind : Kind::kEltwise;  // eltwise_of refuses unknown ops
    if (is_cast(n)) {
      // Casts vanish: values inside the region are in the compute type (or
      // INT8).
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        int v = value_of({n->inputs[i].node, n->inputs[i].entry});
        bind({n, static_cast<int>(i)}, v);
        vals_[v].uses--;
      }
    } else if (kind == Kind::kConvolution || kind == Kind::kFullyConnected) {
      add_linear(n);
    } else if (kind == Kind::kPooling) {
      add_pooling(n);
    } else if (kind == Kind::kSoftmax || kind == Kind::kLayerNorm) {
      add_normalisation(n);
    } else if (kind == Kind::kBatchDot) {
      add_batch_dot(n);
    } else if (kind == Kind::kFlatten || kind == Kind::kReshape) {
      int v = value_of({n->inputs[0].node, n->inputs[0].entry});
      Dims shape = reshaped(n, vals_[v].dims);
      auto src = view(v, shape);
      new_value(src.first, src.second, shape, {n, 0}, vals_[v].scale);
      consume({n->inputs[0].node, n->inputs[0].entry});
    } else if (kind == Kind::kTranspose) {
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

  // An add not fused into a convolution, and an activation that is its only
  // reader as post-op. INT8 operands are added in INT8 when the result is
  // requantized (oneDNN's INT8 add with a float32 output is a reference
  // kernel): their scales make them real, a last linear post-op scales to
  // the output's.
  void add_binary(const Node* n) {
    Entry a{n->inputs[0].node, n->inputs[0].entry}, b{n->inputs[1].node, n->inputs[1].entry};
    int va = value_of(a), vb = value_of(b);
    if (vals_[va].dims != vals_[vb].dims)
      throw std::runtime_error("add of different shapes in " + n->name);
    std::vector<const Node*> fused;
    Entry last{n, 0};
    Eltwise act;
    const Node* next = readers_->sole(last, &fused);
    bool has_act = next && eltwise_of(next, &act);
    if (has_act) {
      fused.push_back(next);
      last = {next, 0};
    } else {
      fused.clear();  // casts before other readers
    }
    Range out = range_of(last);
    bool q = is_int8(va) && is_int8(vb) && !keeps_float(n) && out.known() && int8_readers(last);
    // Operands kept as 2-d views (FullyConnected outputs) are read as dense
    // tensors of the MXNet shape.
    auto shaped = [&](int v) { return vals_[v].md.get_dims() == vals_[v].dims; };
    auto src0 = q ? (shaped(va) ? std::make_pair(vals_[va].buf, vals_[va].md)
                                : view(va, vals_[va].dims))
                  : (shaped(va) ? computed(va) : dense(va));
    auto like = q ? retyped(src0.second, vals_[vb].md.get_data_type()) : src0.second;
    auto src1 = shaped(vb) ? as(vb, like) : q ? view(vb, vals_[vb].dims) : dense(vb);
    auto dst = q ? retyped(src0.second, out.type()) : src0.second;
    dnnl::primitive_attr attr;
    dnnl::post_ops ops;
    std::unordered_map<int, memory> fixed;
    if (has_act) ops.append_eltwise(act.alg, act.alpha, act.beta);
    if (q) {
      for (auto arg : {std::make_pair(DNNL_ARG_SRC_0, va), std::make_pair(DNNL_ARG_SRC_1, vb)}) {
        attr.set_scales_mask(arg.first, 0);
        fixed[DNNL_ARG_ATTR_SCALES | arg.first] = scales({vals_[arg.second].scale});
      }
      ops.append_eltwise(dnnl::algorithm::eltwise_linear, 1 / out.scale(), 0.f);
    }
    attr.set_post_ops(ops);
    dnnl::binary::primitive_desc pd(cpu_engine(), dnnl::algorithm::binary_add, src0.second,
                                    src1.second, dst, attr);
    int buf = new_buffer(dst);
    new_value(buf, dst, vals_[va].dims, last, q ? out.scale() : 1);
    add_step(dnnl::binary(pd), {{DNNL_ARG_SRC_0, src0}, {DNNL_ARG_SRC_1, src1},
                                {DNNL_ARG_DST, {buf, dst}}}, std::move(fixed));
    consume(a);
    consume(b);
    for (const Node* f : fused) done_.insert(f);
  }

  // The shape a Flatten or Reshape node gives a tensor of shape d.
  static Dims reshaped(const Node* n, const Dims& d) {
    int64_t total = 1;
    for (int64_t x : d) total *= x;
    if (is_kind(n, Kind::kFlatten)) return {d[0], total / d[0]};
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
    const Dims d = vals_[v].dims;
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
    add_reorder({src.first, permuted}, {b, dst});
    new_value(b, dst, out, {n, 0});
    consume(data);
  }

  // softmax or LayerNorm over the last axis of a dense tensor, viewed as 2-d
  // (rows by last axis: oneDNN's layer normalisation needs 2 axes or more).
  void add_normalisation(const Node* n) {
    Entry data{n->inputs[0].node, n->inputs[0].entry};
    int v = value_of(data);
    const Dims d = vals_[v].dims;  // a copy: dense() below may grow vals_
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < d.size(); ++i) rows *= d[i];
    auto src = std::make_pair(dense(v).first, plain({rows, d.back()}, dt_));
    int out = new_buffer(src.second);
    std::unordered_map<int, memory> fixed;
    if (is_kind(n, Kind::kLayerNorm)) {
      Dims c = {d.back()};
      memory::desc cmd(c, kF32, memory::format_tag::a);
      fixed[DNNL_ARG_SCALE] = pack(param(n->inputs[1], c[0]), c, cmd);
      fixed[DNNL_ARG_SHIFT] = pack(param(n->inputs[2], c[0]), c, cmd);
    }
    add_step(dnnl::primitive(normalisation_pd(n, src.second)),
             {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {out, src.second}}}, std::move(fixed));
    new_value(out, src.second, d, {n, 0});
    consume(data);
  }

  // batch_dot of (..., M, K) by (..., K, N), either side transposed, as one
  // matmul over the flattened batch axes; transposes are strides.
  void add_batch_dot(const Node* n) {
    Entry a{n->inputs[0].node, n->inputs[0].entry}, b{n->inputs[1].node, n->inputs[1].entry};
    int va = value_of(a), vb = value_of(b);
    auto as_3d = [&](int v, bool transpose) {
      const Dims d = vals_[v].dims;
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
    const Dims d = vals_[v].dims;
    // INT8 input: pooled in INT8 at the same scale.
    bool q = is_int8(v) && !keeps_float(n);
    auto src = q ? std::make_pair(vals_[v].buf, vals_[v].md) : computed(v);
    Dims out;
    if (d.size() != 4) {
      // Global pooling over 1 or 3 spatial axes (MXNet accepts them; a
      // kernel fixes 2) is the same over a 4-d view: (N, C, rest, last).
      if (!flag(n, "global_pool", false) || d.size() < 3)
        throw std::runtime_error("Pooling " + n->name + " needs a 4-d input");
      Dims d4 = {d[0], d[1], 1, d.back()};
      for (size_t i = 2; i + 1 < d.size(); ++i) d4[2] *= d[i];
      src = q ? view(v, d4) : std::make_pair(dense(v).first, plain(d4, dt_));
      out = d;
      std::fill(out.begin() + 2, out.end(), 1);
    }
    Dims out4;
    auto pd = pooling_pd(n, src.second, &out4);
    int b = new_buffer(pd.dst_desc());
    new_value(b, pd.dst_desc(), out.empty() ? out4 : out, {n, 0}, q ? vals_[v].scale : 1);
    add_step(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {b, pd.dst_desc()}}});
    consume({n->inputs[0].node, n->inputs[0].entry});
  }

  // Convolution or FullyConnected with what follows it folded in: BatchNorm
  // into the weights, a residual add as sum post-op, an activation as
  // eltwise post-op.
  void add_linear(const Node* n) {
    bool conv = is_kind(n, Kind::kConvolution);
    Entry data{n->inputs[0].node, n->inputs[0].entry};
    int v = value_of(data);
    const Dims d = vals_[v].dims;
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
    if (conv && next && is_kind(next, Kind::kBatchNorm)) {
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

    // INT8 when the input is INT8 already or calibrated. The output is
    // requantized when calibrated, read as INT8 by all its readers and, with
    // a residual add, the other operand is INT8 too (it is summed in place).
    Range in = range_of(data), out = range_of(last);
    bool q = int8_ && !keeps_float(n) && (is_int8(v) || in.known());
    bool q_out = q && out.known() && int8_readers(last) && (sum_with < 0 || is_int8(sum_with));
    float src_scale = is_int8(v) ? vals_[v].scale : in.scale();
    memory::data_type src_dt = !q ? dt_ : is_int8(v) ? vals_[v].md.get_data_type() : in.type();
    memory::data_type dst_dt = q_out ? out.type() : dt_;
    float out_scale = q_out ? out.scale() : 1;
    // The residual operand sits in dst with its own type and scale (INT8) or
    // in dst's type (float).
    bool sum_int8 = q_out && sum_with >= 0;
    memory::data_type sum_dt = sum_int8 ? vals_[sum_with].md.get_data_type() : dst_dt;
    float sum_scale = sum_int8 ? vals_[sum_with].scale : 1;

    dnnl::post_ops ops;
    if (sum_with >= 0)
      ops.append_sum(sum_scale, 0, sum_dt == dst_dt ? memory::data_type::undef : sum_dt);
    if (has_act) ops.append_eltwise(act.alg, act.alpha, act.beta);
    dnnl::primitive_attr pattr;
    pattr.set_post_ops(ops);

    int64_t groups = conv ? static_cast<int64_t>(number(n, "num_group", 1)) : 1;
    int wmask = groups > 1 ? 3 : 1;  // output channels: (group, channel) or channel
    std::vector<float> wscales;
    std::unordered_map<int, memory> fixed;
    if (q) {
      wscales = channel_scales(weights, out_ch, weight_levels(conv, src_dt));
      pattr.set_scales_mask(DNNL_ARG_SRC, 0);
      pattr.set_scales_mask(DNNL_ARG_WEIGHTS, wmask);
      fixed[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = scales({src_scale});
      fixed[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = scales(wscales);
    }
    if (q_out) {
      pattr.set_scales_mask(DNNL_ARG_DST, 0);
      fixed[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales({out_scale});
    }
    memory::data_type wdt = q ? kS8 : dt_;

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
      out_dims = {d[0], out_ch, 0, 0};
      for (int i = 0; i < 2; ++i) {
        out_dims[2 + i] = (d[2 + i] + 2 * pad[i] - ((k[i] - 1) * dil[i] + 1)) / stride[i] + 1;
        dil[i] -= 1;  // oneDNN counts dilation from 0
      }
      if (groups > 1) wdims = {groups, out_ch / groups, wshape[1], k[0], k[1]};
      auto any = memory::format_tag::any;
      dnnl::convolution_forward::primitive_desc pd(
          cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
          memory::desc(d, src_dt, any), memory::desc(wdims, wdt, any), bias_md,
          memory::desc(out_dims, dst_dt, any), stride, dil, pad, pad, pattr);
      src = as(v, pd.src_desc(), src_scale);
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
      memory::desc src_md({rows, cols}, src_dt, memory::format_tag::ab);
      dnnl::inner_product_forward::primitive_desc pd(
          cpu_engine(), dnnl::prop_kind::forward_inference, src_md,
          memory::desc(wdims, wdt, memory::format_tag::any), bias_md,
          memory::desc({rows, out_ch}, dst_dt, memory::format_tag::ab), pattr);
      auto dense = as(v, plain(vals_[v].md.get_dims(), src_dt), src_scale);
      src = {dense.first, src_md};
      dst_md = pd.dst_desc();
      w_md = pd.weights_desc();
      prim = dnnl::inner_product_forward(pd);
    }

    // The residual operand is written into dst first; when nothing else
    // reads it and its layout matches, the add happens in its own buffer.
    int out_buf;
    if (sum_with >= 0) {
      memory::desc sum_md = sum_dt == dst_dt ? dst_md : retyped(dst_md, sum_dt);
      const Value& o = vals_[sum_with];
      if (o.uses == 1 && bufs_[o.buf].input < 0 && !shared(sum_with) && o.md == sum_md) {
        out_buf = o.buf;
      } else {
        out_buf = new_buffer(dst_md);
        float ratio = o.scale / sum_scale;
        auto from = o.md.get_dims() == dst_md.get_dims() ? std::make_pair(o.buf, o.md)
                                                         : view(sum_with, dst_md.get_dims());
        add_reorder(from, {out_buf, sum_md}, ratio);
      }
      consume(sum_entry);
    } else {
      out_buf = new_buffer(dst_md);
    }
    fixed[DNNL_ARG_WEIGHTS] = pack(weights.data(), wdims, w_md, wscales, wmask);
    fixed[DNNL_ARG_BIAS] = pack(bias.data(), {out_ch}, bias_md);
    add_step(prim, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, {out_buf, dst_md}}}, std::move(fixed));
    consume(data);
    for (const Node* f : fused) done_.insert(f);
    new_value(out_buf, dst_md, out_dims, last, out_scale);
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
  const memory::data_type compute_;  // the option: bf16, f32 or s8 (INT8)
  const memory::data_type dt_;       // what the chain computes in outside INT8
  const bool int8_;
  const std::vector<Range> input_ranges_;  // INT8: of each region input
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
    auto ranges = attrs.find("input_ranges");
    *state = CustomStatefulOp::create<Region>(
        it->second, compute_type(attrs),
        parse_ranges(ranges == attrs.end() ? "" : ranges->second));
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    MX_ERROR_MSG << kRegionOp << ": cannot read the subgraph: " << e.what();
    return MX_FAIL;
  }
}

// A part of the last partitioning's Report; the text lives until the next
// call of either query.
const char* report_part(std::string Report::*part) {
  static std::string copy;
  std::lock_guard<std::mutex> hold(last_report_lock);
  copy = last_report.*part;
  return copy.c_str();
}

}  // namespace

// Queries for mxamp.backends.onednn (through ctypes).
extern "C" {

// The operator table (see table()) as a JSON list of rows.
const char* mxamp_onednn_table() {
  static const std::string json = table_json();
  return json.c_str();
}

const char* mxamp_onednn_fallbacks() { return report_part(&Report::fallbacks); }
const char* mxamp_onednn_error() { return report_part(&Report::error); }

// What oneDNN uses of this CPU (ONEDNN_MAX_CPU_ISA honoured), as the names of
// mxamp.cpu.FEATURES, space-separated.
const char* mxamp_onednn_cpu_features() {
  using isa = dnnl::cpu_isa;
  static const std::string names = [] {
    const std::pair<const char*, bool> features[] = {
        {"avx2", cpu_has_avx512() || cpu_isa_in({isa::avx2, isa::avx2_vnni, isa::avx2_vnni_2})},
        {"avx512", cpu_has_avx512()},
        {"vnni", cpu_has_vnni()},
        {"bf16", cpu_has_bf16()},
        {"amx", cpu_isa_in({isa::avx512_core_amx, isa::avx512_core_amx_fp16})}};
    std::string out;
    for (const auto& f : features)
      if (f.second) out += (out.empty() ? "" : " ") + std::string(f.first);
    return out;
  }();
  return names.c_str();
}

}  // extern "C"

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
