// Which chosen nodes group into one region (regions.h, find_groups), by the
// rules of MXNet 1.9.1's build_subgraph (LabelSubgraph and
// PreSelectSubgraphNodes), each step in time linear in what it visits.
#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "regions.h"

namespace mxamp_onednn {
namespace {

// Where a node outside a group touches it: the largest index of a group
// node reading it, and of a group node it reads (-1: none).
struct Touch {
  int read_by = -1, reads = -1;
};

class Grouping {
 public:
  Grouping(const Graph* g, const std::vector<bool>& chosen)
      : chosen_(chosen), label_(g->size(), -1), seen_(g->size(), 0), in_(g->size()),
        out_(g->size()) {
    std::unordered_map<const Node*, int> index;
    for (size_t i = 0; i < g->size(); ++i) index[g->getNode(i)] = static_cast<int>(i);
    for (size_t i = 0; i < g->size(); ++i)
      for (const NodeEntry& e : g->getNode(i)->inputs) {
        int p = index.at(e.node);
        in_[i].push_back(p);
        // a reader once, however many of its inputs it reads p at
        if (out_[p].empty() || out_[p].back() != static_cast<int>(i))
          out_[p].push_back(static_cast<int>(i));
      }
  }

  std::vector<std::vector<int>> find() {
    std::vector<std::vector<int>> groups;
    for (int s = 0; s < static_cast<int>(label_.size()); ++s)
      if (label_[s] == -1 && chosen_[s]) groups.push_back(grow(s, static_cast<int>(groups.size())));
    return groups;
  }

 private:
  // The group of seed s, labelled `id`: as large as no cycle forbids, or s
  // alone where excluding nodes does not help (as MXNet gives up).
  std::vector<int> grow(int s, int id) {
    std::unordered_set<int> excluded;
    for (;;) {
      std::vector<int> group = label(s, id, excluded);
      int breaker = cycle_breaker(group, id);
      if (breaker < 0) {
        std::sort(group.begin(), group.end());
        return group;
      }
      for (int u : group) label_[u] = -1;
      if (!excluded.insert(breaker).second) {
        label_[s] = id;
        return {s};
      }
    }
  }

  // Breadth-first from s through chosen, unlabelled, not excluded nodes.
  std::vector<int> label(int s, int id, const std::unordered_set<int>& excluded) {
    std::vector<int> group;
    std::queue<int> queue;
    label_[s] = id;
    queue.push(s);
    auto visit = [&](int v) {
      if (label_[v] == -1 && chosen_[v] && !excluded.count(v)) {
        label_[v] = id;
        queue.push(v);
      }
    };
    while (!queue.empty()) {
      int u = queue.front();
      queue.pop();
      group.push_back(u);
      for (int p : in_[u]) visit(p);
      for (int c : out_[u]) visit(c);
    }
    return group;
  }

  // The node whose exclusion breaks a cycle through the group and the
  // unlabelled nodes around it, or -1: MXNet's largest candidate.
  int cycle_breaker(const std::vector<int>& group, int id) {
    std::map<int, Touch> around;  // by index, as MXNet sorts them
    for (int u : group) {
      for (int p : in_[u])
        if (label_[p] == -1) around[p].read_by = std::max(around[p].read_by, u);
      for (int c : out_[u])
        if (label_[c] == -1) around[c].reads = std::max(around[c].reads, u);
    }
    std::vector<std::pair<int, Touch>> nodes(around.begin(), around.end());
    int breaker = -1;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Touch& a = nodes[i].second;
      if (a.read_by >= 0 && a.reads >= 0) {
        breaker = std::max({breaker, a.read_by, a.reads});
      } else if (a.reads >= 0) {
        for (size_t j = i + 1; j < nodes.size(); ++j) {
          const Touch& b = nodes[j].second;
          if (b.read_by >= 0 && std::max(a.reads, b.read_by) > breaker &&
              is_ancestor(nodes[i].first, nodes[j].first, id))
            breaker = std::max(a.reads, b.read_by);
        }
      }
    }
    return breaker;
  }

  // Whether `ancestor` reaches `descendant` by nodes outside group `id`, as
  // MXNet's search answers: its depth-first walk keeps no record of visits
  // and stops after as many steps as the graph has nodes. It runs only where
  // a walk that does keep one (and skips nodes before `ancestor`, which
  // cannot lie between) finds a path.
  bool is_ancestor(int ancestor, int descendant, int id) {
    if (!reaches(ancestor, descendant, id)) return false;
    std::vector<int> stack{descendant};
    for (size_t count = 0; !stack.empty() && count < label_.size(); ++count) {
      int top = stack.back();
      stack.pop_back();
      if (top == ancestor) return true;
      for (int p : in_[top])
        if (label_[p] != id) stack.push_back(p);
    }
    return false;
  }

  bool reaches(int ancestor, int descendant, int id) {
    ++stamp_;
    std::vector<int> stack{descendant};
    seen_[descendant] = stamp_;
    while (!stack.empty()) {
      int top = stack.back();
      stack.pop_back();
      if (top == ancestor) return true;
      for (int p : in_[top])
        if (p >= ancestor && label_[p] != id && seen_[p] != stamp_) {
          seen_[p] = stamp_;
          stack.push_back(p);
        }
    }
    return false;
  }

  const std::vector<bool>& chosen_;
  std::vector<int> label_;  // a node's group, -1 for none
  std::vector<int> seen_;   // the walk that last saw a node
  int stamp_ = 0;
  std::vector<std::vector<int>> in_;   // what each input reads
  std::vector<std::vector<int>> out_;  // the nodes reading each node
};

}  // namespace

std::vector<std::vector<int>> find_groups(const Graph* g, const std::vector<bool>& chosen) {
  return Grouping(g, chosen).find();
}

}  // namespace mxamp_onednn
