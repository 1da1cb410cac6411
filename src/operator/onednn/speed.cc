// How fast this CPU's bfloat16 dot products are against its float32 ones,
// measured through oneDNN: the same ISA class (AVX512-BF16) is 2x faster in
// bfloat16 on one CPU (AMD Zen 4) and 2.4x slower on another (an Intel Xeon
// without AMX, whose vdpbf16ps issues at half the FMA rate).

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>

#include "engine.h"

namespace mxamp_onednn {
namespace {

// A compute-bound inner product: 512 x 512 by 512 x 512 (0.27 GFLOP; the
// weights, 1 MB in float32, fit the L2 cache of the CPUs this is for).
constexpr memory::dim kSide = 512;
constexpr int kWarmUp = 10;

class TimedProduct {
 public:
  explicit TimedProduct(memory::data_type dt) {
    auto any = memory::format_tag::any;
    dnnl::inner_product_forward::primitive_desc pd(
        cpu_engine(), dnnl::prop_kind::forward_inference,
        memory::desc({kSide, kSide}, dt, memory::format_tag::ab),
        memory::desc({kSide, kSide}, dt, any), memory::desc({kSide, kSide}, kF32, any));
    product_ = dnnl::inner_product_forward(pd);
    // Zeros: the kernels take the same time for any finite values.
    args_ = {{DNNL_ARG_SRC, zeros(pd.src_desc())},
             {DNNL_ARG_WEIGHTS, zeros(pd.weights_desc())},
             {DNNL_ARG_DST, zeros(pd.dst_desc())}};
  }

  // Seconds of one call.
  double run(dnnl::stream& stream) {
    auto start = std::chrono::steady_clock::now();
    product_.execute(stream, args_);
    stream.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  static memory zeros(const memory::desc& desc) {
    memory m(desc, cpu_engine());
    std::memset(m.get_data_handle(), 0, desc.get_size());
    return m;
  }

  dnnl::inner_product_forward product_;
  std::unordered_map<int, memory> args_;
};

// bf16_dot_slowdown on the calling thread's OpenMP threads.
double timed_slowdown(int rounds) {
  dnnl::stream stream(cpu_engine());
  TimedProduct f32(kF32), bf16(kBF16);
  // The first calls of a process run slow for a while (threads starting,
  // pages, clocks): float32 measured up to 2x slower right after loading.
  for (int i = 0; i < kWarmUp; ++i) {
    f32.run(stream);
    bf16.run(stream);
  }
  double f32_best = std::numeric_limits<double>::infinity(), bf16_best = f32_best;
  // Interleaved, and the fastest of each: another job slows both alike, and
  // only ever slows a call.
  for (int i = 0; i < rounds; ++i) {
    f32_best = std::min(f32_best, f32.run(stream));
    bf16_best = std::min(bf16_best, bf16.run(stream));
  }
  return bf16_best / f32_best;
}

}  // namespace

// One thread: the ratio of rates is one core's, and on one thread a busy
// machine delays a call only where it preempts it (two threads also wait
// for each other: measured 0.5-4.5 on two threads under load, 1.9-2.0 on one).
double bf16_dot_slowdown(int rounds) {
  if (!cpu_supports(kBF16)) return 0;
  Team one(1);
  try {
    return timed_slowdown(rounds);
  } catch (const std::exception&) {
    return -1;  // an exception must not cross into ctypes (it aborts)
  }
}

}  // namespace mxamp_onednn
