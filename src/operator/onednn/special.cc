// NaN and +-Inf in an exact region (special.h): the steps that give them
// MXNet's answers where oneDNN's primitives do not.
#include "special.h"

#include <dnnl_debug.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace mxamp_onednn {
namespace {

const float* src_of(const std::unordered_map<int, memory>& a) {
  return static_cast<const float*>(a.at(DNNL_ARG_SRC).get_data_handle());
}

float* dst_of(const std::unordered_map<int, memory>& a) {
  return static_cast<float*>(a.at(DNNL_ARG_DST).get_data_handle());
}

// The log line of a step (run_logged): its primitive kind and algorithm
// as oneDNN names them.
std::string log_line(dnnl_primitive_kind_t kind, dnnl::algorithm alg, const Dims& dims) {
  std::string problem;
  for (int64_t x : dims) problem += (problem.empty() ? "" : "x") + std::to_string(x);
  return std::string(dnnl_prim_kind2str(kind)) +
         ",mxamp_special:any,forward_inference,src_f32::blocked:any::f0 " +
         "dst_f32::blocked:any::f0,,alg:" + dnnl_alg_kind2str(dnnl::convert_to_c(alg)) + "," +
         problem;
}

void keep_special_values(const float* x, float* y, int64_t count, bool gelu) {
  for (int64_t i = 0; i < count; ++i) {
    if (std::isnan(x[i])) y[i] = x[i];
    else if (gelu && std::isinf(x[i])) y[i] = x[i] > 0 ? x[i] : NAN;
  }
}

void softmax_special_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    bool nan = std::all_of(in, in + cols, [](float v) { return v == -INFINITY; });
    for (int64_t c = 0; c < cols && !nan; ++c) nan = std::isnan(in[c]) || in[c] == INFINITY;
    if (nan) std::fill(y + r * cols, y + (r + 1) * cols, NAN);
  }
}

}  // namespace

bool all_finite(const float* data, int64_t count) {
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(data);
  uint32_t special = 0;  // 1 once an exponent field is all ones: NaN or Inf
#pragma omp simd reduction(| : special)
  for (int64_t i = 0; i < count; ++i) special |= (bits[i] & 0x7f800000u) == 0x7f800000u;
  return !special;
}

// relu and clip run max and min instructions, which return the second
// operand (the bound) when one is NaN; GELU's erf polynomial gives NaN for
// +Inf.
bool loses_special_values(const Eltwise& e) {
  return (e.alg == dnnl::algorithm::eltwise_relu && e.alpha == 0) ||
         e.alg == dnnl::algorithm::eltwise_clip || e.alg == dnnl::algorithm::eltwise_gelu_erf;
}

void add_special_values(Plan* r, const Eltwise& e, Arg src, Arg dst) {
  const bool gelu = e.alg == dnnl::algorithm::eltwise_gelu_erf;
  const int64_t count = static_cast<int64_t>(src.second.get_size() / sizeof(float));
  r->add_step(
      [gelu, count](const std::unordered_map<int, memory>& a) {
        keep_special_values(src_of(a), dst_of(a), count, gelu);
      },
      log_line(dnnl_eltwise, e.alg, src.second.get_dims()),
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
}

void add_softmax_special_rows(Plan* r, Arg src, Arg dst, int64_t rows, int64_t cols) {
  r->add_step(
      [rows, cols](const std::unordered_map<int, memory>& a) {
        softmax_special_rows(src_of(a), dst_of(a), rows, cols);
      },
      log_line(dnnl_softmax, dnnl::algorithm::softmax_accurate, {rows, cols}),
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
}

}  // namespace mxamp_onednn
