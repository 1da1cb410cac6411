// Forming the regions in a graph pass, in time linear in the graph's size
// where groups form no cycles through the nodes left outside, and not far
// from it where they do (groups.cc; MXNet 1.9.1's partitioner copies a map
// of every node for each node it starts a subgraph from, which is
// quadratic, and its search for cycles can take the cube). The result is
// the graph MXNet's partitioner makes with the selector and review of
// partitioner.cc wherever that graph can run and the search excludes no
// more than 256 nodes over the graph: the same groups of nodes, region
// nodes, names and attributes, so the finishing pass (finish.h) that
// follows sees what it saw after MXNet.
#ifndef MXAMP_ONEDNN_REGIONS_H_
#define MXAMP_ONEDNN_REGIONS_H_

#include <vector>

#include "common.h"

namespace mxamp_onednn {

// The groups of nodes that become regions, as MXNet 1.9.1's build_subgraph
// finds them: from each chosen node (`chosen`, by the graph's JSON order) in
// order not yet grouped, every chosen node reachable through chosen nodes;
// where the group and the nodes left outside would form a cycle, the node
// MXNet picks is excluded and the search repeats (past the graph's first
// 256 exclusions, every node MXNet's search weighs, at once). Then, where
// groups would read each other (MXNet's partitioner makes such), the last
// formed on such a cycle is split into its nodes, until none is. Each group
// sorted.
std::vector<std::vector<int>> find_groups(const Graph* g, const std::vector<bool>& chosen);

// Replaces g's groups of chosen nodes by region nodes (regions.cc) with the
// partitioner's options: "compute", "rest_dtype", "bf16_nodes",
// "other_types" (partitioner.h), and "output_names", one "<index> <op>
// <name>..." line per operator whose outputs MXNet names otherwise than
// "output" (one output) or "output<k>"; "entry_types" (finish.h) gives each
// node's number of outputs.
void form_regions(Graph* g, const Attrs& options);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_REGIONS_H_
