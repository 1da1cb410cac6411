// What one operator family needs of another to fuse: an activation as an
// eltwise post-op (eltwise.cc), BatchNorm folded into weights
// (normalisation.cc).
#ifndef MXAMP_ONEDNN_FUSION_H_
#define MXAMP_ONEDNN_FUSION_H_

#include <vector>

#include "common.h"

namespace mxamp_onednn {

class Region;

struct Eltwise {
  dnnl::algorithm alg;
  float alpha = 0.f, beta = 0.f;
};

// The oneDNN eltwise for an activation node, if it is one the backend runs.
bool eltwise_of(const Node* n, Eltwise* e);

// w' = w * gamma / sqrt(var + eps); b' = (b - mean) * gamma / sqrt(var + eps) + beta
void fold_batchnorm(Region* r, const Node* bn, std::vector<float>* w, std::vector<float>* b);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_FUSION_H_
