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
#include "packs.h"
#include "partitioner.h"
#include "s8_values.h"
#include "special.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

const char kS8Suffix[] = "_weight_s8", kBiasSuffix[] = "_bias_folded";

using mxamp_graph::Additions;
using mxamp_graph::connect;
using mxamp_graph::disconnect;
using mxamp_graph::rewire;

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

// Region r's INT8 layers given s8 weights; returns how many biases were
// corrected.
int write_region(Graph* g, Node* r, Additions* outer, const ChannelMeans& means,
                 const IndexBefore& index_before) {
  Graph* sub = r->subgraphs.at(0);
  Sources sources = sources_of(r);
  const std::vector<Int8Layer> layers =
      int8_layers_of(sub, parse_ranges(text(r, "input_ranges")));
  std::vector<const std::vector<double>*> layer_means;  // read before any BatchNorm leaves
  for (const Int8Layer& l : layers)
    layer_means.push_back(mean_of(l.data, sources, means, index_before));
  Packs packs(g, r, outer, &sources);
  int corrected = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    corrected += write_layer(sub, layers[i], layer_means[i], sources, &packs);
  if (!packs.empty()) packs.write();
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
