// A region's parameters packed (packs.h).
#include "packs.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "attrs.h"
#include "table.h"

namespace mxamp_onednn {

using mxamp_graph::connect;
using mxamp_graph::disconnect;

namespace {
const char kScalesSuffix[] = "_weight_scales";  // s8 weights' scales, a pack per rank
}  // namespace

Sources sources_of(Node* region) {
  Sources sources;
  const Graph* sub = region->subgraphs.at(0);
  for (size_t k = 0; k < sub->inputs.size(); ++k) sources[sub->inputs[k]] = region->inputs.at(k);
  return sources;
}

std::vector<Node*> mxnet_order(const Graph* g) {
  std::vector<Node*> heads;
  for (const NodeEntry& out : g->outputs) heads.push_back(out.node);
  return mxamp_graph::mxnet_order(heads, [](Node* n, size_t k) { return n->inputs[k].node; });
}

// The pass adds no amp_cast here.
Additions additions_to(Graph* g) { return Additions(g, op_of(kCasts, kCast)); }

std::string row_text(const Dims& shape) {
  std::string out;
  for (size_t i = 1; i < shape.size(); ++i) out += (i > 1 ? "x" : "") + std::to_string(shape[i]);
  return out;
}

Packs::Packs(Graph* g, Node* region, Additions* outer, Sources* sources)
    : g_(g), sub_(region->subgraphs.at(0)), region_(region), outer_(outer),
      inner_(additions_to(sub_)), sources_(sources) {}

// A new variable <region><suffix>, in the outer graph and the subgraph, read
// by a new split (through the dequantization for s8 weights).
Packs::Pack* Packs::open(const std::string& suffix, bool dequantized) {
  const std::string name = outer_->unique(region_->name + suffix);
  Pack p{g_->addNode(name, "null"), sub_->addNode(inner_.unique(name), "null")};
  g_->inputs.push_back(p.outer);
  (*sources_)[p.inner] = {p.outer, 0};
  NodeEntry cut{p.inner, 0};
  if (dequantized) {
    Node* cast = sub_->addNode(inner_.unique(name + "_float"), kWeightCastOp);
    cast->attrs["dtype"] = "float32";
    connect(cut, cast, 0);
    p.mul = sub_->addNode(inner_.unique(name + "_dequantized"), kScaleMulOp);
    connect({cast, 0}, p.mul, 0);  // and the scales, input 1: write()
    cut = {p.mul, 0};
  }
  p.split = sub_->addNode(inner_.unique(name + "_split"), kPackCutOp);
  p.split->attrs["axis"] = "0";
  connect(cut, p.split, 0);
  packs_.push_back({suffix, p});
  return &packs_.back().second;
}

NodeEntry Packs::piece(const std::string& suffix, const Dims& shape, const void* data,
                       MXDType dtype, const std::vector<float>* scales) {
  auto it = std::find_if(packs_.begin(), packs_.end(),
                         [&](const std::pair<std::string, Pack>& p) { return p.first == suffix; });
  Pack* p = it == packs_.end() ? open(suffix, scales != nullptr) : &it->second;
  if (p->starts.empty()) {
    p->dtype = dtype;
    p->shape = shape;
    p->shape[0] = 0;
  }
  p->starts.push_back(p->shape[0]);
  p->shape[0] += shape[0];
  const size_t size = count(shape) * (dtype == kInt8 ? 1 : sizeof(float));
  p->bytes.insert(p->bytes.end(), static_cast<const char*>(data),
                  static_cast<const char*>(data) + size);
  if (scales) p->scales.insert(p->scales.end(), scales->begin(), scales->end());
  return {p->split, static_cast<int>(p->starts.size() - 1)};
}

void Packs::write() {
  const size_t weights = packs_.size();  // the scales' packs come after
  for (size_t i = 0; i < weights; ++i) {
    Pack& p = packs_[i].second;
    if (!p.mul) continue;
    Dims shape(p.shape.size(), 1);
    shape[0] = static_cast<int64_t>(p.scales.size());
    const std::vector<float> scales = std::move(p.scales);
    Node* mul = p.mul;  // `p` may move as a pack opens
    NodeEntry e = piece(std::string(kScalesSuffix) + "_" + std::to_string(shape.size()) + "d",
                        shape, scales.data(), kFloat32);
    connect(e, mul, 1);
  }
  for (auto& kv : packs_) fill(&kv.second);
  reorder_inputs();
}

void Packs::fill(Pack* p) {
  for (Node* v : {p->outer, p->inner}) {
    v->attrs["__dtype__"] = std::to_string(p->dtype);
    v->attrs["__shape__"] = tuple_text(p->shape);
  }
  p->split->attrs["indices"] = tuple_text(p->starts);
  p->outer->alloc_arg(p->shape, MXContext::CPU(), p->dtype);
  if (!p->bytes.empty()) std::memcpy(p->outer->tensor->data_ptr, p->bytes.data(), p->bytes.size());
}

// The region reads its subgraph's inputs in MXNet's order (which the new
// variables and the nodes left unread change), each with its range.
void Packs::reorder_inputs() {
  Node* r = region_;
  Graph* sub = sub_;
  const Sources& sources = *sources_;
  std::map<const Node*, std::string> ranges;
  std::istringstream in(text(r, "input_ranges"));
  std::string range;
  for (size_t k = 0; k < sub->inputs.size() && std::getline(in, range, ';'); ++k)
    ranges[sub->inputs[k]] = range;
  for (size_t k = 0; k < r->inputs.size(); ++k) disconnect(r, k);
  r->inputs.clear();
  sub->inputs.clear();
  std::string joined;
  for (Node* n : mxnet_order(sub)) {
    if (!is_variable(n)) continue;
    joined += (sub->inputs.empty() ? "" : ";") + ranges[n];
    connect(sources.at(n), r, r->inputs.size());
    sub->inputs.push_back(n);
  }
  if (r->attrs.count("input_ranges")) r->attrs["input_ranges"] = joined;
}

}  // namespace mxamp_onednn
