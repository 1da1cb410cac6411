// Packing the regions' float parameters (float_params.h).
#include "float_params.h"

#include <set>
#include <string>
#include <vector>

#include "packs.h"
#include "partitioner.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

constexpr char kParamsSuffix[] = "_params";

// Whether the region's nodes read v only as a parameter, directly or
// through amp_casts, and neither v nor a cast of it is a subgraph output.
bool read_as_param(const Node* v, const std::set<const Node*>& heads) {
  if (heads.count(v)) return false;
  for (const NodeEntry& r : v->outputs) {
    const Row* row = row_of(r.node);
    if (!row) return false;
    if (is(r.node, kCasts, kCast) ? !read_as_param(r.node, heads) : !row->is_param(r.entry))
      return false;
  }
  return true;
}

// The tensor of the model parameter `source` (a region input) stands for:
// a float32 one of rank 1 or more that MXNet gave the pass (Python hands it
// bfloat16 ones widened) and only `region` reads; nullptr otherwise.
const MXTensor* packable(const Node* region, const NodeEntry& source) {
  const Node* outer = source.node;
  if (!is_variable(outer) || !outer->tensor || outer->tensor->dtype != kFloat32 ||
      outer->tensor->shape.empty() || outer->tensor->shape[0] <= 0)
    return nullptr;
  for (const NodeEntry& r : outer->outputs)
    if (r.node != region) return nullptr;
  return outer->tensor;
}

void pack_region(Graph* g, Node* r, Additions* outer) {
  Graph* sub = r->subgraphs.at(0);
  Sources sources = sources_of(r);
  std::set<const Node*> heads;
  for (const NodeEntry& h : sub->outputs) heads.insert(h.node);
  Packs packs(g, r, outer, &sources);
  const std::vector<Node*> inputs = sub->inputs;  // the packs add to them
  for (Node* v : inputs) {
    const MXTensor* t = packable(r, sources.at(v));
    if (!t || v->outputs.empty() || !read_as_param(v, heads)) continue;
    const Dims shape(t->shape.begin(), t->shape.end());
    const std::string row = row_text(shape);
    NodeEntry piece = packs.piece(kParamsSuffix + (row.empty() ? "" : "_" + row), shape,
                                  t->data_ptr, kFloat32);
    // Its readers, casts included (MXNet's type inference of the region
    // reads the types they give), read the piece.
    const std::vector<NodeEntry> direct = v->outputs;
    for (const NodeEntry& reader : direct) mxamp_graph::rewire(reader.node, reader.entry, piece);
  }
  if (!packs.empty()) packs.write();
}

}  // namespace

void pack_float_params(Graph* g) {
  Additions outer = additions_to(g);
  for (Node* n : mxnet_order(g))
    if (n->op == kRegionOp) pack_region(g, n, &outer);
}

}  // namespace mxamp_onednn
