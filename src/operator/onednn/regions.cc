// Region nodes in place of the groups of chosen nodes (regions.h), as MXNet
// 1.9.1's build_subgraph and CustomSubgraphProperty make them:
// - a region's inputs are every input of its nodes read from outside, one
//   each (a value read twice is two inputs), its outputs every input of an
//   outside node, and every graph output, read from inside, one each; both
//   in the order MXNet's depth-first walk from the graph's outputs meets
//   those inputs (TopSortEntries);
// - the subgraph's variables are named after what they stand for (a
//   variable's name, or <node>_<output name>) and a count of that name's
//   uses, and record whether they stand for a variable (isArg, argName) and
//   are read as auxiliary states (isAux);
// - region k (counting the groups the review rejects) is named _op<k> and
//   records the review's attributes; a rejected group's nodes stay outside.
// The graph is then numbered as MXNet writes it, in g's own node objects;
// those left over are emptied, unread, and MXNet drops them.
#include <algorithm>
#include <memory>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "../graph_edit.h"
#include "partitioner.h"
#include "regions.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

using mxamp_graph::connect;

// A node's output: the graph's nodes by index, then the regions made.
struct Ref {
  int node, entry;
};

// An input read: of a node (reader < the graph's size; key its place in
// the list of all nodes' inputs), of a region (reader = its Ref index), or
// a graph output (reader -1, k its index).
struct Slot {
  int reader, k;
};

struct Made {
  int id;  // the group's number
  std::vector<Ref> inputs;
  std::vector<size_t> input_order;  // each input's place in MXNet's walk
  size_t outputs;
  Node* node;  // its contents, until the graph is rebuilt
};

// What MXNet calls each output of each node: `outputs` per node (from
// option entry_types), names other than the usual from option output_names.
class OutputNames {
 public:
  explicit OutputNames(const Attrs& options) {
    read(options, "entry_types", [this](int i, std::vector<std::string> codes) {
      if (static_cast<int>(counts_.size()) <= i) counts_.resize(i + 1, 0);
      counts_[i] = codes.size();
    });
    read(options, "output_names",
         [this](int i, std::vector<std::string> names) { names_[i] = std::move(names); });
  }

  std::string of(int node, const std::string& name, int entry) const {
    auto given = names_.find(node);
    std::string out = given != names_.end() && entry < static_cast<int>(given->second.size())
                          ? given->second[entry]
                      : static_cast<size_t>(node) < counts_.size() && counts_[node] == 1
                          ? "output"
                          : "output" + std::to_string(entry);
    return name.empty() ? out : name + "_" + out;
  }

 private:
  template <class F>
  static void read(const Attrs& options, const std::string& key, F use) {
    auto it = options.find(key);
    if (it == options.end()) return;
    std::istringstream lines(it->second);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream in(line);
      int index;
      std::string op;
      std::vector<std::string> words;
      if (!(in >> index >> op) || index < 0)
        throw std::invalid_argument("option " + key + ": '" + line + "' is not '<index> <op> ...'");
      for (std::string w; in >> w;) words.push_back(w);
      use(index, std::move(words));
    }
  }

  std::vector<size_t> counts_;
  std::unordered_map<int, std::vector<std::string>> names_;
};

// Whether MXNet counts what input k of n reads as an auxiliary state (its
// row's aux).
bool reads_aux(const Node* n, size_t k) {
  const Row* row = row_of(n);
  return row && row->is_aux(static_cast<int>(k));
}

class Former {
 public:
  Former(Graph* g, const Attrs& options)
      : g_(g), options_(options), names_(options), size_(static_cast<int>(g->size())) {
    std::unordered_map<const Node*, int> index;
    for (int i = 0; i < size_; ++i) index[g->getNode(i)] = i;
    first_.push_back(0);
    for (int i = 0; i < size_; ++i) {
      for (const NodeEntry& e : g->getNode(i)->inputs) src_.push_back({index.at(e.node), e.entry});
      first_.push_back(src_.size());
    }
    readers_.resize(size_);
    for (int i = 0; i < size_; ++i)
      for (int k = 0; k < inputs(i); ++k) readers_[src_[key(i, k)].node].push_back({i, k});
    for (const NodeEntry& h : g->outputs) heads_.push_back({index.at(h.node), h.entry});
    cut_.assign(src_.size(), false);
    number_inputs();
  }

  void run(const std::vector<bool>& chosen) {
    std::vector<std::vector<int>> groups = find_groups(g_, chosen);
    group_of_.assign(size_, -1);
    for (size_t i = 0; i < groups.size(); ++i)
      for (int u : groups[i]) group_of_[u] = static_cast<int>(i);
    for (size_t i = 0; i < groups.size(); ++i) make(groups[i], static_cast<int>(i));
    rebuild();
  }

 private:
  int inputs(int i) const { return static_cast<int>(first_[i + 1] - first_[i]); }
  size_t key(int i, int k) const { return first_[i] + k; }
  bool is_made(int node) const { return node >= size_; }

  // Each input's place in MXNet's walk (TopSortEntries): depth-first from
  // the graph's outputs in order, an input placed when the node it reads is
  // done, or at once when that node was done before.
  void number_inputs() {
    order_.assign(src_.size() + heads_.size(), 0);
    std::vector<bool> seen(size_, false);
    std::vector<std::pair<int, size_t>> stack;  // node, its next input
    std::vector<size_t> via;                    // the input each node was reached by
    size_t next = 0;
    for (size_t h = 0; h < heads_.size(); ++h) {
      size_t head = src_.size() + h;
      int n = heads_[h].node;
      if (seen[n]) order_[head] = next++;
      else seen[n] = true, stack.push_back({n, 0}), via.push_back(head);
      while (!stack.empty()) {
        auto& top = stack.back();
        if (top.second == static_cast<size_t>(inputs(top.first))) {
          order_[via.back()] = next++;
          stack.pop_back(), via.pop_back();
          continue;
        }
        size_t k = key(top.first, static_cast<int>(top.second++));
        int in = src_[k].node;
        if (seen[in]) order_[k] = next++;
        else seen[in] = true, stack.push_back({in, 0}), via.push_back(k);
      }
    }
  }

  std::string entry_name(const Ref& r) const {
    if (is_made(r.node)) {
      const Made& m = made_[r.node - size_];
      return "_op" + std::to_string(m.id) + "_output" +
             (m.outputs == 1 ? "" : std::to_string(r.entry));
    }
    const Node* n = g_->getNode(r.node);
    return n->op == "null" ? n->name : names_.of(r.node, n->name, r.entry);
  }

  const Node* node_of(int node) const {
    return is_made(node) ? made_[node - size_].node : g_->getNode(node);
  }

  Ref& value(const Slot& s) {
    if (s.reader < 0) return heads_[s.k];
    if (is_made(s.reader)) return made_[s.reader - size_].inputs[s.k];
    return src_[key(s.reader, s.k)];
  }

  size_t place(const Slot& s) const {
    if (s.reader < 0) return order_[src_.size() + s.k];
    if (is_made(s.reader)) return made_[s.reader - size_].input_order[s.k];
    return order_[key(s.reader, s.k)];
  }

  void sort_slots(std::vector<Slot>* slots) const {
    std::sort(slots->begin(), slots->end(),
              [this](const Slot& a, const Slot& b) { return place(a) < place(b); });
  }

  std::vector<Slot> group_inputs(const std::vector<int>& group, int id) const {
    std::vector<Slot> in;
    for (int u : group)
      for (int k = 0; k < inputs(u); ++k) {
        const Ref& r = src_[key(u, k)];
        if (is_made(r.node) || group_of_[r.node] != id) in.push_back({u, k});
      }
    sort_slots(&in);
    return in;
  }

  std::vector<Slot> group_outputs(const std::vector<int>& group, int id) {
    std::vector<Slot> out;
    for (int u : group)
      for (const Slot& s : readers_[u]) {
        bool outside = is_made(s.reader) ||
                       (!cut_[key(s.reader, s.k)] && group_of_[s.reader] != id);
        if (outside && value(s).node == u) out.push_back(s);
      }
    for (size_t h = 0; h < heads_.size(); ++h)
      if (!is_made(heads_[h].node) && group_of_[heads_[h].node] == id)
        out.push_back({-1, static_cast<int>(h)});
    sort_slots(&out);
    return out;
  }

  Graph* subgraph(const std::vector<Slot>& in, const std::vector<Ref>& heads);
  Node* add_variable(Graph* sub, const Ref& from, const std::string& name) const;
  std::vector<std::string> variable_names(const std::vector<Slot>& in) const;
  void make(const std::vector<int>& group, int id);
  int arity(int node) const {
    return is_made(node) ? static_cast<int>(made_[node - size_].inputs.size()) : inputs(node);
  }
  const Ref& input_of(int node, int k) const {
    return is_made(node) ? made_[node - size_].inputs[k] : src_[key(node, k)];
  }
  std::vector<int> outer_order() const;
  void rebuild();

  Graph* g_;
  const Attrs& options_;
  OutputNames names_;
  int size_;
  std::vector<size_t> first_;  // each node's first input's key
  std::vector<Ref> src_;       // what each input of each node reads now
  std::vector<bool> cut_;      // inputs a region's variable reads instead
  std::vector<Ref> heads_;
  std::vector<std::vector<Slot>> readers_;  // each node's readers, regions added
  std::vector<size_t> order_;               // by key, then the graph outputs
  std::vector<int> group_of_;
  std::vector<Made> made_;
  std::vector<std::unique_ptr<Node>> contents_;  // the regions' nodes' contents
};

// Variable `name` of a subgraph, standing for `from`.
Node* Former::add_variable(Graph* sub, const Ref& from, const std::string& name) const {
  Node* v = sub->addNode(name, "null");
  const Node* n = node_of(from.node);
  bool variable = !is_made(from.node) && n->op == "null";
  v->attrs["isArg"] = variable ? "True" : "False";
  if (variable) v->attrs["argName"] = n->name;
  auto dtype = n->attrs.find(MX_STR_DTYPE);
  if (dtype != n->attrs.end())
    v->attrs[MX_STR_DTYPE] = "[" + getDtypeAt(dtype->second, from.entry) + "]";
  auto shape = n->attrs.find(MX_STR_SHAPE);
  if (shape != n->attrs.end())
    v->attrs[MX_STR_SHAPE] = "[" + getShapeAt(shape->second, from.entry) + "]";
  sub->inputs.push_back(v);
  return v;
}

// The names of the variables standing for inputs `in`, in order.
std::vector<std::string> Former::variable_names(const std::vector<Slot>& in) const {
  std::unordered_map<std::string, int> uses;
  std::vector<std::string> out;
  for (const Slot& s : in) {
    std::string name = entry_name(src_[key(s.reader, s.k)]);
    auto count = uses.emplace(name, 0);
    out.push_back(name + std::to_string(count.second ? 0 : ++count.first->second));
  }
  return out;
}

// The subgraph of the group whose inputs `in` (in order) are read from
// outside and whose outputs are `heads`, its nodes in MXNet's order.
Graph* Former::subgraph(const std::vector<Slot>& in, const std::vector<Ref>& heads) {
  std::unique_ptr<Graph> sub(new Graph());
  std::unordered_map<size_t, int> variable;  // a cut input's key -> its variable
  for (size_t i = 0; i < in.size(); ++i) variable[key(in[i].reader, in[i].k)] = static_cast<int>(i);
  std::vector<Node*> vars(in.size(), nullptr);
  std::unordered_map<int, Node*> made;  // a group node -> its copy
  const std::vector<std::string> names = variable_names(in);
  // depth-first from the outputs, a node after its inputs
  std::vector<std::pair<int, int>> stack;  // group node, its next input
  auto copy = [&](int u) {
    const Node* from = g_->getNode(u);
    Node* n = sub->addNode(from->name, from->op);
    n->attrs = from->attrs;
    n->subgraphs = from->subgraphs;
    made[u] = n;
    for (int k = 0; k < inputs(u); ++k) {
      auto v = variable.find(key(u, k));
      connect(v == variable.end() ? NodeEntry{made.at(src_[key(u, k)].node), src_[key(u, k)].entry}
                                  : NodeEntry{vars[v->second], 0},
              n, k);
    }
  };
  for (const Ref& h : heads) {
    if (!made.count(h.node)) stack.push_back({h.node, 0});
    while (!stack.empty()) {
      auto& top = stack.back();
      int u = top.first;
      if (top.second == inputs(u)) {
        if (!made.count(u)) copy(u);
        stack.pop_back();
        continue;
      }
      int k = top.second++;
      auto v = variable.find(key(u, k));
      if (v != variable.end()) {
        if (!vars[v->second])
          vars[v->second] = add_variable(sub.get(), src_[key(u, k)], names[v->second]);
      } else if (!made.count(src_[key(u, k)].node)) {
        stack.push_back({src_[key(u, k)].node, 0});
      }
    }
  }
  std::unordered_set<std::string> aux;
  for (size_t i = 0; i < sub->size(); ++i)
    for (const NodeEntry& o : sub->getNode(i)->outputs)
      if (sub->getNode(i)->op == "null" && reads_aux(o.node, o.entry))
        aux.insert(sub->getNode(i)->name);
  for (Node* v : sub->inputs) v->attrs["isAux"] = aux.count(v->name) ? "True" : "False";
  for (const Ref& h : heads) sub->outputs.push_back({made.at(h.node), h.entry});
  return sub.release();
}

// "[<x of output 0>,<x of output 1>,...]" of the subgraph's outputs, x
// their nodes' attribute `key` (MXNet's shape or dtype list), empty where
// not given.
std::string output_list(const Graph* sub, const char* key,
                        std::string (*at)(const std::string&, unsigned)) {
  std::string out = "[";
  for (size_t i = 0; i < sub->outputs.size(); ++i) {
    const NodeEntry& e = sub->outputs[i];
    auto it = e.node->attrs.find(key);
    if (i) out += ",";
    if (it != e.node->attrs.end()) out += at(it->second, e.entry);
  }
  return out + "]";
}

// The group's region made, unless the review rejects it.
void Former::make(const std::vector<int>& group, int id) {
  std::vector<Slot> in = group_inputs(group, id);
  std::vector<Slot> out = group_outputs(group, id);
  std::vector<Ref> heads;
  for (const Slot& s : out) heads.push_back(value(s));
  std::unique_ptr<Graph> sub(subgraph(in, heads));
  Attrs attrs;
  if (!review(sub.get(), options_, &attrs)) return;
  contents_.emplace_back(new Node());
  Node* n = contents_.back().get();
  n->op = kRegionOp;
  n->name = "_op" + std::to_string(id);
  n->attrs[MX_STR_SHAPE] = output_list(sub.get(), MX_STR_SHAPE, getShapeAt);
  n->attrs[MX_STR_DTYPE] = output_list(sub.get(), MX_STR_DTYPE, getDtypeAt);
  for (const auto& kv : attrs) n->attrs[kv.first] = kv.second;
  n->subgraphs.push_back(sub.release());
  const int self = size_ + static_cast<int>(made_.size());
  Made m{id, {}, {}, out.size(), n};
  for (size_t k = 0; k < in.size(); ++k) {
    size_t at = key(in[k].reader, in[k].k);
    cut_[at] = true;
    m.inputs.push_back(src_[at]);
    m.input_order.push_back(order_[at]);
    if (!is_made(src_[at].node)) readers_[src_[at].node].push_back({self, static_cast<int>(k)});
  }
  made_.push_back(m);
  for (size_t i = 0; i < out.size(); ++i) value(out[i]) = {self, static_cast<int>(i)};
}

// The nodes outside regions and the regions, as MXNet writes them:
// depth-first from the graph's outputs, a node after its inputs.
std::vector<int> Former::outer_order() const {
  std::vector<int> order;
  std::vector<bool> seen(size_ + made_.size(), false);
  std::vector<std::pair<int, int>> stack;  // node, its next input
  for (const Ref& h : heads_) {
    if (!seen[h.node]) seen[h.node] = true, stack.push_back({h.node, 0});
    while (!stack.empty()) {
      auto& top = stack.back();
      if (top.second == arity(top.first)) {
        order.push_back(top.first);
        stack.pop_back();
        continue;
      }
      int in = input_of(top.first, top.second++).node;
      if (!seen[in]) seen[in] = true, stack.push_back({in, 0});
    }
  }
  return order;
}

// Moves what a node is (not its edges) from `from` to `to`, which reads
// nothing yet; `from` is left an unread variable without a name.
void take(Node* to, Node* from) {
  to->op = std::exchange(from->op, "null");
  to->name = std::exchange(from->name, "");
  to->attrs = std::move(from->attrs);
  to->subgraphs = std::move(from->subgraphs);
  to->tensor = std::exchange(from->tensor, nullptr);
  for (Node* n : {to, from}) n->inputs.clear(), n->outputs.clear();
}

// g's nodes, in outer_order, in the node objects g has (whose tensors and
// allocation come from MXNet): the first of them hold the result, the
// rest are left empty.
void Former::rebuild() {
  const std::vector<int> order = outer_order();
  std::vector<std::unique_ptr<Node>> was;
  for (int i = 0; i < size_; ++i) {
    was.emplace_back(new Node());
    take(was.back().get(), g_->getNode(i));
  }
  std::vector<Node*> at(size_ + made_.size(), nullptr);
  for (size_t t = 0; t < order.size(); ++t) {
    int v = order[t];
    at[v] = g_->getNode(t);
    take(at[v], is_made(v) ? made_[v - size_].node : was[v].get());
  }
  g_->inputs.clear();
  for (size_t t = 0; t < order.size(); ++t) {
    Node* n = g_->getNode(t);
    for (int k = 0; k < arity(order[t]); ++k) {
      const Ref& r = input_of(order[t], k);
      connect({at[r.node], r.entry}, n, k);
    }
    if (n->op == "null") g_->inputs.push_back(n);
  }
  for (size_t h = 0; h < heads_.size(); ++h)
    g_->outputs[h] = {at[heads_[h].node], heads_[h].entry};
}

}  // namespace

void form_regions(Graph* g, const Attrs& options) {
  std::vector<bool> chosen = chosen_nodes(g, options);  // first: it starts the report anew
  Former(g, options).run(chosen);
}

}  // namespace mxamp_onednn
