// The selector and the review: which nodes go into regions, and what each
// region node records. The pass forms the regions with them (regions.h);
// they are registered as MXNet's partitioner "mxamp_onednn" too.
#ifndef MXAMP_ONEDNN_PARTITIONER_H_
#define MXAMP_ONEDNN_PARTITIONER_H_

#include <string>
#include <vector>

#include "common.h"

namespace mxamp_onednn {

// The operator of the nodes the partitioner makes, one per region.
constexpr const char* kRegionOp = "_mxamp_onednn_region";

// The nodes regions may hold, by index (the graph's JSON order); this
// thread's report starts anew.
std::vector<bool> chosen_nodes(const Graph* g, const Attrs& options);

// Whether the region of subgraph g is kept, with what its node records.
bool review(const Graph* g, const Attrs& options, Attrs* node_attrs);

MXReturnValue create_selector(const Graph* g, CustomOpSelector** sel, const Attrs& options);
MXReturnValue review_subgraph(const Graph* g, int, bool* accept, const Attrs& options,
                              Attrs* node_attrs);

// What the last partitioning on this thread tells mxamp.backends.onednn:
// the nodes left on MXNet because oneDNN cannot run them here, one
// "index\treason" line each (the index in the graph's JSON node list: names
// may hold any character), and its error (MXNet drops a partitioner's own
// message).
struct Report {
  std::string fallbacks, error;
};
const Report& last_report();

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_PARTITIONER_H_
