// The CPU engine and what oneDNN can do on this CPU (it honours
// ONEDNN_MAX_CPU_ISA, so a capped ISA turns features off here too).
#include "engine.h"

#include <dnnl_debug.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>

namespace mxamp_onednn {

bool reference_kernel(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

namespace {

using isa = dnnl::cpu_isa;

// Whether oneDNN creates an INT8 convolution with an optimised (not
// reference) kernel: the INT8 instructions it needs are there.
bool int8_convolution_runs() {
  try {
    const auto any = memory::format_tag::any;
    dnnl::convolution_forward::primitive_desc pd(
        cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc({1, 8, 8, 8}, kU8, any), memory::desc({8, 8, 3, 3}, kS8, any),
        memory::desc({1, 8, 6, 6}, kU8, any), {1, 1}, {0, 0}, {0, 0});
    return !reference_kernel(pd);
  } catch (const dnnl::error&) {
    return false;
  }
}

// Whether oneDNN runs on one of `isas`.
bool cpu_isa_in(std::initializer_list<isa> isas) {
  return std::count(isas.begin(), isas.end(), dnnl::get_effective_cpu_isa()) > 0;
}

// AVX2 or more, as oneDNN's levels go (which ask the CPU for AVX2 alone).
bool cpu_at_avx2() {
  return cpu_has_avx512() || cpu_isa_in({isa::avx2, isa::avx2_vnni, isa::avx2_vnni_2});
}

// bfloat16 dot products in hardware (AVX512-BF16 or AMX).
bool cpu_has_bf16() {
  return cpu_isa_in({isa::avx512_core_bf16, isa::avx512_core_fp16, isa::avx512_core_amx,
                     isa::avx512_core_amx_fp16});
}

}  // namespace

bool cpu_has_avx512() {
  return cpu_isa_in({isa::avx512_core, isa::avx512_core_vnni, isa::avx512_core_bf16,
                     isa::avx512_core_fp16, isa::avx512_core_amx, isa::avx512_core_amx_fp16});
}

bool cpu_has_vnni() {
  return cpu_has_bf16() || cpu_isa_in({isa::avx2_vnni, isa::avx2_vnni_2, isa::avx512_core_vnni});
}

namespace {

// Whether oneDNN 3.2's verbose setting asks for exec lines: a level of 1
// or more, or one of its comma-separated flags "profile_exec", "profile"
// or "all". ONEDNN_VERBOSE wins over DNNL_VERBOSE, as in oneDNN.
bool logs_exec() {
  const char* setting = std::getenv("ONEDNN_VERBOSE");
  if (!setting) setting = std::getenv("DNNL_VERBOSE");
  if (!setting) return false;
  std::istringstream flags(setting);
  for (std::string flag; std::getline(flags, flag, ',');)
    if (std::atoi(flag.c_str()) >= 1 || flag == "profile_exec" || flag == "profile" ||
        flag == "all")
      return true;
  return false;
}

std::atomic<bool>& verbose_exec() {
  static std::atomic<bool> on(logs_exec());
  return on;
}

}  // namespace

int set_verbose(int level) {
  dnnl_status_t status = dnnl_set_verbose(level);
  if (status == dnnl_success) verbose_exec() = level >= 1;
  return status;
}

void run_logged(const std::string& fields, const std::function<void()>& call) {
  if (!verbose_exec()) return call();
  auto start = std::chrono::steady_clock::now();
  call();
  std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - start;
  std::printf("onednn_verbose,exec,cpu,%s,%g\n", fields.c_str(), ms.count());
  std::fflush(stdout);
}

std::string type_name(memory::data_type dt) { return dnnl_dt2str(memory::convert_to_c(dt)); }

bool cpu_has_avx2() { return cpu_at_avx2() && __builtin_cpu_supports("fma"); }

std::string kernel_choice(const std::string& op) {
  const std::string name = "MXAMP_ONEDNN_" + op;
  const char* choice = std::getenv(name.c_str());
  if (!choice || !*choice) return "";
  if (std::string(choice) != "onednn" && std::string(choice) != "mxamp")
    throw std::invalid_argument(name + " must be onednn or mxamp (or unset), got '" + choice +
                                "'");
  return choice;
}

bool cpu_has_avx512_vnni() { return cpu_has_avx512() && cpu_has_vnni(); }

bool cpu_has_avx512_vbmi() { return cpu_has_avx512() && __builtin_cpu_supports("avx512vbmi"); }

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

int64_t count(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string tuple_text(const Dims& dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + (dims.size() == 1 ? ",)" : ")");
}

memory::desc plain(const Dims& dims, memory::data_type dt) {
  using tag = memory::format_tag;
  static const tag tags[] = {tag::undef, tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde};
  if (dims.empty() || dims.size() > 5)
    throw std::runtime_error("unsupported rank " + std::to_string(dims.size()));
  return memory::desc(dims, dt, tags[dims.size()]);
}

bool is_plain(const memory::desc& md) {
  return md == plain(md.get_dims(), md.get_data_type());
}

// Without VNNI oneDNN's kernels multiply u8 data by s8 weights with
// vpmaddubsw, which sums pairs into a saturating s16: 255 * 127 * 2
// overflows, 255 * 64 * 2 = 32640 fits. s8 data is shifted by +128 to u8
// first; oneDNN 3.2's convolutions then halve the weights themselves
// (scale_adjust 0.5), its inner products (gemm, brgemm) do not. So +-64 for
// u8 data, and for s8 data in FullyConnected. For data >= 0, u8 stays the
// better choice: s8 would halve the data's levels as well. u8 data at T / 127
// would allow +-127 but needs clipping at T, which reorders cannot do.
int weight_levels(bool conv, memory::data_type src) {
  return cpu_has_vnni() || (conv && src == kS8) ? 127 : 64;
}

int weight_step(bool conv, memory::data_type src) {
  return !cpu_has_vnni() && conv && src == kS8 ? 2 : 1;
}

bool cpu_stores_bf16() { return cpu_has_avx512(); }

bool cpu_supports(memory::data_type compute) {
  if (compute == kS8) {
    static const bool int8 = int8_convolution_runs();
    return int8;
  }
  return compute != kBF16 || cpu_has_bf16();
}

memory::data_type compute_type(const Attrs& options) {
  auto it = options.find("compute");
  if (it == options.end() || it->second == "bfloat16") return kBF16;
  if (it->second == "float32") return kF32;
  if (it->second == "int8") return kS8;
  throw std::invalid_argument("option compute must be bfloat16, float32 or int8, got '" +
                              it->second + "'");
}

memory::data_type float_type(const Attrs& options) {
  memory::data_type compute = compute_type(options);
  auto it = options.find("rest_dtype");
  if (it == options.end()) return compute == kS8 ? kF32 : compute;
  if (compute != kS8)
    throw std::invalid_argument("option rest_dtype is for compute int8 only, got compute " +
                                compute_name(compute));
  if (it->second == "float32") return kF32;
  if (it->second == "bfloat16") return kBF16;
  throw std::invalid_argument("option rest_dtype must be float32 or bfloat16, got '" +
                              it->second + "'");
}

std::string compute_name(memory::data_type compute) {
  return compute == kS8 ? "int8" : compute == kF32 ? "float32" : "bfloat16";
}

std::string cpu_feature_names() {
  const std::pair<const char*, bool> features[] = {
      {"avx2", cpu_at_avx2()},
      {"avx512", cpu_has_avx512()},
      {"vnni", cpu_has_vnni()},
      {"bf16", cpu_has_bf16()},
      {"amx", cpu_isa_in({isa::avx512_core_amx, isa::avx512_core_amx_fp16})}};
  std::string out;
  for (const auto& f : features)
    if (f.second) out += (out.empty() ? "" : " ") + std::string(f.first);
  return out;
}

dnnl::primitive_attr step_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// oneDNN sizes its kernels' work for omp_get_max_threads() when it makes a
// primitive (and keys its primitive cache on it).
Team::Team(int threads) : restore_(threads > 0 ? omp_get_max_threads() : 0) {
  if (threads > 0) omp_set_num_threads(threads);
}

Team::~Team() {
  if (restore_) omp_set_num_threads(restore_);
}

namespace {
// Distinct sibling lists (one per core) of the CPUs in this process's
// affinity mask; 0 where sysfs does not say.
int cores_of_process() {
  cpu_set_t cpus;
  if (sched_getaffinity(getpid(), sizeof(cpus), &cpus) != 0) return 0;
  std::set<std::string> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &cpus)) continue;
    std::ifstream file("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                       "/topology/thread_siblings_list");
    std::string siblings;
    if (!(file >> siblings)) return 0;
    cores.insert(siblings);
  }
  return static_cast<int>(cores.size());
}

// What sets the count or places threads instead (libgomp binds them there);
// mxamp.backends.onednn.THREAD_VARIABLES lists them for its log line.
constexpr const char* kThreadVariables[] = {"OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS",
                                            "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"};

int threads_for_regions() {
  for (const char* name : kThreadVariables) {
    const char* value = std::getenv(name);
    if (value && *value) return 0;
  }
  return cores_of_process();
}
}  // namespace

int region_threads() {
  static const int threads = threads_for_regions();  // read at the first region's run
  return threads;
}

}  // namespace mxamp_onednn
