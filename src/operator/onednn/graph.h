// Walking a lib_api graph: who reads each value, and what a value is a cast
// of.
#ifndef MXAMP_ONEDNN_GRAPH_H_
#define MXAMP_ONEDNN_GRAPH_H_

#include <map>
#include <vector>

#include "attrs.h"
#include "common.h"

namespace mxamp_onednn {

// Who reads each output of each node of a graph (graph outputs count as a
// reader without a node).
class Readers {
 public:
  explicit Readers(const Graph* g);
  const std::vector<const Node*>& of(Entry e) const;
  // The single node reading `e`, looking through casts; nullptr if the value
  // is read more than once or is a graph output. `passed` gets the casts.
  const Node* sole(Entry e, std::vector<const Node*>* passed = nullptr) const;

 private:
  std::map<Entry, std::vector<const Node*>> readers_;
};

// The entry `e` is a cast of (or `e` itself).
Entry source(Entry e);

// The node producing `e`, looking through casts.
inline const Node* producer(Entry e) { return source(e).first; }

// The calibrated range of `e` given on the node producing it: an operator's
// output 0 or a variable.
Range source_range(Entry e);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_GRAPH_H_
