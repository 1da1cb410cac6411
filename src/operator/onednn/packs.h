// A region's parameters packed: each kind one new variable (in the outer
// graph and the region's subgraph) whose rows are its pieces, each piece cut
// by a _split_v2 along axis 0, so that the region reads a few inputs where it
// read one per parameter (MXNet and Gluon spend time on each input on every
// call). s8 weights (s8_weights.h) are dequantized before the cut; float
// parameters (float_params.h) are cut as they are. The plan reads a piece
// where it lies (Plan::param_of).
#ifndef MXAMP_ONEDNN_PACKS_H_
#define MXAMP_ONEDNN_PACKS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../graph_edit.h"
#include "common.h"

namespace mxamp_onednn {

using mxamp_graph::Additions;

// A region's inner variable -> the entry its region input reads.
using Sources = std::map<const Node*, NodeEntry>;
Sources sources_of(Node* region);

// g's nodes that its outputs reach, in MXNet's order (graph_edit.h).
std::vector<Node*> mxnet_order(const Graph* g);

// Names for new nodes of graph g, made unique against its own.
Additions additions_to(Graph* g);

class Packs {
 public:
  Packs(Graph* g, Node* region, Additions* outer, Sources* sources);

  // The entry of the next piece (`shape`, `data` of `dtype`) of the variable
  // <region><suffix>; with `scales` (shaped (channels, 1, ...)), s8 weights
  // and the entry their piece dequantized.
  NodeEntry piece(const std::string& suffix, const Dims& shape, const void* data, MXDType dtype,
                  const std::vector<float>* scales = nullptr);

  // Gives each pack of s8 weights its scales, declares the variables, gives
  // each split its cuts, allocates and fills the parameters, and makes the
  // region read its subgraph's inputs in MXNet's order.
  void write();

  bool empty() const { return packs_.empty(); }

 private:
  struct Pack {
    Node *outer, *inner, *split, *mul;
    MXDType dtype;
    Dims shape;             // the pack's: rows so far, then a row's
    Dims starts;            // the pieces' first rows
    std::vector<char> bytes;
    std::vector<float> scales;  // s8 weights': their layers' scales
  };

  Pack* open(const std::string& suffix, bool dequantized);
  void fill(Pack* p);
  void reorder_inputs();

  Graph *g_, *sub_;
  Node* region_;
  Additions* outer_;
  Additions inner_;
  Sources* sources_;
  std::vector<std::pair<std::string, Pack>> packs_;  // in the order they were opened
};

// "32x3x3": the shape of a row (along axis 0) of a tensor of `shape`.
std::string row_text(const Dims& shape);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_PACKS_H_
