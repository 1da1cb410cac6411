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

// The parameters the last finish on this thread stores in float32, one
// index of the graph before partitioning a line.
const std::string& last_widened();

// How many INT8 layers' biases the last finish on this thread corrected.
int last_corrected();

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_FINISH_H_
