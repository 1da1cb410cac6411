// The operator table. Operator names appear only here: adding an operator
// is one row (plus, for a new kind of eltwise operator, its entry in
// eltwise.cc; for a new family, its file: docs/architecture.md walks both).
#include "table.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace mxamp_onednn {
namespace {

constexpr unsigned kFloats = kF32Bit | kBF16Bit, kAll = kFloats | kInt8Bit;
const auto kQs = Int8Role::kQuantizes, kQ = Int8Role::kQuantized;
const auto kF = Int8Role::kFloat, kN = Int8Role::kNone, kNw = Int8Role::kNarrowest;
const std::vector<int> kNoParams, kWeights = {1, 2}, kBatchNormParams = {1, 2, 3, 4};
const std::vector<int> kNoAux, kMovingStats = {3, 4};  // BatchNorm's moving mean and variance

// Shorthands for the columns that only a few rows set.
struct Traits {
  bool post_op = false, takes_post_ops = false, fused_only = false, computes = true,
       f32_inside = false, f32_in_bf16 = false;
};
const Traits kPlain, kView{false, false, false, false, false};
const Traits kPostOp{true}, kTakesPostOps{false, true};
const Traits kFolded{true, true, true}, kF32Inside{false, false, false, true, true};
const Traits kF32InBF16{false, false, false, true, true, true};

// Whether an operator keeps images apart is every row's to say (a wrong
// yes cuts a batch where the operator mixes its images).
constexpr bool kApart = true, kMixes = false;

// The families by the names their files give them (FamilyName).
std::map<std::string, const Family*>& families() {
  static std::map<std::string, const Family*> named;
  return named;
}

const Family& family_named(const char* op, const char* name) {
  auto it = families().find(name);
  if (it == families().end())
    throw std::logic_error(std::string("operator table: the row of ") + op + " names family '" +
                           name + "', which no file defines");
  return *it->second;
}

Row row(const char* op, const char* family, int variant, unsigned dtypes, Int8Role int8,
        bool apart, Traits t = kPlain, std::vector<int> params = kNoParams,
        std::vector<int> aux = kNoAux) {
  return {op,           &family_named(op, family), variant,      dtypes,     int8,
          t.post_op,    t.takes_post_ops,          t.fused_only, t.computes, t.f32_inside,
          t.f32_in_bf16, apart,                    std::move(params), std::move(aux)};
}

// A row of a family that names its variants by kind (Family::kind).
Row row(const char* op, const char* family_name, const char* kind, unsigned dtypes,
        Int8Role int8, bool apart, Traits t = kPlain) {
  const Family& family = family_named(op, family_name);
  int variant = family.kind ? family.kind(kind) : -1;
  if (variant < 0)
    throw std::logic_error(std::string("operator table: the row of ") + op + " names kind '" +
                           kind + "', which its family does not define");
  return row(op, family_name, variant, dtypes, int8, apart, t);
}

const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      row("amp_cast", "casts", kCast, kAll, kN, kApart, kView),
      row("amp_multicast", "casts", kMulticast, kAll, kN, kApart, kView),
      row("Convolution", "linear", kConvolution, kAll, kQs, kApart, kTakesPostOps, kWeights),
      row("FullyConnected", "linear", kFullyConnected, kAll, kQs, kApart, kTakesPostOps, kWeights),
      row("BatchNorm", "normalisation", kBatchNorm, kAll, kN, kApart, kFolded, kBatchNormParams,
          kMovingStats),
      row("LayerNorm", "normalisation", kLayerNorm, kFloats, kNw, kApart, kF32InBF16, {1, 2}),
      row("softmax", "normalisation", kSoftmax, kFloats, kF, kApart, kF32Inside),
      row("elemwise_add", "binary", 0, kAll, kQ, kApart, kTakesPostOps),
      row("Pooling", "pooling", 0, kAll, kQ, kApart),
      row("batch_dot", "matmul", 0, kAll, kQs, kApart),
      row("Flatten", "views", kFlatten, kAll, kN, kApart, kView),
      row("Reshape", "views", kReshape, kAll, kN, kMixes, kView),
      row("transpose", "views", kTranspose, kAll, kN, kMixes),
      row("Activation", "eltwise", "act_type", kFloats, kF, kApart, kPostOp),
      row("relu", "eltwise", "relu", kFloats, kF, kApart, kPostOp),
      row("sigmoid", "eltwise", "logistic", kFloats, kF, kApart, kPostOp),
      row("tanh", "eltwise", "tanh", kFloats, kF, kApart, kPostOp),
      row("LeakyReLU", "eltwise", "leaky or gelu", kFloats, kF, kApart, kPostOp),
      row("_mul_scalar", "eltwise", "times scalar", kFloats, kF, kApart, kPostOp),
      row("_div_scalar", "eltwise", "over scalar", kFloats, kF, kApart, kPostOp),
      row("clip", "eltwise", "between bounds", kFloats, kF, kApart, kPostOp),
  };
  return rows;
}

const char* role_name(Int8Role role) {
  switch (role) {
    case Int8Role::kQuantizes: return "quantizes";
    case Int8Role::kQuantized: return "quantized";
    case Int8Role::kFloat: return "float";
    case Int8Role::kNarrowest: return "narrowest";
    case Int8Role::kNone: break;
  }
  return "none";
}

}  // namespace

FamilyName::FamilyName(const char* name, const Family& family) { families()[name] = &family; }

bool Row::computes_in(memory::data_type dt) const {
  unsigned bit = dt == kF32 ? kF32Bit : dt == kBF16 ? kBF16Bit : kInt8Bit;
  return (dtypes & bit) != 0;
}

bool Row::is_param(int input) const {
  return std::find(params.begin(), params.end(), input) != params.end();
}

bool Row::is_aux(int input) const {
  return std::find(aux.begin(), aux.end(), input) != aux.end();
}

const Row* row_of(const Node* n) {
  static const std::map<std::string, const Row*> by_op = [] {
    std::map<std::string, const Row*> out;
    for (const Row& r : table()) out[r.op] = &r;
    return out;
  }();
  auto it = by_op.find(n->op);
  return it == by_op.end() ? nullptr : it->second;
}

const char* op_of(const Family& family, int variant) {
  for (const Row& r : table())
    if (r.family == &family && r.variant == variant) return r.op;
  throw std::logic_error("the operator table has no row of that family and variant");
}

bool is_variable(const Node* n) { return n->op == "null"; }

bool is(const Node* n, const Family& family, int variant) {
  const Row* r = row_of(n);
  return r && r->family == &family && (variant < 0 || r->variant == variant);
}

Entry passed_to(const Node* n, size_t k) {
  return {n, row_of(n)->family->output_per_input ? static_cast<int>(k) : 0};
}

Entry passed_from(Entry e) {
  return input(e.first, row_of(e.first)->family->output_per_input ? e.second : 0);
}

bool passes_zero_point(const Node* n) {
  const Row* r = row_of(n);
  return r && r->family->passes_zero_point && r->family->passes_zero_point(n, r->variant);
}

bool computes_int8(Plan* plan, const Node* n) {
  const Row* r = row_of(n);
  return r && r->family->computes_int8 && r->family->computes_int8(plan, n);
}

const char kWeightCastOp[] = "Cast", kScaleMulOp[] = "broadcast_mul", kPackCutOp[] = "_split_v2";

bool casts_weights(const Node* n) { return n->op == kWeightCastOp; }

bool cuts_pack(const Node* n) { return n->op == kPackCutOp && n->inputs.size() == 1; }

bool casts_param(const Node* n) {
  return is(n, kCasts, kCast) && n->inputs.size() == 1 && dequantizes(n->inputs[0].node);
}

bool dequantizes_s8(const Node* n) {
  while (casts_param(n)) n = n->inputs[0].node;
  return dequantizes(n) && !(cuts_pack(n) && is_variable(n->inputs[0].node));
}

bool dequantizes(const Node* n) {
  return casts_weights(n) || n->op == kScaleMulOp || cuts_pack(n) || casts_param(n);
}

std::string table_json() {
  static const std::pair<unsigned, const char*> dtypes[] = {
      {kF32Bit, "float32"}, {kBF16Bit, "bfloat16"}, {kInt8Bit, "int8"}};
  auto boolean = [](bool b) { return b ? "true" : "false"; };
  std::ostringstream out;
  out << '[';
  for (const Row& r : table()) {
    out << (&r == &table().front() ? "" : ",") << "{\"op\":\"" << r.op << "\",\"dtypes\":[";
    const char* sep = "";
    for (const auto& d : dtypes)
      if (r.dtypes & d.first) out << sep << '"' << d.second << '"', sep = ",";
    out << "],\"int8\":\"" << role_name(r.int8) << "\",\"post_op\":" << boolean(r.post_op)
        << ",\"f32_inside\":" << boolean(r.f32_inside)
        << ",\"f32_in_bf16\":" << boolean(r.f32_in_bf16) << ",\"apart\":" << boolean(r.apart)
        << ",\"params\":[";
    for (size_t i = 0; i < r.params.size(); ++i) out << (i ? "," : "") << r.params[i];
    out << "],\"aux\":[";
    for (size_t i = 0; i < r.aux.size(); ++i) out << (i ? "," : "") << r.aux[i];
    out << "]}";
  }
  out << ']';
  return out.str();
}

}  // namespace mxamp_onednn
