// What the linear family's files share: linear.cc (Convolution and
// FullyConnected), encodings.cc (their INT8 types and encodings) and
// strides.cc (convolutions computing only the rows and columns their
// readers read).
#ifndef MXAMP_ONEDNN_LINEAR_H_
#define MXAMP_ONEDNN_LINEAR_H_

#include <map>
#include <utility>
#include <vector>

#include "common.h"
#include "fusion.h"
#include "plan.h"

namespace mxamp_onednn {

// Convolution's attributes with MXNet's defaults.
struct Conv {
  Dims kernel, stride, pad, dilate;
  int64_t groups;
  bool nchw;
};

Conv conv_attributes(const Node* n);

// What follows the operator and fuses into it.
struct Fusion {
  std::vector<const Node*> nodes;  // fused, casts between them included
  Entry last;                      // the value the fused chain produces
  const Node* batchnorm = nullptr;  // folded into the weights
  int sum_with = -1;               // the residual add's other operand
  Entry sum_entry;
  bool has_act = false;
  Eltwise act;
};

// Follows single readers from n: a BatchNorm (convolutions; linear.cc
// folds it), an add whose other operand exists already, an activation.
// Plans nothing: output_stride asks it of readers not planned yet.
Fusion fuse(Plan* r, const Node* n, int variant);

// ---- INT8 types and encodings (encodings.cc)
// The data types and INT8 encodings of a linear layer's source, output
// and residual operand.
struct Types {
  bool q = false, q_out = false;
  memory::data_type src, dst, sum;
  Encoding src_enc, out, sum_enc;
};

// Linear layer n's, fused as f: INT8 where its input is INT8 already or
// calibrated; float outside INT8 (the region's rest type where n is kept).
Types types(Plan* r, const Node* n, const Fusion& f);

// The INT8 type and encoding a layer reads value v in: v's own where it
// is INT8, else those of its calibrated range `in` (zero point 0).
std::pair<memory::data_type, Encoding> int8_source(Plan* r, int v, const Range& in);

// The type and encoding (t->dst, t->out) of an output requantized in
// range `out`, written by the operator fused as f (an activation as a
// table, eltwise.cc, passes itself as f's activation).
void output_encoding(Plan* r, const Fusion& f, const Range& out, Types* t);

// Whether signed INT8 entry e that another family writes (a batch_dot's
// context) is better u8 with zero point 128: with VNNI, where every reader
// is a linear layer reading it as its data, which compensates the zero
// point (a VNNI inner product reads u8 10-21% faster than s8).
bool linear_readers_take_zero_point(Plan* r, Entry e);

// ---- subsampled outputs (strides.cc)
// Where the only readers of a convolution's output are 1x1 convolutions
// without padding that stride by k (ResNet's last block of a stage, read by
// the next stage's first block), they read every k-th row and column of it
// only: the convolution computes just those (its stride times k, a quarter
// of its work at k = 2), its residual operand is subsampled alike, and its
// readers stride by k less. INT8 regions alike (the same encodings).
// `known` memoizes per planning question: paths through 1x1 convolutions
// can be many.
using Strides = std::map<const Node*, int64_t>;

// How many times sparser than its own stride convolution n, fused as f,
// computes its output.
int64_t output_stride(Plan* r, const Node* n, const Fusion& f, Strides* known);

// Convolution n's attributes as planned: its stride times q (its output
// subsampled by q) over k (its input subsampled by k).
Conv planned(const Node* n, int64_t k, int64_t q);

// Every q-th row and column of `from` (encoded as from_enc) into `to` (of
// the same dims but the spatial ones, encoded as to_enc).
void subsample(Plan* r, Arg from, Arg to, int64_t q, Encoding from_enc, Encoding to_enc);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_LINEAR_H_
