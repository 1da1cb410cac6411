// The partitioner: the selector chooses nodes (each planned alone, as a
// region would run it, to check oneDNN runs it here), the review accepts a
// region and records on its node what executing it needs.
#include "partitioner.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <unordered_map>

#include "engine.h"
#include "graph.h"
#include "region.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// What one partitioning learns and reports. MXNet runs a partitioning's
// selector and reviews on the calling thread, one after the other, so each
// thread has its own.
struct Partitioning {
  // The calibrated range of each tensor a node reads, by (node name, input
  // slot): MXNet gives a region's input variables none of the attributes of
  // the nodes they stand for.
  std::map<std::pair<std::string, int>, Range> read_ranges;
  Report report;
};
thread_local Partitioning current;

void report_error(const std::string& message) {
  current.report.error = message;
  MX_ERROR_MSG << message;
}

// A region's subgraph names its nodes as the graph does, so two nodes of
// one name that read different ranges at one input cannot be told apart.
void note_ranges(const Graph* g) {
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    for (size_t k = 0; k < n->inputs.size(); ++k) {
      Range r = source_range(input(n, k));
      if (!r.known()) continue;
      auto noted = current.read_ranges.emplace(std::make_pair(n->name, static_cast<int>(k)), r);
      if (noted.first->second.amax != r.amax || noted.first->second.min != r.min)
        throw std::invalid_argument("two nodes named '" + n->name + "' read tensors of other "
                                    "calibrated ranges at input " + std::to_string(k) +
                                    "; INT8 needs their names to differ");
    }
  }
}

// Plans node n alone, in data type dt, on its family's probe shapes: throws
// dnnl::error when oneDNN cannot create one of its primitives on this CPU.
// On one thread: a team started on the caller's thread would stay, and make
// libgomp put idle threads to sleep at once (docs/onednn.md,
// "Threads").
void check(const Node* n, memory::data_type dt) {
  const Row* row = row_of(n);
  if (!row->family->probe) return;  // no primitive of its own
  std::vector<Dims> shapes = row->family->probe(n, row->variant);
  if (shapes.empty()) return;
  shapes.resize(std::min(shapes.size(), n->inputs.size()));
  std::unique_ptr<Graph> g(new Graph());
  std::vector<std::vector<float>> data;
  std::vector<MXTensor> tensors;
  for (const Dims& shape : shapes) {
    g->inputs.push_back(g->addNode("in" + std::to_string(tensors.size()), "null"));
    size_t count = 1;
    for (int64_t x : shape) count *= x;
    data.emplace_back(count, 0.f);
    tensors.emplace_back(data.back().data(), shape, kFloat32, 0, MXContext::CPU());
  }
  Node* node = g->addNode(n->name, n->op);
  node->attrs = n->attrs;
  for (Node* in : g->inputs) node->inputs.push_back({in, 0});
  g->outputs.push_back({node, 0});
  Region region(g.release(), dt, {});
  Team one(1);
  region.plan(tensors);
}

// The nodes option `key` names (none when not given): one "<index> <op>"
// line each, the index in the graph's JSON node list, the op the node's
// there (which catches a numbering other than this graph's). Node names
// never travel: they may hold any character.
std::set<size_t> nodes(const Graph* g, const Attrs& options, const std::string& key) {
  std::set<size_t> out;
  auto it = options.find(key);
  if (it == options.end()) return out;
  std::istringstream lines(it->second);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    long long index = -1;
    std::string op;
    if (!(in >> index >> op) || index < 0 || static_cast<size_t>(index) >= g->size() ||
        g->getNode(index)->op != op)
      throw std::invalid_argument("option " + key + ": '" + line + "' is not '<index> <op>' of "
                                  "an operator node of this graph (" +
                                  std::to_string(g->size()) + " nodes)");
    out.insert(static_cast<size_t>(index));
  }
  return out;
}

class Selector : public CustomOpSelector {
 public:
  Selector(const Graph* g, const Attrs& options) : g_(g), ok_(g->size(), false) {
    memory::data_type compute = compute_type(options);
    // INT8 regions compute in their rest type (float32 or bfloat16) where not INT8.
    memory::data_type dt = float_type(options);
    if (compute == kS8) note_ranges(g);
    if (!cpu_supports(compute)) return;
    if (!cpu_supports(dt))
      throw std::invalid_argument("option rest_dtype bfloat16: the CPU (or ONEDNN_MAX_CPU_ISA) "
                                  "offers no AVX512-BF16/AMX");
    for (size_t i = 0; i < g->size(); ++i) index_[g->getNode(i)] = i;
    choose(options, dt);
    keep_params_outside();
    check_all(dt);
    join_fused_only();
  }
  bool Select(int id) override { return ok_[id]; }
  bool SelectInput(int, int in) override { return ok_[in]; }
  bool SelectOutput(int, int out) override { return ok_[out]; }

 private:
  // Supported nodes. With a converted model (option bf16_nodes given) only
  // those the conversion put in bfloat16 (plus casts and operators that are
  // float32 inside); a float32 model is offloaded whole. Nodes reading or
  // writing other types (other_types: float64, integers) stay out: regions
  // read and write float32.
  void choose(const Attrs& options, memory::data_type dt) {
    bool converted = options.count("bf16_nodes") > 0;
    std::set<size_t> bf16_nodes = nodes(g_, options, "bf16_nodes");
    std::set<size_t> other_types = nodes(g_, options, "other_types");
    for (size_t i = 0; i < g_->size(); ++i) {
      const Node* n = g_->getNode(i);
      const Row* row = row_of(n);
      if (!row || !row->computes_in(dt) || other_types.count(i) ||
          !row->family->supported(n, row->variant))
        continue;
      ok_[i] = !converted || is(n, kCasts) || bf16_nodes.count(i) || row->f32_inside;
    }
  }

  // Parameters (weights, bias, statistics) are packed from the region's
  // inputs, so what computes them stays outside.
  void keep_params_outside() {
    for (size_t i = 0; i < g_->size(); ++i) {
      const Node* n = g_->getNode(i);
      if (!ok_[i]) continue;
      for (int k : row_of(n)->params) {
        if (static_cast<size_t>(k) >= n->inputs.size()) continue;
        const Node* p = producer(input(n, k));
        if (!is_variable(p)) ok_[index_[p]] = false;
      }
    }
  }

  void check_all(memory::data_type dt) {
    std::ostringstream fallbacks;
    for (size_t i = 0; i < g_->size(); ++i) {
      const Node* n = g_->getNode(i);
      if (!ok_[i]) continue;
      try {
        check(n, dt);
      } catch (const dnnl::error& e) {
        ok_[i] = false;
        fallbacks << i << '\t' << e.what() << " in " << compute_name(dt) << '\n';
      }
    }
    current.report.fallbacks = fallbacks.str();
  }

  // An operator that runs only fused (BatchNorm) goes only with the one it
  // fuses into.
  void join_fused_only() {
    Readers readers(g_);
    for (size_t i = 0; i < g_->size(); ++i) {
      const Node* n = g_->getNode(i);
      if (ok_[i] && row_of(n)->fused_only)
        ok_[i] = row_of(n)->family->fuses(n, readers) && ok_[index_[producer(input(n, 0))]];
    }
  }

  const Graph* g_;
  std::vector<bool> ok_;
  std::map<const Node*, size_t> index_;
};

// A region is worth running when it computes something, and can run when
// each operator that runs only fused fuses in it.
bool review_region(const Graph* g) {
  Readers readers(g);
  bool any_compute = false;
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    if (is_variable(n)) continue;
    const Row* row = row_of(n);
    any_compute |= row->computes;
    if (row->fused_only && !row->family->fuses(n, readers)) return false;
  }
  return any_compute;
}

// The ranges of the region's inputs, in order, as "amax,min" (empty when
// not calibrated) separated by ';', each from the first node reading it
// whose range is known there.
std::string input_ranges(const Graph* g) {
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < g->inputs.size(); ++i) index[g->inputs[i]] = i;
  std::vector<const Range*> found(g->inputs.size(), nullptr);
  for (size_t j = 0; j < g->size(); ++j) {
    const Node* n = g->getNode(j);
    for (size_t k = 0; k < n->inputs.size(); ++k) {
      auto i = index.find(n->inputs[k].node);
      if (i == index.end() || found[i->second]) continue;
      auto r = current.read_ranges.find({n->name, static_cast<int>(k)});
      if (r != current.read_ranges.end()) found[i->second] = &r->second;
    }
  }
  std::ostringstream out;
  out.precision(17);
  for (size_t i = 0; i < found.size(); ++i) {
    if (i) out << ';';
    if (found[i]) out << found[i]->amax << ',' << found[i]->min;
  }
  return out.str();
}

}  // namespace

MXReturnValue create_selector(const Graph* g, CustomOpSelector** sel, const Attrs& options) {
  current = Partitioning();
  try {
    *sel = new Selector(g, options);
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    report_error(std::string("mxamp_onednn: selecting nodes failed: ") + e.what());
    return MX_FAIL;
  }
}

std::vector<bool> chosen_nodes(const Graph* g, const Attrs& options) {
  current = Partitioning();
  try {
    Selector selector(g, options);
    std::vector<bool> out(g->size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = selector.Select(static_cast<int>(i));
    return out;
  } catch (const std::exception& e) {
    current.report.error = std::string("mxamp_onednn: selecting nodes failed: ") + e.what();
    throw std::runtime_error(current.report.error);
  }
}

// The region node records its compute type, so a saved model keeps it, and
// for INT8 its inputs' ranges and the type of what is not INT8.
bool review(const Graph* g, const Attrs& options, Attrs* node_attrs) {
  try {
    memory::data_type compute = compute_type(options);
    (*node_attrs)["compute"] = compute_name(compute);
    if (compute == kS8) {
      (*node_attrs)["input_ranges"] = input_ranges(g);
      (*node_attrs)["rest_dtype"] = compute_name(float_type(options));
    }
    // apply_backend partitions without shape inference, so MXNet annotates
    // this region node with an empty shape per output ("[,]"); its
    // getShapeAt throws std::out_of_range on such a list for any output
    // index past 0, i.e. when a later region reads this region's second
    // output. One well-formed unknown shape per output avoids that.
    std::string shapes = "[";
    for (size_t i = 0; i < g->outputs.size(); ++i) shapes += i ? ",[None]" : "[None]";
    (*node_attrs)[MX_STR_SHAPE] = shapes + "]";
    return review_region(g);
  } catch (const std::exception& e) {
    current.report.error = std::string("mxamp_onednn: reviewing a region failed: ") + e.what();
    throw std::runtime_error(current.report.error);
  }
}

MXReturnValue review_subgraph(const Graph* g, int, bool* accept, const Attrs& options,
                              Attrs* node_attrs) {
  try {
    *accept = review(g, options, node_attrs);
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    MX_ERROR_MSG << e.what();
    return MX_FAIL;
  }
}

const Report& last_report() { return current.report; }

}  // namespace mxamp_onednn
