// What mxamp's quantization asks of the layers with weights that INT8
// regions run (int8_layers.h; s8_weights.cc writes their s8 weights): which
// run in INT8, their weights' levels, the BatchNorm folded into them, the
// tensor they read through casts and the axis of its channels. The facts
// live where the regions decide them; Python names no operator.
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "engine.h"
#include "graph.h"
#include "int8_layers.h"
#include "partitioner.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// A layer's weights: a row that quantizes its data and packs parameters.
bool has_weights(const Node* n) {
  const Row* row = row_of(n);
  return row && row->int8 == Int8Role::kQuantizes && !row->params.empty();
}

// The axis of the channels the layer's weights sum over in its data.
ChannelAxis channel_axis(const Node* n) {
  if (is(n, kLinear, kFullyConnected))
    return flag(n, "flatten", true) ? ChannelAxis::kEach : ChannelAxis::kLast;
  const std::string layout = text(n, "layout", "None");
  bool first = layout == "None" || layout == "NCW" || layout == "NCHW" || layout == "NCDHW";
  return first ? ChannelAxis::kFirst : ChannelAxis::kNone;
}

// The calibrated range of the data the layer reads: the region input's,
// or its producer's (casts aside; a model's data variable carries its own).
Range data_range(const Graph* g, const Node* n, const std::vector<Range>& input_ranges) {
  Entry s = source(input(n, 0));
  for (size_t i = 0; i < g->inputs.size() && i < input_ranges.size(); ++i)
    if (g->inputs[i] == s.first) return input_ranges[i];
  return source_range(s);
}

// The BatchNorm the region folds into convolution n: its sole reader, where
// the normalisation family says it fuses; nullptr where none.
const Node* folded_batchnorm(const Node* n, const Readers& readers) {
  const Node* bn = readers.sole({n, 0});
  if (!is(n, kLinear, kConvolution) || !bn || !is(bn, kNormalisation, kBatchNorm)) return nullptr;
  return row_of(bn)->family->fuses(bn, readers) ? bn : nullptr;
}

// The nodes of n's inputs `params` (nullptr where absent).
std::vector<const Node*> param_nodes(const Node* n, const std::vector<int>& params) {
  std::vector<const Node*> out;
  for (int k : params)
    out.push_back(static_cast<size_t>(k) < n->inputs.size() ? n->inputs[k].node : nullptr);
  return out;
}

Int8Layer layer_of(const Graph* g, const Node* n, const Readers& readers,
                   const std::vector<Range>& ranges) {
  const bool conv = is(n, kLinear, kConvolution);
  const Range r = data_range(g, n, ranges);
  std::vector<int> params = row_of(n)->params;
  if (flag(n, "no_bias", false)) params.resize(1);
  Int8Layer layer{n, param_nodes(n, params), source(input(n, 0)), channel_axis(n),
                  static_cast<int>(number(n, "num_group", 1)), !keeps_float(n) && r.known(),
                  weight_levels(conv, r.type()), weight_step(conv, r.type())};
  layer.s8_weights = layer.params[0] && dequantizes_s8(layer.params[0]);
  layer.float32_weights = text(n, kFloat32WeightsAttr);
  if (const Node* bn = folded_batchnorm(n, readers)) {
    layer.batchnorm = bn;
    layer.batchnorm_params = param_nodes(bn, row_of(bn)->params);
    layer.eps = number(bn, "eps", 1e-3);
    layer.fix_gamma = flag(bn, "fix_gamma", true);
  }
  return layer;
}

const char* axis_json(ChannelAxis axis) {
  switch (axis) {
    case ChannelAxis::kFirst: return "1";
    case ChannelAxis::kLast: return "-1";
    case ChannelAxis::kEach: return "null";
    default: return "\"none\"";
  }
}

// The node index of each parameter (-1 where absent).
std::string indices(const std::vector<const Node*>& nodes,
                    const std::map<const Node*, size_t>& index) {
  std::string out = "[";
  for (const Node* p : nodes)
    out += (out.size() > 1 ? "," : "") + (p ? std::to_string(index.at(p)) : std::string("-1"));
  return out + "]";
}

void write_layer(std::ostream& out, const Int8Layer& l,
                 const std::map<const Node*, size_t>& index) {
  out << "{\"node\":" << index.at(l.node) << ",\"params\":" << indices(l.params, index)
      << ",\"data\":[" << index.at(l.data.first) << ',' << l.data.second
      << "],\"axis\":" << axis_json(l.axis) << ",\"groups\":" << l.groups
      << ",\"int8\":" << (l.int8 ? "true" : "false") << ",\"levels\":" << l.levels
      << ",\"step\":" << l.step << ",\"s8_weights\":" << (l.s8_weights ? "true" : "false")
      // as lib_api read it from JSON, escapes kept: written back as it was
      << ",\"float32_weights\":\"" << l.float32_weights << '"';
  if (l.batchnorm) {
    out << ",\"batchnorm\":{\"node\":" << index.at(l.batchnorm) << ",\"params\":"
        << indices(l.batchnorm_params, index) << ",\"eps\":" << l.eps
        << ",\"fix_gamma\":" << (l.fix_gamma ? "true" : "false") << '}';
  }
  out << '}';
}

}  // namespace

std::vector<Int8Layer> int8_layers_of(const Graph* g, const std::vector<Range>& input_ranges) {
  Readers readers(g);
  std::vector<Int8Layer> out;
  for (size_t i = 0; i < g->size(); ++i)
    if (has_weights(g->getNode(i)))
      out.push_back(layer_of(g, g->getNode(i), readers, input_ranges));
  return out;
}

std::string int8_layers(const std::string& graph_json, const std::string& input_ranges) {
  std::unique_ptr<Graph> g(Graph::fromString(graph_json));
  std::map<const Node*, size_t> index;
  for (size_t i = 0; i < g->size(); ++i) index[g->getNode(i)] = i;
  std::ostringstream out;
  out.precision(std::numeric_limits<double>::max_digits10);  // each double read back as it is
  out << '[';
  for (const Int8Layer& layer : int8_layers_of(g.get(), parse_ranges(input_ranges))) {
    if (out.tellp() > 1) out << ',';
    write_layer(out, layer, index);
  }
  out << ']';
  return out.str();
}

std::string float32_weight_layers(const std::string& model_json) {
  std::unique_ptr<Graph> g(Graph::fromString(model_json));
  std::ostringstream out;
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* r = g->getNode(i);
    if (r->op != kRegionOp || text(r, "compute") != "int8") continue;
    const Graph* sub = r->subgraphs.at(0);
    std::map<const Node*, size_t> index;
    for (size_t k = 0; k < sub->size(); ++k) index[sub->getNode(k)] = k;
    for (const Int8Layer& l : int8_layers_of(sub, parse_ranges(text(r, "input_ranges"))))
      if (l.int8 && !l.s8_weights)
        out << i << ' ' << index.at(l.node) << '\t' << l.float32_weights << '\n';
  }
  return out.str();
}

}  // namespace mxamp_onednn
