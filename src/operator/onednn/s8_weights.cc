// s8 weights in INT8 regions (s8_weights.h): the graph's part; the numbers
// are s8_values.cc's.
#include "s8_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <utility>

#include "../graph_edit.h"
#include "int8_layers.h"
#include "partitioner.h"
#include "s8_values.h"
#include "special.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

const char kS8Suffix[] = "_weight_s8", kScalesSuffix[] = "_weight_scales",
           kBiasSuffix[] = "_bias_folded";

using mxamp_graph::Additions;
using mxamp_graph::connect;
using mxamp_graph::disconnect;
using mxamp_graph::rewire;

using Sources = std::map<const Node*, NodeEntry>;  // a region's inner variable -> its input

// g's nodes that its outputs reach, in MXNet's order (graph_edit.h).
std::vector<Node*> mxnet_order(const Graph* g) {
  std::vector<Node*> heads;
  for (const NodeEntry& out : g->outputs) heads.push_back(out.node);
  return mxamp_graph::mxnet_order(heads, [](Node* n, size_t k) { return n->inputs[k].node; });
}

// Names for new nodes of graph g, made unique against its own (graph_edit.h;
// the pass adds no amp_cast here).
Additions additions_to(Graph* g) { return Additions(g, op_of(kCasts, kCast)); }

// One region's new parameters packed: a variable per kind (the outer graph's
// and the subgraph's), each layer's piece cut by a _split_v2 along axis 0; s8
// weights dequantized before the cut by one Cast and one broadcast_mul by
// their scales (a piece of the scales of their rank).
class Packs {
 public:
  Packs(Graph* g, Node* region, Additions* outer, Sources* sources)
      : g_(g), sub_(region->subgraphs.at(0)), region_(region->name), outer_(outer),
        inner_(additions_to(sub_)), sources_(sources) {}

  // The entry of the next piece (`shape`, `data` of `dtype`) of the variable
  // <region><suffix>; with `scales` (shaped (channels, 1, ...)), s8 weights
  // and the entry their piece dequantized.
  NodeEntry piece(const std::string& suffix, const Dims& shape, const void* data, MXDType dtype,
                  const std::vector<float>* scales = nullptr);

  // Gives each pack of s8 weights its scales, declares the variables, gives
  // each split its cuts and allocates and fills the parameters.
  void write();

  bool empty() const { return packs_.empty(); }

 private:
  struct Pack {
    Node *outer, *inner, *split, *mul;
    MXDType dtype;
    Dims shape;             // the pack's: rows so far, then a row's
    Dims starts;            // the pieces' first rows
    std::vector<char> bytes;
    std::vector<float> scales;  // s8 weights': their layers' scales
  };

  Pack* open(const std::string& suffix, bool dequantized);
  void fill(Pack* p);

  Graph *g_, *sub_;
  std::string region_;
  Additions* outer_;
  Additions inner_;
  Sources* sources_;
  std::vector<std::pair<std::string, Pack>> packs_;  // in the order they were opened
};

// A new variable <region><suffix>, in the outer graph and the subgraph, read
// by a new split (through the dequantization for s8 weights).
Packs::Pack* Packs::open(const std::string& suffix, bool dequantized) {
  const std::string name = outer_->unique(region_ + suffix);
  Pack p{g_->addNode(name, "null"), sub_->addNode(inner_.unique(name), "null")};
  g_->inputs.push_back(p.outer);
  (*sources_)[p.inner] = {p.outer, 0};
  NodeEntry cut{p.inner, 0};
  if (dequantized) {
    Node* cast = sub_->addNode(inner_.unique(name + "_float"), kWeightCastOp);
    cast->attrs["dtype"] = "float32";
    connect(cut, cast, 0);
    p.mul = sub_->addNode(inner_.unique(name + "_dequantized"), kScaleMulOp);
    connect({cast, 0}, p.mul, 0);  // and the scales, input 1: write()
    cut = {p.mul, 0};
  }
  p.split = sub_->addNode(inner_.unique(name + "_split"), kPackCutOp);
  p.split->attrs["axis"] = "0";
  connect(cut, p.split, 0);
  packs_.push_back({suffix, p});
  return &packs_.back().second;
}

NodeEntry Packs::piece(const std::string& suffix, const Dims& shape, const void* data,
                       MXDType dtype, const std::vector<float>* scales) {
  auto it = std::find_if(packs_.begin(), packs_.end(),
                         [&](const std::pair<std::string, Pack>& p) { return p.first == suffix; });
  Pack* p = it == packs_.end() ? open(suffix, scales != nullptr) : &it->second;
  if (p->starts.empty()) {
    p->dtype = dtype;
    p->shape = shape;
    p->shape[0] = 0;
  }
  p->starts.push_back(p->shape[0]);
  p->shape[0] += shape[0];
  const size_t size = count(shape) * (dtype == kInt8 ? 1 : sizeof(float));
  p->bytes.insert(p->bytes.end(), static_cast<const char*>(data),
                  static_cast<const char*>(data) + size);
  if (scales) p->scales.insert(p->scales.end(), scales->begin(), scales->end());
  return {p->split, static_cast<int>(p->starts.size() - 1)};
}

void Packs::write() {
  const size_t weights = packs_.size();  // the scales' packs come after
  for (size_t i = 0; i < weights; ++i) {
    Pack& p = packs_[i].second;
    if (!p.mul) continue;
    Dims shape(p.shape.size(), 1);
    shape[0] = static_cast<int64_t>(p.scales.size());
    const std::vector<float> scales = std::move(p.scales);
    Node* mul = p.mul;  // `p` may move as a pack opens
    NodeEntry e = piece(std::string(kScalesSuffix) + "_" + std::to_string(shape.size()) + "d",
                        shape, scales.data(), kFloat32);
    connect(e, mul, 1);
  }
  for (auto& kv : packs_) fill(&kv.second);
}

void Packs::fill(Pack* p) {
  for (Node* v : {p->outer, p->inner}) {
    v->attrs["__dtype__"] = std::to_string(p->dtype);
    v->attrs["__shape__"] = tuple_text(p->shape);
  }
  p->split->attrs["indices"] = tuple_text(p->starts);
  p->outer->alloc_arg(p->shape, MXContext::CPU(), p->dtype);
  if (!p->bytes.empty()) std::memcpy(p->outer->tensor->data_ptr, p->bytes.data(), p->bytes.size());
}

// Makes `layer` read its bias from `bias`.
void set_bias(Node* layer, NodeEntry bias) {
  if (layer->inputs.size() > 2)
    rewire(layer, 2, bias);
  else
    connect(bias, layer, 2);
  layer->attrs["no_bias"] = "False";
}

// Convolution `conv` takes the place of BatchNorm `bn`, folded into its new
// weights and `bias`: the BatchNorm's readers and calibration.
void drop_batchnorm(Graph* sub, Node* conv, Node* bn, NodeEntry bias) {
  set_bias(conv, bias);
  for (const char* key : {kAmaxAttr, kMinAttr}) {
    conv->attrs.erase(key);
    auto it = bn->attrs.find(key);
    if (it != bn->attrs.end()) conv->attrs[key] = it->second;
  }
  const std::vector<NodeEntry> readers = bn->outputs;
  for (const NodeEntry& r : readers) rewire(r.node, r.entry, {conv, 0});
  for (NodeEntry& h : sub->outputs)
    if (h.node == bn) h = {conv, 0};
}

// The model parameter `inner` (a node of a region's subgraph) stands for:
// the variable MXNet gave a tensor that feeds the region input it is;
// nullptr where none (also for an input the layer lacks).
const Node* model_param(const Node* inner, const Sources& sources) {
  auto it = sources.find(inner);
  if (!inner || it == sources.end()) return nullptr;
  const Node* outer = it->second.node;
  return is_variable(outer) && outer->tensor ? outer : nullptr;
}

// The model parameters of `nodes`; empty unless each is one.
std::vector<const Node*> model_params(const std::vector<const Node*>& nodes,
                                      const Sources& sources) {
  std::vector<const Node*> out;
  for (const Node* n : nodes) {
    out.push_back(model_param(n, sources));
    if (!out.back()) return {};
  }
  return out;
}

// "32x3x3": the shape of a row (an output channel) of the weights.
std::string row_text(const Dims& shape) {
  std::string out;
  for (size_t i = 1; i < shape.size(); ++i) out += (i > 1 ? "x" : "") + std::to_string(shape[i]);
  return out;
}

// Why an INT8 layer keeps float32 weights (kFloat32WeightsAttr).
constexpr const char* kNoTensor =
    "the finishing pass got no tensor for its parameters: they are no parameter of the "
    "model, or their name holds a quote, a backslash or a control character, which MXNet's "
    "extension API does not read back; the region quantizes its weights when it first runs";
constexpr const char* kNotFinite =
    "its weights or bias hold NaN or Inf, which no int8 value stands for; the region runs "
    "it on its exact float32 plan";

// Writes INT8 layer l's s8 weights (and bias) into `packs`; returns whether
// its bias was corrected. A layer whose parameters are not the model's, or
// not finite, keeps float32 weights and says why.
bool write_layer(Graph* sub, const Int8Layer& l, const std::vector<double>* mean,
                 const Sources& sources, Packs* packs) {
  if (!l.int8) return false;
  Node* layer = const_cast<Node*>(l.node);  // the pass's own graph
  const std::vector<const Node*> vars = model_params(l.params, sources);
  const std::vector<const Node*> bn = model_params(l.batchnorm_params, sources);
  if (vars.empty() || (l.batchnorm && bn.empty())) {
    layer->attrs[kFloat32WeightsAttr] = kNoTensor;
    return false;
  }
  LayerParams p = layer_params(l, vars, bn);
  if (!all_finite(p.weights.data(), static_cast<int64_t>(p.weights.size())) ||
      !all_finite(p.bias.data(), static_cast<int64_t>(p.bias.size()))) {
    layer->attrs[kFloat32WeightsAttr] = kNotFinite;
    return false;
  }
  const Quantized q = quantized(p, l.levels, l.step);
  rewire(layer, 1, packs->piece(std::string(kS8Suffix) + "_" + row_text(p.shape), p.shape,
                                q.q.data(), kInt8, &q.scales));
  const std::vector<float> shift = rounding_shift(l, p, q, mean);
  if (!p.has_bias) {
    p.bias = shift;  // (empty without a shift: then no new bias is read)
  } else {
    for (size_t c = 0; c < shift.size(); ++c) p.bias[c] += shift[c];
  }
  if (l.batchnorm || !shift.empty()) {
    NodeEntry bias = packs->piece(kBiasSuffix, {p.shape[0]}, p.bias.data(), kFloat32);
    if (l.batchnorm)
      drop_batchnorm(sub, layer, const_cast<Node*>(l.batchnorm), bias);
    else
      set_bias(layer, bias);
  }
  return !shift.empty();
}

// The channel means the data `e` of a layer of region r's subgraph has:
// those of the node whose output 0 it is (outside the region for a region
// input); nullptr where none.
const std::vector<double>* mean_of(Entry e, const Sources& sources, const ChannelMeans& means,
                                   const IndexBefore& index_before) {
  auto it = sources.find(e.first);
  if (it != sources.end()) e = {it->second.node, it->second.entry};
  auto found = e.second == 0 ? means.find(index_before(e.first)) : means.end();
  return found == means.end() ? nullptr : &found->second;
}

// Region r reads its subgraph's inputs in MXNet's order (which the new
// variables and the nodes left unread change), each with its range.
void reorder_inputs(Node* r, const Sources& sources) {
  Graph* sub = r->subgraphs.at(0);
  std::map<const Node*, std::string> ranges;
  std::istringstream in(text(r, "input_ranges"));
  std::string range;
  for (size_t k = 0; k < sub->inputs.size() && std::getline(in, range, ';'); ++k)
    ranges[sub->inputs[k]] = range;
  for (size_t k = 0; k < r->inputs.size(); ++k) disconnect(r, k);
  r->inputs.clear();
  sub->inputs.clear();
  std::string joined;
  for (Node* n : mxnet_order(sub)) {
    if (!is_variable(n)) continue;
    joined += (sub->inputs.empty() ? "" : ";") + ranges[n];
    connect(sources.at(n), r, r->inputs.size());
    sub->inputs.push_back(n);
  }
  r->attrs["input_ranges"] = joined;
}

// Region r's INT8 layers given s8 weights; returns how many biases were
// corrected.
int write_region(Graph* g, Node* r, Additions* outer, const ChannelMeans& means,
                 const IndexBefore& index_before) {
  Graph* sub = r->subgraphs.at(0);
  Sources sources;
  for (size_t k = 0; k < sub->inputs.size(); ++k) sources[sub->inputs[k]] = r->inputs.at(k);
  const std::vector<Int8Layer> layers =
      int8_layers_of(sub, parse_ranges(text(r, "input_ranges")));
  std::vector<const std::vector<double>*> layer_means;  // read before any BatchNorm leaves
  for (const Int8Layer& l : layers)
    layer_means.push_back(mean_of(l.data, sources, means, index_before));
  Packs packs(g, r, outer, &sources);
  int corrected = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    corrected += write_layer(sub, layers[i], layer_means[i], sources, &packs);
  if (packs.empty()) return corrected;
  packs.write();
  reorder_inputs(r, sources);
  return corrected;
}

}  // namespace

ChannelMeans read_means(const Attrs& options, const std::vector<std::string>& ops) {
  ChannelMeans out;
  auto option = options.find("data_means");
  std::istringstream lines(option == options.end() ? "" : option->second);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    int index = -1;
    std::string op;
    bool ok = (in >> index >> op) && index >= 0 && index < static_cast<int>(ops.size()) &&
              ops[index] == op && !out.count(index);
    std::vector<double>& mean = out[index];
    for (std::string word; ok && in >> word;) {
      char* end = nullptr;
      mean.push_back(std::strtod(word.c_str(), &end));
      ok = *end == '\0';
    }
    if (!ok)
      throw std::invalid_argument("option data_means: '" + line.substr(0, 60) + "' is not "
                                  "'<index> <op> <mean>...' of a node in option entry_types");
  }
  return out;
}

int write_s8_weights(Graph* g, const ChannelMeans& means, const IndexBefore& index_before) {
  Additions outer = additions_to(g);
  int corrected = 0;
  for (Node* n : mxnet_order(g))
    if (n->op == kRegionOp && text(n, "compute") == "int8")
      corrected += write_region(g, n, &outer, means, index_before);
  return corrected;
}

}  // namespace mxamp_onednn
