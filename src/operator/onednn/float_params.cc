// Packing the regions' float parameters (float_params.h).
#include "float_params.h"

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "packs.h"
#include "partitioner.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

constexpr char kParamsSuffix[] = "_params";
constexpr int kBFloat16Code = 12;  // MXNet's; lib_api's MXDType has no name for it

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

// The model parameter inner variable v of a region stands for: its tensor
// where MXNet gave one, in float32 or bfloat16, of rank 1 or more, and only
// `region` reads its variable; nullptr otherwise.
const MXTensor* packable(const Node* region, const NodeEntry& source) {
  const Node* outer = source.node;
  if (!is_variable(outer) || !outer->tensor || outer->tensor->shape.empty() ||
      outer->tensor->shape[0] <= 0)
    return nullptr;
  const int dtype = static_cast<int>(outer->tensor->dtype);
  if (dtype != kFloat32 && dtype != kBFloat16Code) return nullptr;
  for (const NodeEntry& r : outer->outputs)
    if (r.node != region) return nullptr;
  return outer->tensor;
}

// t's values in float32 (bfloat16's are float32's upper halves).
std::vector<float> as_float(const MXTensor& t) {
  const int64_t n = t.size();
  std::vector<float> out(n);
  if (static_cast<int>(t.dtype) == kFloat32) {
    std::memcpy(out.data(), t.data_ptr, n * sizeof(float));
    return out;
  }
  const uint16_t* bits = static_cast<const uint16_t*>(t.data_ptr);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &word, sizeof(float));
  }
  return out;
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
    const std::vector<float> values = as_float(*t);
    NodeEntry piece = packs.piece(kParamsSuffix + (row.empty() ? "" : "_" + row), shape,
                                  values.data(), kFloat32);
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
