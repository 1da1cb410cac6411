// What one operator family needs of another to fuse: an activation as an
// eltwise post-op (eltwise.cc), BatchNorm folded into weights
// (normalisation.cc), a transpose into the matmul writing its input
// (views.cc).
#ifndef MXAMP_ONEDNN_FUSION_H_
#define MXAMP_ONEDNN_FUSION_H_

#include <vector>

#include "common.h"

namespace mxamp_onednn {

class Plan;

struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
};

// The oneDNN eltwise for an activation node, if it is one the backend runs.
bool eltwise_of(const Node* n, Eltwise* e);

// Whether activation n runs as a table of its 256 answers on INT8
// (eltwise.cc, lookup.h) rather than as a post-op or a primitive.
bool table_activation(Plan* r, const Node* n);

// The activation n as a post-op of the operator before it: one the backend
// runs (eltwise_of), not as a table, and in an exact plan (Plan::exact)
// not one that loses special values.
bool post_op_of(Plan* r, const Node* n, Eltwise* e);

// Whether writing INT8 of type dt at `scale` (the real value of one step)
// and `zero_point` already clamps as e does: relu or clip whose bounds lie beyond what the
// type holds, so that saturation gives the same integers and the post-op
// can go (each costs 3-13% of a memory-bound INT8 convolution).
bool saturation_clamps(const Eltwise& e, memory::data_type dt, float scale, int zero_point);

// w' = w * gamma / sqrt(var + eps); b' = (b - mean) * gamma / sqrt(var + eps) + beta
void fold_batchnorm(Plan* r, const Node* bn, std::vector<float>* w, std::vector<float>* b);

// The layout to write batch_dot's output e (of shape d, type dt) in: where
// its only reader is a transpose, through a Reshape that only splits the
// batch axis, the order of the transpose's output (which is then dense
// where the matmul wrote it), with the batch axes that Reshape makes; else
// plain.
memory::desc layout_for_views(const Plan& r, Entry e, const Dims& d, memory::data_type dt);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_FUSION_H_
