// mxamp's oneDNN 3 execution backend: an MXNet 1.9.1 extension library.
//
// The pass "mxamp_onednn_finish" groups the supported operators the
// selector (partitioner.cc) chooses into regions (groups.cc, regions.cc: as
// MXNet's partitioner would, in linear time; the selector is registered as
// the partitioner "mxamp_onednn" too); each region becomes one
// "_mxamp_onednn_region" node whose stateful operator (region.cc) runs the
// region as a chain of oneDNN primitives: weights are packed once
// (BatchNorm folded in), activations stay in oneDNN's blocked layouts, bias
// / residual add / activation are post-ops, and reorders happen only at the
// region's inputs and outputs. What the backend runs is one table (table.cc): a row per
// operator, naming the family file that plans it (linear.cc, eltwise.cc,
// binary.cc, pooling.cc, normalisation.cc, batch_dot.cc, views.cc,
// casts.cc). Three kernels are mxamp's own, not oneDNN's: the INT8 3x3
// depthwise convolution with stride 1 (depthwise.cc), which linear.cc
// plans where it applies; a softmax from float32 or bfloat16 to INT8
// (softmax_int8.cc), which normalisation.cc plans where oneDNN's INT8
// softmax is its reference kernel (AVX2) and on bfloat16 scores (AVX-512);
// and a byte table (lookup.cc), which eltwise.cc plans for
// INT8 GELU on CPUs with AVX-512 VBMI. Their calls log in oneDNN's verbose
// format.
//
// Region inputs and outputs are always float32: lib_api 1.9.1 has no
// bfloat16 tensor type, so the pass (finish.cc), once the regions are
// formed, puts amp_cast nodes at region edges where the surrounding graph
// holds bfloat16.
//
// The option "compute" (bfloat16 by default, float32 or int8)
// sets the data type the regions compute in; float32 runs the same chains on
// any x86 CPU oneDNN supports, so regions can be checked tightly against
// MXNet there.
//
// INT8 (compute "int8") uses calibration the graph carries as node
// attributes: __mxamp_amax__ (symmetric threshold T) and __mxamp_min__
// (smallest value) of an operator's output 0 or of a variable;
// __mxamp_float__ = "1" keeps a node in float32. Convolution /
// FullyConnected whose input is INT8 or calibrated run in INT8: activations
// u8 when min >= 0, else s8, with oneDNN's scale convention real = int *
// scale, scale = T / 255 (u8) or T / 127 (s8); weights s8 with a scale per
// output channel (max |w| / 127 after BatchNorm folding; / 64 where CPUs
// without VNNI would saturate, see weight_levels); s32 accumulation; bias
// float32 (oneDNN 3 adds it after the scales, so it needs no
// requantization). The output is requantized to u8/s8 when its node (the
// last one fused) is calibrated and every reader in the region takes INT8,
// else float. Pooling, Flatten / Reshape and adds pass INT8 on (same encoding;
// an add, with an activation after it as post-op, requantizes to its own)
// where what reads them takes INT8. The operators INT8 does not cover
// (softmax, LayerNorm, activations not fused as post-ops) compute in the
// narrowest type the CPU allows: bfloat16 where oneDNN stores it (AVX-512
// and up); else float32, with LayerNorm reading and writing s8/u8 and
// softmax writing them. GELU's
// output read by FullyConnected layers is u8 with a zero point at its
// floor, a signed output convolutions read, and a signed float tensor
// quantized for FullyConnected readers only, u8 with zero point 128
// (encodings.cc); the readers compensate the zero point. Layers kept out of INT8
// (__mxamp_float__, or uncalibrated) compute in the option rest_dtype
// (recorded on the region node): float32, or bfloat16; what they read is
// written in their type. Region inputs are quantized where first read, and
// region outputs written in float32 (rest_dtype).
#include <string>

#include "engine.h"
#include "finish.h"
#include "lookup.h"
#include "partitioner.h"
#include "region.h"
#include "softmax_int8.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

MXReturnValue create_region(const Attrs& attrs, const MXContext&,
                            const std::vector<std::vector<unsigned int>>&, const std::vector<int>,
                            CustomStatefulOp** state) {
  auto it = attrs.find(MX_STR_SUBGRAPH_SYM_JSON);
  if (it == attrs.end()) {
    MX_ERROR_MSG << kRegionOp << " has no subgraph";
    return MX_FAIL;
  }
  try {
    auto ranges = attrs.find("input_ranges");
    *state = CustomStatefulOp::create<Region>(
        it->second, compute_type(attrs),
        parse_ranges(ranges == attrs.end() ? "" : ranges->second), float_type(attrs));
    return MX_SUCCESS;
  } catch (const std::exception& e) {
    MX_ERROR_MSG << kRegionOp << ": cannot read the subgraph: " << e.what();
    return MX_FAIL;
  }
}

// A query's answer, or "error: " and why; it lives until the next call of
// that query on the calling thread.
template <typename Ask>
const char* answer(Ask ask) {
  thread_local std::string out;
  try {
    out = ask();
  } catch (const std::exception& e) {
    out = std::string("error: ") + e.what();
  }
  return out.c_str();
}

}  // namespace
}  // namespace mxamp_onednn

// Queries for mxamp.backends.onednn (through ctypes). The texts of the
// reports live until the next partitioning on the calling thread.
extern "C" {

const char* mxamp_onednn_fallbacks() {
  return mxamp_onednn::last_report().fallbacks.c_str();
}

const char* mxamp_onednn_error() { return mxamp_onednn::last_report().error.c_str(); }

// What the last finish on this thread made (finish.h: Finished).
const char* mxamp_onednn_widened() { return mxamp_onednn::last_finished().widened.c_str(); }

int mxamp_onednn_corrected() { return mxamp_onednn::last_finished().corrected; }

const char* mxamp_onednn_float32_weights() {
  return mxamp_onednn::last_finished().float32_weights.c_str();
}

const char* mxamp_onednn_outside() { return mxamp_onednn::last_finished().outside.c_str(); }

const char* mxamp_onednn_regions() { return mxamp_onednn::last_finished().regions.c_str(); }

// What oneDNN uses of this CPU (ONEDNN_MAX_CPU_ISA honoured), as the names of
// mxamp.cpu.FEATURES, space-separated.
const char* mxamp_onednn_cpu_features() {
  static const std::string names = mxamp_onednn::cpu_feature_names();
  return names.c_str();
}

// bf16_dot_slowdown (engine.h), for mxamp.backends.onednn.bf16_slowdown.
double mxamp_onednn_bf16_slowdown(int rounds) {
  return mxamp_onednn::bf16_dot_slowdown(rounds);
}

// region_threads (engine.h), for mxamp.backends.onednn.region_threads.
int mxamp_onednn_region_threads() { return mxamp_onednn::region_threads(); }

// oneDNN's verbose mode and the backend's own kernels' lines in it, at run
// time (set_verbose, engine.h), for mxamp.backends.onednn.set_verbose.
int mxamp_onednn_set_verbose(int level) { return mxamp_onednn::set_verbose(level); }

// mxamp's own softmax (softmax_int8.h) on host arrays, for its tests
// (tests/backends/test_onednn_int8.py); it needs AVX2 with FMA.
void mxamp_onednn_softmax_int8(const void* src, bool bf16, void* dst, int64_t rows, int64_t cols,
                               float scale, bool out_signed) {
  mxamp_onednn::softmax_int8(src, bf16, dst, rows, cols, scale, out_signed);
}

// mxamp's byte table (lookup.h) on host arrays, for its tests; false
// (nothing done) where the CPU has no AVX-512 VBMI.
bool mxamp_onednn_lookup_bytes(const uint8_t* table, const uint8_t* src, uint8_t* dst,
                               int64_t n) {
  if (!mxamp_onednn::cpu_has_avx512_vbmi()) return false;
  mxamp_onednn::lookup_bytes(table, src, dst, n);
  return true;
}

// int8_layers (table.h), for mxamp.backends.onednn.int8_layers: a JSON list.
const char* mxamp_onednn_int8_layers(const char* graph, const char* input_ranges) {
  return mxamp_onednn::answer([&] { return mxamp_onednn::int8_layers(graph, input_ranges); });
}

// float32_weight_layers (table.h), for
// mxamp.backends.onednn.float32_weight_layers.
const char* mxamp_onednn_float32_weight_layers(const char* model) {
  return mxamp_onednn::answer([&] { return mxamp_onednn::float32_weight_layers(model); });
}

// The operator table as a JSON list of rows.
const char* mxamp_onednn_table() {
  static const std::string json = mxamp_onednn::table_json();
  return json.c_str();
}

}  // extern "C"

using namespace mxnet::ext;  // NOLINT: the registration macros expect it
using mxamp_onednn::create_region;
using mxamp_onednn::create_selector;
using mxamp_onednn::finish;
using mxamp_onednn::review_subgraph;

REGISTER_OP(_mxamp_onednn_region)
    .setIsSubgraphOp()
    .setCreateOpState(create_region, "cpu");

REGISTER_PARTITIONER(mxamp_onednn)
    .addStrategy("bf16_regions", "_mxamp_onednn_region")
    .setCreateSelector("bf16_regions", create_selector)
    .setReviewSubgraph("bf16_regions", review_subgraph);

REGISTER_PASS(mxamp_onednn_finish).setBody(finish);

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "mxamp_onednn needs MXNet 1.9, found version " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
