// A region's parameters (weights, biases, statistics): read from its
// inputs, or from pieces of them, and packed into a primitive's layout.
#include <string>

#include "engine.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {

const MXTensor& Plan::param_tensor(const NodeEntry& e) {
  int i = vals_[value_of({e.node, e.entry})].input;
  if (i < 0) throw std::runtime_error("parameter " + e.node->name + " is computed inside the region");
  return ins_->at(i);
}

namespace {

// The rows of p that the _split_v2 output `piece` cuts (along axis 0), at
// its split's `indices` `at`.
Param cut(Param p, const NodeEntry& piece, const Dims& at) {
  const Node* split = piece.node;
  size_t k = static_cast<size_t>(piece.entry);
  int64_t rows = p.shape.empty() ? 0 : p.shape[0];
  int64_t end = k + 1 < at.size() ? at[k + 1] : rows;
  if (rows <= 0 || number(split, "axis", 1) != 0 || flag(split, "squeeze_axis", false) ||
      k >= at.size() || at[k] < 0 || at[k] > end || end > rows)
    throw std::runtime_error("parameter " + split->name +
                             " must cut its input along axis 0 by in-range `indices`, without"
                             " squeeze_axis (got axis=" + text(split, "axis", "1") +
                             ", indices=" + text(split, "indices", "none") + ")");
  size_t row = static_cast<size_t>(p.size() / rows) * (p.dtype == kInt8 ? 1 : sizeof(float));
  p.data = static_cast<const char*>(p.data) + at[k] * row;
  p.shape[0] = end - at[k];
  return p;
}

}  // namespace

// A parameter is a region input, or rows of one (along axis 0) that
// _split_v2s cut: mxamp's quantization packs a region's s8 weights of one
// row shape, its weight scales of one rank (cut into the row shapes' packs)
// and its folded biases so (fewer inputs and nodes: MXNet spends time on
// each on every call).
Param Plan::param_of(const NodeEntry& e, const NodeEntry* piece) {
  if (casts_param(e.node)) return param_of(e.node->inputs[0], piece);
  Param p;
  if (cuts_pack(e.node)) {
    p = cut(param_of(e.node->inputs[0]), e, cut_indices(e.node));
  } else {
    const MXTensor& t = param_tensor(e);
    params_.insert(static_cast<int>(&t - ins_->data()));
    p = {t.data_ptr, t.shape, t.dtype};
  }
  return piece ? cut(p, *piece, cut_indices(piece->node)) : p;
}

const Dims& Plan::cut_indices(const Node* split) {
  auto it = cut_indices_.find(split);
  if (it == cut_indices_.end()) it = cut_indices_.emplace(split, ints(split, "indices")).first;
  return it->second;
}

const float* Plan::param(const NodeEntry& e, size_t expect, const NodeEntry* piece) {
  Param p = param_of(e, piece);
  // A packed piece is named by its _split_v2 and its output.
  const NodeEntry& named = piece ? *piece : e;
  std::string name = named.node->name;
  if (!named.node->inputs.empty()) name += "[" + std::to_string(named.entry) + "]";
  if (p.dtype != kFloat32)
    throw std::runtime_error("parameter " + name + " is not float32; expected " +
                             std::to_string(expect) + " float32 elements");
  if (static_cast<size_t>(p.size()) != expect)
    throw std::runtime_error("parameter " + name + " has " + std::to_string(p.size()) +
                             " elements, expected " + std::to_string(expect) + " float32");
  return static_cast<const float*>(p.data);
}

memory Plan::pack(const float* data, const Dims& dims, const memory::desc& md,
                    const std::vector<float>& scale, int mask) {
  memory src(plain(dims, kF32), cpu_engine(), const_cast<float*>(data));
  memory dst(md, cpu_engine());
  dnnl::primitive_attr attr;
  std::unordered_map<int, memory> args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  if (!scale.empty()) {
    attr.set_scales_mask(DNNL_ARG_DST, mask);
    args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST] = scales(scale);
  }
  dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), src.get_desc(), cpu_engine(), md, attr))
      .execute(stream_, args);
  stream_.wait();
  return dst;
}

}  // namespace mxamp_onednn
