// The pass "mxamp_onednn_finish": the regions formed (regions.h) when the
// options give the partitioner's ("compute" among them), and the
// partitioned graph made final.
#ifndef MXAMP_ONEDNN_FINISH_H_
#define MXAMP_ONEDNN_FINISH_H_

#include <string>

#include "common.h"

namespace mxamp_onednn {

// Region nodes read and write float32 only (lib_api 1.9.1 has no bfloat16
// tensor): where the graph before partitioning held bfloat16 on a region
// edge, casts go outside and inside the region, and bfloat16 parameters read
// only by regions are stored in float32 instead. Casts left on MXNet that
// copy their input are skipped. Options (from the graph before
// partitioning, its nodes by index): "entry_types", one "<index> <op>
// <code>..." line per node, the dtype code of each output (-1 unknown);
// "data_inputs", one "<index> null" line per variable that is no parameter.
// Then the INT8 regions' layers get s8 weights (s8_weights.h) from the
// parameters MXNet passes, corrected by option "data_means".
MXReturnValue finish(Graph* g, const Attrs& options);

// What the last finish on this thread made, nodes known by their index in
// the graph before partitioning (-1: a node it had not), a line each: what
// mxamp reports of a partitioning without reading the graph back.
struct Finished {
  // The parameters it stores in float32: "<index>".
  std::string widened;
  // How many INT8 layers' biases it corrected.
  int corrected = 0;
  // The INT8 layers it left reading float32 weights: "<index>\t<why>".
  std::string float32_weights;
  // The operators outside regions: "<index> <op>".
  std::string outside;
  // "<regions> <operators inside them>".
  std::string regions;
};
const Finished& last_finished();

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_FINISH_H_
