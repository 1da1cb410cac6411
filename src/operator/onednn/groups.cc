// Which chosen nodes group into one region (regions.h, find_groups), by the
// rules of MXNet 1.9.1's build_subgraph (LabelSubgraph and
// PreSelectSubgraphNodes), each step in time linear in what it visits.
// MXNet excludes one node from a group per search, and each search walks
// the group: where cycles through nodes left outside are everywhere (a
// ladder whose every step also reads the last through such a node) that
// costs the cube of the graph's size. So a graph's first kExactExclusions
// exclusions follow MXNet's search exactly (random graphs of the tests'
// sizes make far fewer); past them, each search excludes at once every
// node MXNet's search would weigh (on a ladder, two searches a group).
// Either way a group is formed only once its search finds no cycle through
// it (MXNet's bounded search can miss one; untangle, below, runs such a
// group's nodes apart). A group still walks all it reaches first: a ladder's groups each walk the
// rest of it, time in the square of its steps (0.2 s at 1,600 steps).
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "regions.h"

namespace mxamp_onednn {
namespace {

// Where a node outside a group touches it: the largest index of a group
// node reading it, and of a group node it reads (-1: none).
struct Touch {
  int read_by = -1, reads = -1;
};

// Exclusions over the whole graph made one at a time, as MXNet makes them;
// past these, a search excludes all its candidates at once.
constexpr int kExactExclusions = 256;

class Grouping {
 public:
  Grouping(const Graph* g, const std::vector<bool>& chosen)
      : chosen_(chosen), label_(g->size(), -1), excluded_(g->size(), -1), seen_(g->size(), 0),
        touch_(g->size()), reached_(g->size(), 0), best_(g->size(), -1), in_(g->size()),
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
    untangle(&groups);
    return groups;
  }

 private:
  // The group of seed s, labelled `id`: as large as no cycle forbids, or s
  // alone where excluding nodes does not help (as MXNet gives up).
  std::vector<int> grow(int s, int id) {
    for (;;) {
      std::vector<int> group = label(s, id);
      std::vector<int> breakers = breakers_of(group, id);
      if (breakers.empty()) {
        std::sort(group.begin(), group.end());
        return group;
      }
      for (int u : group) label_[u] = -1;
      if (!exclude(breakers, id)) {
        label_[s] = id;
        return {s};
      }
    }
  }

  // The nodes to exclude from the group for a cycle through it, none if
  // there is none: MXNet's one while the graph's exclusions are few.
  std::vector<int> breakers_of(const std::vector<int>& group, int id) {
    if (exclusions_ >= kExactExclusions) return cycle_breakers(group, id);
    int breaker = cycle_breaker(group, id);
    if (breaker < 0) return {};
    return {breaker};
  }

  // Excludes `breakers` from group `id`; false where each already was (only
  // the seed can be: it stays labelled), where MXNet gives up.
  bool exclude(const std::vector<int>& breakers, int id) {
    bool fresh = false;
    for (int b : breakers)
      if (excluded_[b] != id) {
        excluded_[b] = id;
        ++exclusions_;
        fresh = true;
      }
    return fresh;
  }

  // Breadth-first from s through chosen, unlabelled nodes not excluded from
  // group `id`, in the order visited.
  std::vector<int> label(int s, int id) {
    std::vector<int> group{s};
    label_[s] = id;
    auto visit = [&](int v) {
      if (label_[v] == -1 && chosen_[v] && excluded_[v] != id) {
        label_[v] = id;
        group.push_back(v);
      }
    };
    for (size_t next = 0; next < group.size(); ++next) {
      int u = group[next];
      for (int p : in_[u]) visit(p);
      for (int c : out_[u]) visit(c);
    }
    return group;
  }

  // The node whose exclusion breaks a cycle through the group and the
  // unlabelled nodes around it, or -1: MXNet's largest candidate. MXNet
  // asks of every pair (a node reading the group, a later one the group
  // reads) whether a path outside the group joins them; a pair's candidate
  // is the larger of the two group nodes touching it, so only the largest
  // joined reader and the largest joined read count, each found by trying
  // the nodes in turn from the largest, after one walk says which can be.
  int cycle_breaker(const std::vector<int>& group, int id) {
    std::vector<std::pair<int, Touch>> nodes = around(group);
    int breaker = -1;
    std::vector<std::pair<int, Touch>> readers, read;  // readers: of the group only
    for (const auto& [v, t] : nodes) {
      if (t.read_by >= 0 && t.reads >= 0) breaker = std::max({breaker, t.read_by, t.reads});
      if (t.read_by >= 0) read.push_back({v, t});
      else if (t.reads >= 0) readers.push_back({v, t});
    }
    if (readers.empty() || read.empty() || readers.front().first > read.back().first)
      return breaker;
    breaker = std::max(breaker, largest_read_joined(readers, read, breaker, id));
    return std::max(breaker, largest_reader_joined(readers, read, breaker, id));
  }

  // The candidates MXNet's search weighs, where it takes only the largest
  // (the largest of each node the group reads):
  // for a node around the group that reads it and is read by it, the larger
  // of the two group nodes; for a node the group reads that a node reading
  // the group reaches outside it, the larger of its reader in the group and
  // the largest group node such a reader reads. One walk finds them: plain
  // reachability (MXNet's bounded search can miss a path; a cycle it finds
  // is one reachability finds). Duplicates are left in.
  std::vector<int> cycle_breakers(const std::vector<int>& group, int id) {
    std::vector<int> breakers;
    std::vector<std::pair<int, Touch>> readers, read;  // readers: of the group only
    for (const auto& [v, t] : around(group)) {
      if (t.read_by >= 0 && t.reads >= 0) breakers.push_back(std::max(t.read_by, t.reads));
      if (t.read_by >= 0) read.push_back({v, t});
      else if (t.reads >= 0) readers.push_back({v, t});
    }
    if (readers.empty() || read.empty() || readers.front().first > read.back().first)
      return breakers;
    std::vector<int> reached =
        walk(firsts(readers), out_, readers.front().first, read.back().first, id);
    std::sort(reached.begin(), reached.end());  // by index: each after what it reads
    for (int v : reached) best_[v] = -1;
    for (const auto& [r, t] : readers) best_[r] = t.reads;
    for (int v : reached)  // best_: the largest group node read by a reader reaching v
      for (int p : in_[v])
        if (reached_[p] == walk_) best_[v] = std::max(best_[v], best_[p]);
    for (const auto& [j, t] : read)
      if (reached_[j] == walk_ && best_[j] >= 0) breakers.push_back(std::max(t.read_by, best_[j]));
    return breakers;
  }

  // The unlabelled nodes around the group by index, as MXNet sorts them.
  std::vector<std::pair<int, Touch>> around(const std::vector<int>& group) {
    std::vector<int> order;
    ++stamp_;
    auto touch = [&](int v) -> Touch& {
      if (seen_[v] != stamp_) {
        seen_[v] = stamp_;
        touch_[v] = Touch();
        order.push_back(v);
      }
      return touch_[v];
    };
    for (int u : group) {
      for (int p : in_[u])
        if (label_[p] == -1) touch(p).read_by = std::max(touch(p).read_by, u);
      for (int c : out_[u])
        if (label_[c] == -1) touch(c).reads = std::max(touch(c).reads, u);
    }
    std::sort(order.begin(), order.end());
    std::vector<std::pair<int, Touch>> nodes;
    for (int v : order) nodes.push_back({v, touch_[v]});
    return nodes;
  }

  // The largest `read_by` above `floor` of a node in `read` that a node of
  // `readers` reaches outside the group, by MXNet's search; else -1.
  int largest_read_joined(const std::vector<std::pair<int, Touch>>& readers,
                          std::vector<std::pair<int, Touch>> read, int floor, int id) {
    walk(firsts(readers), out_, readers.front().first, read.back().first, id);
    std::sort(read.begin(), read.end(), [](const auto& a, const auto& b) {
      return a.second.read_by > b.second.read_by;
    });
    for (const auto& [j, t] : read) {
      if (t.read_by <= floor) break;
      if (reached_[j] == walk_ && searched_finds(j, readers, id)) return t.read_by;
    }
    return -1;
  }

  // The largest `reads` above `floor` of a node in `readers` that reaches a
  // later node of `read` outside the group, by MXNet's search; else -1.
  int largest_reader_joined(const std::vector<std::pair<int, Touch>>& readers,
                            const std::vector<std::pair<int, Touch>>& read, int floor, int id) {
    int first = readers.front().first, last = read.back().first;
    walk(firsts(read), in_, first, last, id);
    std::vector<std::pair<int, Touch>> joined;  // the readers reaching one
    for (const auto& r : readers)
      if (reached_[r.first] == walk_ && r.second.reads > floor) joined.push_back(r);
    std::sort(joined.begin(), joined.end(), [](const auto& a, const auto& b) {
      return a.second.reads > b.second.reads;
    });
    for (const auto& r : joined) {
      walk({r.first}, out_, first, last, id);
      std::vector<int> reached;
      for (const auto& j : read)
        if (reached_[j.first] == walk_) reached.push_back(j.first);
      for (int j : reached)
        if (searched_finds(j, {r}, id)) return r.second.reads;
    }
    return -1;
  }

  static std::vector<int> firsts(const std::vector<std::pair<int, Touch>>& nodes) {
    std::vector<int> out;
    for (const auto& n : nodes) out.push_back(n.first);
    return out;
  }

  // Marks (reached_ == walk_) the nodes `sources` reach through `next`
  // outside group `id`, of indices first to last; returns them.
  std::vector<int> walk(const std::vector<int>& sources,
                        const std::vector<std::vector<int>>& next, int first, int last, int id) {
    ++walk_;
    std::vector<int> stack, reached;
    for (int s : sources) {
      reached_[s] = walk_;
      stack.push_back(s);
    }
    while (!stack.empty()) {
      int top = stack.back();
      stack.pop_back();
      reached.push_back(top);
      for (int v : next[top])
        if (v >= first && v <= last && label_[v] != id && reached_[v] != walk_) {
          reached_[v] = walk_;
          stack.push_back(v);
        }
    }
    return reached;
  }

  // Whether MXNet's search from `descendant` finds one of `ancestors`: its
  // depth-first walk up through nodes outside group `id` keeps no record of
  // visits and stops after as many steps as the graph has nodes.
  bool searched_finds(int descendant, const std::vector<std::pair<int, Touch>>& ancestors,
                      int id) {
    ++stamp_;
    for (const auto& a : ancestors) seen_[a.first] = stamp_;
    std::vector<int> stack{descendant};
    for (size_t count = 0; !stack.empty() && count < label_.size(); ++count) {
      int top = stack.back();
      stack.pop_back();
      if (top != descendant && seen_[top] == stamp_) return true;
      for (int p : in_[top])
        if (label_[p] != id) stack.push_back(p);
    }
    return false;
  }

  // MXNet's rules look for a cycle through the nodes left outside a group,
  // not through the groups formed before it, so two groups can each read
  // the other, a graph no one can run (MXNet's partitioner makes it too).
  // Until no group is on such a cycle, the last one formed that is runs its
  // nodes each alone.
  void untangle(std::vector<std::vector<int>>* groups) {
    for (int tangled; (tangled = group_on_cycle(*groups)) >= 0;) {
      std::vector<int> nodes = std::move((*groups)[tangled]);
      groups->erase(groups->begin() + tangled);
      for (int u : nodes) groups->push_back({u});
      std::sort(groups->begin(), groups->end());  // by their first node, as formed
    }
  }

  // The last group of more than one node that peeling the graph, each group
  // taken as one node, from its sources and then its sinks leaves (what is
  // left lies on a cycle or between two), or -1.
  int group_on_cycle(const std::vector<std::vector<int>>& groups) {
    const int n = static_cast<int>(label_.size());
    std::vector<int> unit(n);  // the node, or n + its group's index
    for (int i = 0; i < n; ++i) unit[i] = i;
    for (size_t k = 0; k < groups.size(); ++k)
      for (int u : groups[k]) unit[u] = n + static_cast<int>(k);
    std::vector<std::vector<int>> next(n + groups.size()), prev(n + groups.size());
    for (int i = 0; i < n; ++i)
      for (int p : in_[i])
        if (unit[p] != unit[i]) {
          next[unit[p]].push_back(unit[i]);
          prev[unit[i]].push_back(unit[p]);
        }
    std::vector<bool> left(next.size(), true);
    peel(next, prev, &left);
    peel(prev, next, &left);
    for (int k = static_cast<int>(groups.size()) - 1; k >= 0; --k)
      if (left[n + k] && groups[k].size() > 1) return k;
    return -1;
  }

  // Takes out of `left` each vertex none left is before (along `prev`),
  // in turn, as a topological walk along `next` does.
  static void peel(const std::vector<std::vector<int>>& next,
                   const std::vector<std::vector<int>>& prev, std::vector<bool>* left) {
    std::vector<int> before(next.size(), 0), ready;
    for (size_t v = 0; v < next.size(); ++v) {
      if (!(*left)[v]) continue;
      for (int p : prev[v]) before[v] += (*left)[p];
      if (before[v] == 0) ready.push_back(static_cast<int>(v));
    }
    while (!ready.empty()) {
      int v = ready.back();
      ready.pop_back();
      (*left)[v] = false;
      for (int w : next[v])
        if ((*left)[w] && --before[w] == 0) ready.push_back(w);
    }
  }

  const std::vector<bool>& chosen_;
  std::vector<int> label_;  // a node's group, -1 for none
  std::vector<int> excluded_;  // the group a node is excluded from, or -1
  int exclusions_ = 0;         // over the graph, so far
  std::vector<int> seen_;   // the stamp that last saw a node
  std::vector<Touch> touch_;  // where a node touches the group, when seen_
  int stamp_ = 0;
  std::vector<int> reached_;  // the walk that last reached a node
  int walk_ = 0;
  std::vector<int> best_;  // cycle_breakers' largest group node read, when reached
  std::vector<std::vector<int>> in_;   // what each input reads
  std::vector<std::vector<int>> out_;  // the nodes reading each node
};

}  // namespace

std::vector<std::vector<int>> find_groups(const Graph* g, const std::vector<bool>& chosen) {
  return Grouping(g, chosen).find();
}

}  // namespace mxamp_onednn
