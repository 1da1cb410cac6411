// What mxamp's quantization asks of the layers with weights that INT8
// regions run (mxamp/backends/onednn_int8.py writes their s8 weights): which
// run in INT8, their weights' levels, the BatchNorm folded into them, the
// tensor they read through casts and the axis of its channels. The facts
// live where the regions decide them; Python names no operator.
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "engine.h"
#include "graph.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// A layer's weights: a row that quantizes its data and packs parameters.
bool has_weights(const Node* n) {
  const Row* row = row_of(n);
  return row && row->int8 == Int8Role::kQuantizes && !row->params.empty();
}

// The axis of the channels the layer's weights sum over in its data: 1 for
// a channels-first convolution, -1 for a FullyConnected of flatten=False,
// "null" for a flattening one (each value of an example is a channel),
// "\"none\"" where its channels are no axis (another layout).
std::string channel_axis(const Node* n) {
  if (is(n, kLinear, kFullyConnected)) return flag(n, "flatten", true) ? "null" : "-1";
  const std::string layout = text(n, "layout", "None");
  bool first = layout == "None" || layout == "NCW" || layout == "NCHW" || layout == "NCDHW";
  return first ? "1" : "\"none\"";
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

// The node index of each parameter input of n (-1 where absent).
std::string param_nodes(const Node* n, const std::vector<int>& params,
                        const std::map<const Node*, size_t>& index) {
  std::string out = "[";
  for (int k : params) {
    bool there = static_cast<size_t>(k) < n->inputs.size();
    out += (out.size() > 1 ? "," : "") +
           (there ? std::to_string(index.at(n->inputs[k].node)) : std::string("-1"));
  }
  return out + "]";
}

void write_layer(std::ostream& out, const Graph* g, const Node* n, const Readers& readers,
                 const std::map<const Node*, size_t>& index, const std::vector<Range>& ranges) {
  const bool conv = is(n, kLinear, kConvolution);
  const Range r = data_range(g, n, ranges);
  const memory::data_type src = r.type();
  const Entry data = source(input(n, 0));
  std::vector<int> params = row_of(n)->params;
  if (flag(n, "no_bias", false)) params.resize(1);
  out << "{\"node\":" << index.at(n) << ",\"params\":" << param_nodes(n, params, index)
      << ",\"data\":[" << index.at(data.first) << ',' << data.second
      << "],\"axis\":" << channel_axis(n) << ",\"groups\":" << number(n, "num_group", 1)
      << ",\"int8\":" << (!keeps_float(n) && r.known() ? "true" : "false")
      << ",\"levels\":" << weight_levels(conv, src) << ",\"step\":" << weight_step(conv, src);
  if (const Node* bn = folded_batchnorm(n, readers)) {
    out << ",\"batchnorm\":{\"node\":" << index.at(bn) << ",\"params\":"
        << param_nodes(bn, row_of(bn)->params, index) << ",\"eps\":" << number(bn, "eps", 1e-3)
        << ",\"fix_gamma\":" << (flag(bn, "fix_gamma", true) ? "true" : "false") << '}';
  }
  out << '}';
}

}  // namespace

std::string int8_layers(const std::string& graph_json, const std::string& input_ranges) {
  std::unique_ptr<Graph> g(Graph::fromString(graph_json));
  std::map<const Node*, size_t> index;
  for (size_t i = 0; i < g->size(); ++i) index[g->getNode(i)] = i;
  Readers readers(g.get());
  const std::vector<Range> ranges = parse_ranges(input_ranges);
  std::ostringstream out;
  out.precision(std::numeric_limits<double>::max_digits10);  // each double read back as it is
  out << '[';
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    if (!has_weights(n)) continue;
    if (out.tellp() > 1) out << ',';
    write_layer(out, g.get(), n, readers, index, ranges);
  }
  out << ']';
  return out.str();
}

}  // namespace mxamp_onednn
