/*
 * mxamp graph pass: applies the per-input cast decisions that mxamp's Python
 * frontend computed, inserting amp_cast / amp_multicast nodes.
 *
 * The decisions arrive in the wire format defined in mxamp/convert/wire.py
 * (the options "decisions" and "outputs"). No node names travel: a line
 * names its node by index (a path of indices for a node inside a control-flow
 * body) and op, and the pass checks that the node at that
 * index has that op, that no node gets two lines, that there is one code per
 * input (per graph output) and that every code is known; anything else fails
 * the pass with an error naming the problem. A line whose path ends at a body
 * (<node>/<subgraph>) and whose op is "outputs" casts that body's outputs.
 * The pass owns the cast cache: one amp_cast per (entry, dtype) in the whole
 * graph (a body's entries are cast inside that body), named after the entry it casts (made unique against the graph's
 * names), so the result does not depend on the order in which nodes are
 * visited.
 */
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "graph_edit.h"
#include "mxnet/lib_api.h"

using mxnet::ext::Graph;
using mxnet::ext::MXReturnValue;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using mxnet::ext::Node;
using mxnet::ext::NodeEntry;

namespace {

// Attributes MXNet attaches to carry information into a pass; they must not
// survive into the user's symbol.
bool IsPassOnlyAttr(const std::string& key) {
  return key.rfind("__ext_", 0) == 0;
}

class CastInserter {
 public:
  explicit CastInserter(std::string target_dtype) : target_dtype_(std::move(target_dtype)) {}

  // Applies one decision string to `node` of `graph` (the main graph or a
  // control-flow body); returns false (with a message) on bad input.
  bool ApplyNode(Graph* graph, Node* node, const std::string& codes) {
    if (codes.size() != node->inputs.size()) {
      MX_ERROR_MSG << "mxamp: node '" << node->name << "' (" << node->op << ") has "
                   << node->inputs.size() << " inputs but its cast decision '" << codes
                   << "' has " << codes.size() << " entries";
      return false;
    }
    if (codes.find('m') != std::string::npos) {
      if (codes.find_first_not_of('m') != std::string::npos) {
        MX_ERROR_MSG << "mxamp: node '" << node->name << "' mixes multicast with other "
                     << "decisions in '" << codes << "'; multicast covers all inputs or none";
        return false;
      }
      InsertMulticast(graph, node);
      return true;
    }
    for (size_t i = 0; i < codes.size(); ++i) {
      if (codes[i] == '.') continue;
      std::string dtype;
      if (!DtypeOf(codes[i], &dtype)) {
        MX_ERROR_MSG << "mxamp: node '" << node->name << "' has unknown cast code '"
                     << codes[i] << "' for input " << i << " (allowed: . l f m)";
        return false;
      }
      mxamp_graph::rewire(node, i, {CastOf(graph, node->inputs[i], dtype), 0});
    }
    return true;
  }

  // Applies the decision for the outputs of `graph` (the main graph, or a
  // control-flow body described by `where`).
  bool ApplyOutputs(Graph* graph, const std::string& codes,
                    const std::string& where = "the graph") {
    if (codes.size() != graph->outputs.size()) {
      MX_ERROR_MSG << "mxamp: " << where << " has " << graph->outputs.size()
                   << " outputs but the output decision '" << codes << "' has "
                   << codes.size() << " entries";
      return false;
    }
    for (size_t i = 0; i < codes.size(); ++i) {
      if (codes[i] == '.') continue;
      std::string dtype;
      if (!DtypeOf(codes[i], &dtype)) {
        MX_ERROR_MSG << "mxamp: unknown output cast code '" << codes[i]
                     << "' for output " << i << " (allowed: . l f)";
        return false;
      }
      graph->outputs[i] = {CastOf(graph, graph->outputs[i], dtype), 0};
    }
    return true;
  }

 private:
  bool DtypeOf(char code, std::string* dtype) const {
    if (code == 'l') *dtype = target_dtype_;
    else if (code == 'f') *dtype = "float32";
    else return false;
    return true;
  }

  // The single amp_cast of `src` (an entry of `graph`) to `dtype`; a body's
  // casts are its own, as its entries are.
  Node* CastOf(Graph* graph, const NodeEntry& src, const std::string& dtype) {
    return AdditionsTo(graph).cast(src, dtype);
  }

  // One amp_multicast per consuming node, named after that node.
  void InsertMulticast(Graph* graph, Node* node) {
    Node* multicast =
        graph->addNode(AdditionsTo(graph).unique(node->name + "_amp_multicast"), "amp_multicast");
    multicast->attrs["num_outputs"] = std::to_string(node->inputs.size());
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      mxamp_graph::connect(node->inputs[i], multicast, i);
    }
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      mxamp_graph::rewire(node, i, {multicast, static_cast<int>(i)});
    }
  }

  // Made on a graph's first cast, when it holds the nodes the decisions name.
  mxamp_graph::Additions& AdditionsTo(Graph* graph) {
    return additions_.try_emplace(graph, graph, "amp_cast").first->second;
  }

  std::string target_dtype_;
  std::map<Graph*, mxamp_graph::Additions> additions_;
};

// The op field of a line for a body's outputs (wire.BODY_OUTPUTS).
const char kBodyOutputs[] = "outputs";

// Splits "<node path> <op> <codes>" (see mxamp/convert/wire.py); false if the
// line has another shape. A path is a node index, followed for a node inside a
// control-flow body by "/<subgraph index>/<node index>" per level; a line for
// a body's outputs ends its path at the subgraph index. An index of more than
// 9 digits counts as malformed, so that it cannot overflow.
bool ParseLine(const std::string& line, std::vector<size_t>* path, std::string* op,
               std::string* codes) {
  std::istringstream fields(line);
  std::string text, extra;
  if (!(fields >> text >> *op >> *codes) || fields >> extra) return false;
  std::istringstream parts(text);
  std::string number;
  path->clear();
  while (std::getline(parts, number, '/')) {
    if (number.empty() || number.size() > 9 ||
        number.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    path->push_back(std::stoul(number));
  }
  return (path->size() % 2 == 1 || *op == kBodyOutputs) && text.back() != '/';
}

// Node counts of `graph` and of every body inside it, before any cast is
// appended: a decision may name only the nodes the decisions were made for.
void CountNodes(Graph* graph, std::map<Graph*, size_t>* sizes) {
  (*sizes)[graph] = graph->size();
  for (size_t i = 0; i < graph->size(); ++i) {
    for (Graph* body : graph->getNode(i)->subgraphs) CountNodes(body, sizes);
  }
}

// The node a decision line's path names, and the graph (main or body) that
// holds it; for a path ending at a body, that body (with `node` null and
// `where` describing it). False (with a message) if the path leads nowhere.
bool Resolve(Graph* graph, const std::vector<size_t>& path,
             const std::map<Graph*, size_t>& sizes, const std::string& line, Graph** owner,
             Node** node, std::string* where) {
  *where = "the graph";
  for (size_t level = 0;; level += 2) {
    *owner = graph;
    *node = nullptr;
    if (level == path.size()) return true;
    const size_t count = sizes.at(graph);
    if (path[level] >= count) {
      MX_ERROR_MSG << "mxamp: decision line '" << line << "' names node " << path[level]
                   << ", but " << *where << " has " << count << " nodes";
      return false;
    }
    *node = graph->getNode(path[level]);
    if (level + 1 == path.size()) return true;
    const size_t k = path[level + 1];
    if (k >= (*node)->subgraphs.size()) {
      MX_ERROR_MSG << "mxamp: decision line '" << line << "' names subgraph " << k
                   << " of node '" << (*node)->name << "', which has "
                   << (*node)->subgraphs.size() << " subgraphs";
      return false;
    }
    *where = "subgraph " + std::to_string(k) + " of node '" + (*node)->name + "'";
    graph = (*node)->subgraphs[k];
  }
}

// Removes the pass-only attributes from every node of `graph` and its bodies.
void DropPassOnlyAttrs(Graph* graph) {
  for (size_t i = 0; i < graph->size(); ++i) {
    Node* node = graph->getNode(i);
    for (auto it = node->attrs.begin(); it != node->attrs.end();) {
      it = IsPassOnlyAttr(it->first) ? node->attrs.erase(it) : std::next(it);
    }
    for (Graph* body : node->subgraphs) DropPassOnlyAttrs(body);
  }
}

// Applies the decision lines to `graph` and its bodies; false (with a
// message) for a line that is malformed, names no node, names a node by
// another op than its own, or repeats a node or a body's outputs.
bool ApplyDecisions(Graph* graph, const std::string& decisions, CastInserter* inserter) {
  // Casts are appended behind the original nodes, so indices stay valid.
  std::map<Graph*, size_t> sizes;
  CountNodes(graph, &sizes);
  std::set<Node*> decided;
  std::set<Graph*> decided_outputs;
  std::istringstream lines(decisions);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<size_t> path;
    std::string op, codes;
    if (!ParseLine(line, &path, &op, &codes)) {
      MX_ERROR_MSG << "mxamp: malformed decision line '" << line
                   << "' (expected '<node index> <op> <codes>')";
      return false;
    }
    Graph* owner;
    Node* node;
    std::string where;
    if (!Resolve(graph, path, sizes, line, &owner, &node, &where)) return false;
    const std::string id = line.substr(0, line.find(' '));
    if (node == nullptr) {  // the outputs of a body
      if (!decided_outputs.insert(owner).second) {
        MX_ERROR_MSG << "mxamp: the outputs of " << where << " have two decision lines";
        return false;
      }
      if (!inserter->ApplyOutputs(owner, codes, where)) return false;
      continue;
    }
    if (node->op != op) {
      MX_ERROR_MSG << "mxamp: decision line '" << line << "' is for a " << op << ", but node "
                   << id << " is " << (node->op == "null" ? "the variable" : "a " + node->op)
                   << " '" << node->name << "': the nodes are numbered differently from "
                   << "the graph the decisions were made for";
      return false;
    }
    if (!decided.insert(node).second) {
      MX_ERROR_MSG << "mxamp: node " << id << " has two decision lines";
      return false;
    }
    if (!inserter->ApplyNode(owner, node, codes)) return false;
  }
  return true;
}

MXReturnValue ReducePrecision(Graph* graph,
                              const std::unordered_map<std::string, std::string>& options) {
  auto target = options.find("target_dtype");
  if (target == options.end() ||
      (target->second != "float16" && target->second != "bfloat16")) {
    MX_ERROR_MSG << "mxamp: option target_dtype must be 'float16' or 'bfloat16'";
    return MX_FAIL;
  }
  auto outputs = options.find("outputs");
  if (outputs == options.end()) {
    MX_ERROR_MSG << "mxamp: option 'outputs' (one cast code per graph output) is missing";
    return MX_FAIL;
  }
  auto decisions = options.find("decisions");
  if (decisions == options.end()) {
    MX_ERROR_MSG << "mxamp: option 'decisions' (the per-node cast codes) is missing";
    return MX_FAIL;
  }
  CastInserter inserter(target->second);
  if (!ApplyDecisions(graph, decisions->second, &inserter)) return MX_FAIL;
  if (!inserter.ApplyOutputs(graph, outputs->second)) return MX_FAIL;
  DropPassOnlyAttrs(graph);
  return MX_SUCCESS;
}

}  // namespace

REGISTER_PASS(mxamp_reduce_precision).setBody(ReducePrecision);

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "mxamp needs MXNet >= 1.9.0, found version " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
