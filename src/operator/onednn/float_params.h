// The float parameters of every region packed (packs.h), written by the
// finishing pass (finish.h): a region reads a few inputs where it read one
// per weight, bias and statistic.
//
// A region input is packed when it is a model parameter (a variable MXNet
// gave the pass a float32 tensor for) that only this region reads, and that
// the region's nodes read only as parameters (Row::params), directly or
// through amp_casts. Its readers, casts included, then read its piece of
// the pack of its row shape (<region>_params_<row>): the plan reads
// parameters in float32 whatever their casts say.
#ifndef MXAMP_ONEDNN_FLOAT_PARAMS_H_
#define MXAMP_ONEDNN_FLOAT_PARAMS_H_

#include "common.h"

namespace mxamp_onednn {

void pack_float_params(Graph* g);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_FLOAT_PARAMS_H_
