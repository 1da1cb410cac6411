// The pass that makes a partitioned graph final (finish.h).
//
// What it needs of the graph before partitioning, its entries' types and
// which variables are data, comes by that graph's node indices, as the
// partitioner's options do: names may hold any character, and the
// partitioned graph keeps no index. The pass numbers the partitioned graph's
// nodes as the graph before was numbered (MXNet's JSON order: depth-first
// from the outputs, each node after its inputs, which a region's inner nodes
// keep), so a node the graph before had is known by index and checked
// against that index's op.
#include "finish.h"

#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "../graph_edit.h"
#include "attrs.h"
#include "float_params.h"
#include "packs.h"
#include "partitioner.h"
#include "regions.h"
#include "s8_weights.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// MXNet's dtype codes.
constexpr int kFloat32Code = 0, kBFloat16Code = 12;

thread_local Finished finished;

// What the options tell of the graph before partitioning, by node index.
struct Before {
  std::vector<std::string> ops;
  std::vector<std::vector<int>> types;  // per node, per output
  std::set<int> data;                   // variables that are no parameter
};

// One "<index> <op> [<number>...]" line; false if it has another shape.
bool read_line(const std::string& line, int* index, std::string* op, std::vector<int>* numbers) {
  std::istringstream in(line);
  if (!(in >> *index >> *op)) return false;
  for (int x; in >> x;) numbers->push_back(x);
  return in.eof();
}

Before read_before(const Attrs& options) {
  Before b;
  auto types = options.find("entry_types");
  auto data = options.find("data_inputs");
  if (types == options.end() || data == options.end())
    throw std::invalid_argument("options entry_types and data_inputs are needed");
  std::istringstream lines(types->second);
  for (std::string line; std::getline(lines, line);) {
    int index;
    std::string op;
    std::vector<int> codes;
    if (!read_line(line, &index, &op, &codes) || index != static_cast<int>(b.ops.size()))
      throw std::invalid_argument("option entry_types: '" + line + "' is not '<index> <op> "
                                  "<code>...' of node " + std::to_string(b.ops.size()));
    b.ops.push_back(op);
    b.types.push_back(codes);
  }
  std::istringstream vars(data->second);
  for (std::string line; std::getline(vars, line);) {
    int index;
    std::string op;
    std::vector<int> rest;
    if (!read_line(line, &index, &op, &rest) || op != "null" || !rest.empty() || index < 0 ||
        index >= static_cast<int>(b.ops.size()) || b.ops[index] != op)
      throw std::invalid_argument("option data_inputs: '" + line + "' is not '<index> null' "
                                  "of a variable in option entry_types");
    b.data.insert(index);
  }
  return b;
}

bool is_region(const Node* n) { return n->op == kRegionOp; }

// The partitioned graph's nodes by their indices in the graph before
// partitioning (see the top of this file).
class Original {
 public:
  explicit Original(const Graph* g) {
    for (size_t i = 0; i < g->size(); ++i) {
      const Node* r = g->getNode(i);
      if (!is_region(r)) continue;
      const Graph* sub = r->subgraphs.at(0);
      if (sub->inputs.size() != r->inputs.size())
        throw std::invalid_argument("region " + r->name + " has " +
                                    std::to_string(r->inputs.size()) + " inputs but its subgraph " +
                                    std::to_string(sub->inputs.size()) + " variables");
      for (size_t j = 0; j < sub->outputs.size(); ++j)
        through_[{r, static_cast<int>(j)}] = {sub->outputs[j].node, sub->outputs[j].entry};
      for (size_t k = 0; k < sub->inputs.size(); ++k) through_[{sub->inputs[k], 0}] = input(r, k);
    }
    number(g);
  }

  // The entry of the graph before that e carries: a region's output is its
  // inner head's, an inner variable the region input it stands for.
  Entry of(Entry e) const {
    for (auto it = through_.find(e); it != through_.end(); it = through_.find(e)) e = it->second;
    return e;
  }

  // n's index there; -1 for nodes it had not (regions, added casts).
  int index(const Node* n) const {
    auto it = index_.find(n);
    return it == index_.end() ? -1 : it->second;
  }

  // Throws unless the graph before had `ops`, node by node.
  void check(const std::vector<std::string>& ops) const {
    for (size_t i = 0; i < order_.size() && i < ops.size(); ++i)
      if (order_[i]->op != ops[i])
        throw std::invalid_argument("node " + std::to_string(i) + " is a " + order_[i]->op +
                                    " here but a " + ops[i] + " in option entry_types");
    if (order_.size() != ops.size())
      throw std::invalid_argument("option entry_types has " + std::to_string(ops.size()) +
                                  " nodes, the graph before partitioning " +
                                  std::to_string(order_.size()));
  }

 private:
  // MXNet's order (graph_edit.h), through regions to the nodes they stand for.
  void number(const Graph* g) {
    std::vector<const Node*> heads;
    for (const NodeEntry& out : g->outputs) heads.push_back(of({out.node, out.entry}).first);
    order_ = mxamp_graph::mxnet_order(
        heads, [this](const Node* n, size_t k) { return of(input(n, k)).first; });
    for (size_t i = 0; i < order_.size(); ++i) index_[order_[i]] = static_cast<int>(i);
  }

  std::map<Entry, Entry> through_;
  std::map<const Node*, int> index_;
  std::vector<const Node*> order_;
};

using mxamp_graph::Additions;
using mxamp_graph::rewire;

// Where casts are added to one graph (the outer one or a region's) as
// mxamp's Python rewriters add them (graph.Inserter): the graph's own
// amp_casts serve too.
Additions casts_of(Graph* g) {
  Additions casts(g, op_of(kCasts, kCast));
  casts.adopt_casts();
  return casts;
}

using ReaderMap = std::map<Entry, std::vector<Node*>>;

class Finisher {
 public:
  Finisher(Graph* g, const Attrs& options) : g_(g), before_(read_before(options)), original_(g) {
    original_.check(before_.ops);
  }

  void run() {
    fix_region_edges();
    skip_identity_casts();
  }

  // The INT8 layers' weights in s8 (s8_weights.h); returns how many biases
  // were corrected.
  int write_weights(const Attrs& options) {
    return write_s8_weights(g_, read_means(options, before_.ops),
                            [this](const Node* n) { return original_.index(n); });
  }

  // The widened parameters' indices, a line each, in order (a set of
  // pointers has none).
  std::string widened() const {
    std::set<int> indices;
    for (const Node* v : widened_) indices.insert(original_.index(v));
    std::ostringstream out;
    for (int i : indices) out << i << '\n';
    return out.str();
  }

  // The INT8 layers write_weights left reading float32 weights, and why.
  std::string float32_weights() const {
    std::ostringstream out;
    for (const Node* r : mxnet_order(g_)) {
      if (!is_region(r) || text(r, "compute") != "int8") continue;
      for (const Node* n : mxnet_order(r->subgraphs.at(0))) {
        const std::string why = text(n, kFloat32WeightsAttr);
        if (!why.empty()) out << original_.index(n) << '\t' << why << '\n';
      }
    }
    return out.str();
  }

  // The operators outside regions, and the regions' count and operators',
  // of the nodes MXNet keeps (those the outputs reach).
  void count_nodes(Finished* out) const {
    std::ostringstream outside;
    int regions = 0, inside = 0;
    for (const Node* n : mxnet_order(g_)) {
      if (is_region(n)) {
        ++regions;
        for (const Node* m : mxnet_order(n->subgraphs.at(0))) inside += m->op != "null";
      } else if (n->op != "null") {
        outside << original_.index(n) << ' ' << n->op << '\n';
      }
    }
    out->outside = outside.str();
    out->regions = std::to_string(regions) + " " + std::to_string(inside);
  }

 private:
  // The type the graph before gave what e carries; `missing` where it gave
  // none.
  int type(Entry e, int missing = -1) const {
    Entry o = original_.of(e);
    int i = original_.index(o.first);
    if (i < 0 || o.second >= static_cast<int>(before_.types[i].size())) return missing;
    return before_.types[i][o.second];
  }

  bool is_data(const Node* n) const { return before_.data.count(original_.index(n)) > 0; }

  ReaderMap readers() const {
    ReaderMap out;
    for (size_t i = 0; i < g_->size(); ++i) {
      Node* n = g_->getNode(i);
      for (const NodeEntry& in : n->inputs) out[{in.node, in.entry}].push_back(n);
    }
    return out;
  }

  // bfloat16 parameters every reader of which is a region: stored in
  // float32 (exactly), they need no cast. A graph output is read in its
  // type by the caller.
  void find_widened(const ReaderMap& readers) {
    std::set<const Node*> heads;
    for (const NodeEntry& h : g_->outputs) heads.insert(h.node);
    for (const auto& kv : readers) {
      const Node* v = kv.first.first;
      bool regions_only = !heads.count(v);
      for (const Node* r : kv.second) regions_only &= is_region(r);
      if (is_variable(v) && !is_data(v) && regions_only && type(kv.first) == kBFloat16Code)
        widened_.insert(v);
    }
  }

  void fix_region_edges();
  std::vector<size_t> cast_inside(Node* r, const std::vector<size_t>& bf16_inputs);
  void cast_heads_back(Node* r, const std::vector<size_t>& bf16_heads, const ReaderMap& readers,
                       Additions* outer);
  bool copies_input(const Node* n, const std::set<const Node*>& heads) const;
  void skip_identity_casts();

  Graph* g_;
  Before before_;
  Original original_;
  std::set<const Node*> widened_;
};

// Where the graph before held bfloat16 on a region edge: a float32 cast
// outside and a bfloat16 cast inside each such input (the inner casts cost
// nothing: the region computes in its own type anyway), a float32 cast
// inside and a bfloat16 cast outside each such output.
void Finisher::fix_region_edges() {
  const ReaderMap readers = this->readers();
  std::vector<Node*> regions;
  std::map<Node*, std::vector<size_t>> bf16_inputs;  // read before any region changes
  for (size_t i = 0; i < g_->size(); ++i) {
    Node* r = g_->getNode(i);
    if (!is_region(r)) continue;
    regions.push_back(r);
    for (size_t k = 0; k < r->inputs.size(); ++k)
      if (type(input(r, k)) == kBFloat16Code) bf16_inputs[r].push_back(k);
  }
  find_widened(readers);
  Additions outer = casts_of(g_);
  for (Node* r : regions) {
    std::vector<size_t> bf16_heads = cast_inside(r, bf16_inputs[r]);
    for (size_t k : bf16_inputs[r]) {
      Node* from = r->inputs[k].node;
      if (!is_region(from) && !widened_.count(from))
        rewire(r, k, {outer.cast(r->inputs[k], "float32"), 0});
    }
    cast_heads_back(r, bf16_heads, readers, &outer);
  }
  for (size_t i = 0; i < g_->size(); ++i)
    if (widened_.count(g_->getNode(i)))
      g_->getNode(i)->attrs["__dtype__"] = std::to_string(kFloat32Code);
}

// Region r with its inputs `bf16_inputs` cast back to bfloat16 where they
// enter and its bfloat16 heads cast to float32 where they leave; returns
// those heads.
std::vector<size_t> Finisher::cast_inside(Node* r, const std::vector<size_t>& bf16_inputs) {
  Graph* sub = r->subgraphs.at(0);
  const size_t own = sub->size();  // the casts added below keep their inputs
  Additions inner = casts_of(sub);
  std::map<Node*, Node*> swap;  // an inner variable -> its bfloat16 cast
  for (size_t k : bf16_inputs) swap[sub->inputs.at(k)] = inner.cast({sub->inputs[k], 0}, "bfloat16");
  std::set<Node*> casts;  // a cast the region had may be one of them
  for (const auto& kv : swap) casts.insert(kv.second);
  for (size_t i = 0; i < own; ++i) {
    Node* n = sub->getNode(i);
    if (casts.count(n)) continue;
    for (size_t k = 0; k < n->inputs.size(); ++k) {
      auto it = swap.find(n->inputs[k].node);
      if (it != swap.end()) rewire(n, k, {it->second, 0});
    }
  }
  std::vector<size_t> bf16_heads;
  for (size_t j = 0; j < sub->outputs.size(); ++j) {
    if (type({r, static_cast<int>(j)}) != kBFloat16Code) continue;
    sub->outputs[j] = {inner.cast(sub->outputs[j], "float32"), 0};
    bf16_heads.push_back(j);
  }
  return bf16_heads;
}

// Readers outside regions, and the graph's outputs, get region r's heads
// `bf16_heads` (float32 now) back in bfloat16.
void Finisher::cast_heads_back(Node* r, const std::vector<size_t>& bf16_heads,
                               const ReaderMap& readers, Additions* outer) {
  for (size_t j : bf16_heads) {
    const int out = static_cast<int>(j);
    std::set<Node*> outside;
    auto found = readers.find({r, out});
    if (found != readers.end())
      for (Node* n : found->second)
        if (!is_region(n)) outside.insert(n);
    bool is_head = false;
    for (const NodeEntry& h : g_->outputs) is_head |= h.node == r && h.entry == out;
    if (outside.empty() && !is_head) continue;
    Node* cast = outer->cast({r, out}, "bfloat16");
    outside.erase(cast);  // a cast the graph had may be the one
    for (Node* n : outside)
      for (size_t k = 0; k < n->inputs.size(); ++k)
        if (n->inputs[k].node == r && n->inputs[k].entry == out) rewire(n, k, {cast, 0});
    for (NodeEntry& h : g_->outputs)
      if (h.node == r && h.entry == out) h = {cast, 0};
  }
}

// Whether cast n, left on MXNet, copies its inputs: each output has its
// input's type (the conversion puts an amp_multicast before each
// widest-type operator, as the reference AMP does, even where its inputs
// agree: BERT's position embedding add). Only a cast that still reads what
// it read before partitioning qualifies: one the edges were cast around is
// kept, as is a graph output (its name stays) and a cast of a data input,
// whose type the caller may change.
bool Finisher::copies_input(const Node* n, const std::set<const Node*>& heads) const {
  const int was = original_.index(n);
  if (!is(n, kCasts) || heads.count(n) || was < 0) return false;
  for (size_t k = 0; k < n->inputs.size(); ++k) {
    const Node* from = n->inputs[k].node;
    // A region's output whose type stays (the others are read through
    // added casts) is what it was.
    if ((original_.index(from) < 0 && !is_region(from)) || is_data(from)) return false;
    // A type the options omit agrees with none, but -1 (unknown to MXNet's
    // inference) with -1.
    const std::vector<int>& out = before_.types[was];
    const size_t to = passed_to(n, k).second;
    if ((to < out.size() ? out[to] : -1) != type(input(n, k), -2)) return false;
  }
  return true;
}

// Readers of such casts read the casts' inputs instead.
void Finisher::skip_identity_casts() {
  std::set<const Node*> heads;
  for (const NodeEntry& h : g_->outputs) heads.insert(h.node);
  std::map<Entry, NodeEntry> skip;  // a skipped cast's output -> what it copies
  for (size_t i = 0; i < g_->size(); ++i) {
    Node* n = g_->getNode(i);
    if (copies_input(n, heads))
      for (size_t k = 0; k < n->inputs.size(); ++k) skip[passed_to(n, k)] = n->inputs[k];
  }
  for (size_t i = 0; i < g_->size(); ++i) {
    Node* n = g_->getNode(i);
    if (skip.count({n, 0})) continue;  // left unread: MXNet drops it
    for (size_t k = 0; k < n->inputs.size(); ++k) {
      NodeEntry to = n->inputs[k];
      for (auto it = skip.find({to.node, to.entry}); it != skip.end();
           it = skip.find({to.node, to.entry}))
        to = it->second;
      if (to.node != n->inputs[k].node || to.entry != n->inputs[k].entry) rewire(n, k, to);
    }
  }
}

}  // namespace

MXReturnValue finish(Graph* g, const Attrs& options) {
  finished = Finished();
  try {
    if (options.count("compute")) form_regions(g, options);
    Finisher f(g, options);
    f.run();
    finished.corrected = f.write_weights(options);
    finished.float32_weights = f.float32_weights();
    finished.widened = f.widened();
    pack_float_params(g);
    f.count_nodes(&finished);
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    MX_ERROR_MSG << "mxamp_onednn_finish: " << e.what();
    return MX_FAIL;
  }
}

const Finished& last_finished() { return finished; }

}  // namespace mxamp_onednn
