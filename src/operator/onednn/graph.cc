// Walking a lib_api graph.
#include "graph.h"

#include "table.h"

namespace mxamp_onednn {

Readers::Readers(const Graph* g) {
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    for (const NodeEntry& in : n->inputs) readers_[{in.node, in.entry}].push_back(n);
  }
  for (const NodeEntry& out : g->outputs) readers_[{out.node, out.entry}].push_back(nullptr);
}

const std::vector<const Node*>& Readers::of(Entry e) const {
  static const std::vector<const Node*> none;
  auto it = readers_.find(e);
  return it == readers_.end() ? none : it->second;
}

const Node* Readers::sole(Entry e, std::vector<const Node*>* passed) const {
  for (;;) {
    const auto& r = of(e);
    if (r.size() != 1 || r[0] == nullptr) return nullptr;
    if (!is(r[0], kCasts, kCast)) return r[0];
    if (passed) passed->push_back(r[0]);
    e = {r[0], 0};
  }
}

Entry source(Entry e) {
  while (is(e.first, kCasts)) e = passed_from(e);
  return e;
}

Range source_range(Entry e) {
  Entry s = source(e);
  return s.second == 0 ? range_attr(s.first) : Range();
}

}  // namespace mxamp_onednn
