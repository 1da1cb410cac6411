// Editing a graph of MXNet's extension API, shared by mxamp's libraries:
// edges recorded at both ends (lib_api orders the nodes it writes by them),
// names unique within a graph, and one amp_cast per (entry, dtype).
#ifndef MXAMP_GRAPH_EDIT_H_
#define MXAMP_GRAPH_EDIT_H_

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mxnet/lib_api.h"

namespace mxamp_graph {

using mxnet::ext::Graph;
using mxnet::ext::Node;
using mxnet::ext::NodeEntry;

// Makes `reader` read `from` at input `slot` (growing its inputs to reach it).
inline void connect(const NodeEntry& from, Node* reader, size_t slot) {
  if (reader->inputs.size() <= slot) reader->inputs.resize(slot + 1);
  reader->inputs[slot] = from;
  from.node->outputs.push_back({reader, static_cast<int>(slot)});
}

// The producer of `reader`'s input `slot` forgets the edge (the input stays
// until the caller replaces or drops it).
inline void disconnect(Node* reader, size_t slot) {
  auto& outs = reader->inputs[slot].node->outputs;
  for (auto it = outs.begin(); it != outs.end(); ++it) {
    if (it->node == reader && it->entry == static_cast<int>(slot)) {
      outs.erase(it);
      return;
    }
  }
}

// Makes `reader` read `to` at input `slot` instead; the old producer forgets
// the edge.
inline void rewire(Node* reader, size_t slot, const NodeEntry& to) {
  disconnect(reader, slot);
  connect(to, reader, slot);
}

// MXNet's JSON order of the nodes `heads` reach (nnvm's, which also lists a
// subgraph's inputs, and so a region's): from each head in turn,
// depth-first, a node after its inputs. `input(n, k)` is the node n's input
// k stands for (a caller may look through regions).
template <typename NodePtr, typename InputOf>
std::vector<NodePtr> mxnet_order(const std::vector<NodePtr>& heads, InputOf input) {
  std::vector<NodePtr> order;
  std::set<NodePtr> seen;
  std::vector<std::pair<NodePtr, size_t>> stack;
  for (NodePtr head : heads) {
    if (seen.insert(head).second) stack.push_back({head, 0});
    while (!stack.empty()) {
      NodePtr n = stack.back().first;
      size_t k = stack.back().second++;
      if (k == n->inputs.size()) {
        order.push_back(n);
        stack.pop_back();
      } else {
        NodePtr in = input(n, k);
        if (seen.insert(in).second) stack.push_back({in, 0});
      }
    }
  }
  return order;
}

// A variable or output 0 is named by its node; a later output gets its index.
inline std::string entry_name(const NodeEntry& e) {
  return e.entry == 0 ? e.node->name : e.node->name + "_" + std::to_string(e.entry);
}

// New nodes of one graph: names made unique against the graph's (a model may
// hold a node named like a cast, and two nodes of one name confuse binding and
// lookup by name), and one cast per (entry, dtype), named
// <entry>_amp_cast_<dtype>, so that the result does not depend on the order
// in which readers ask.
class Additions {
 public:
  // `cast_op`: the cast operator's name, as the caller's table spells it.
  Additions(Graph* g, std::string cast_op) : g_(g), cast_op_(std::move(cast_op)) {
    for (size_t i = 0; i < g->size(); ++i) names_.insert(g->getNode(i)->name);
  }

  // The graph's own casts serve as the new ones would.
  void adopt_casts() {
    for (size_t i = 0; i < g_->size(); ++i) {
      Node* n = g_->getNode(i);
      auto dtype = n->attrs.find("dtype");
      if (n->op == cast_op_ && !n->inputs.empty() && dtype != n->attrs.end())
        casts_[{{n->inputs[0].node, n->inputs[0].entry}, dtype->second}] = n;
    }
  }

  // `name`, or `name`_1, _2, ... where the graph has it already.
  std::string unique(const std::string& name) {
    std::string found = name;
    for (int k = 1; !names_.insert(found).second; ++k) found = name + "_" + std::to_string(k);
    return found;
  }

  // The cast of `e` to `dtype`, made on first use.
  Node* cast(const NodeEntry& e, const std::string& dtype) {
    Node*& made = casts_[{{e.node, e.entry}, dtype}];
    if (made == nullptr) {
      made = g_->addNode(unique(entry_name(e) + "_amp_cast_" + dtype), cast_op_);
      made->attrs["dtype"] = dtype;
      connect(e, made, 0);
    }
    return made;
  }

 private:
  Graph* g_;
  std::string cast_op_;
  std::set<std::string> names_;
  std::map<std::pair<std::pair<Node*, int>, std::string>, Node*> casts_;
};

}  // namespace mxamp_graph

#endif  // MXAMP_GRAPH_EDIT_H_
