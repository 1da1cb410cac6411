// The CPU engine and what oneDNN can do on this CPU.
#ifndef MXAMP_ONEDNN_ENGINE_H_
#define MXAMP_ONEDNN_ENGINE_H_

#include <functional>
#include <string>

#include "common.h"

namespace mxamp_onednn {

dnnl::engine& cpu_engine();

// Whether this CPU computes in `compute` (s8 for INT8); a capped ISA turns
// the backend off.
bool cpu_supports(memory::data_type compute);

// Whether oneDNN chose its reference implementation for pd (plain loops,
// often 10-100x slower than its jit kernels).
bool reference_kernel(const dnnl::primitive_desc_base& pd);

// INT8 dot products in one instruction (VNNI, or AMX's CPUs).
bool cpu_has_vnni();

// AVX2 with FMA, or more: what mxamp's own softmax needs (softmax_int8.h). As
// oneDNN runs, so that a capped ISA turns it off too.
bool cpu_has_avx2();

// AVX-512 (F, BW, VL, DQ: oneDNN's avx512_core) or more, as oneDNN runs:
// where mxamp's softmax runs its AVX-512 copy (softmax_int8.h).
bool cpu_has_avx512();

// Which kernel runs an operator mxamp has one of its own for ("DEPTHWISE",
// "SOFTMAX", "GELU"), by the environment variable MXAMP_ONEDNN_<op>: "onednn"
// (oneDNN's always, to compare), "mxamp" (mxamp's wherever it computes the
// step, to compare where oneDNN's is chosen), or "" (unset: as planned);
// std::invalid_argument naming the variable for any other value.
std::string kernel_choice(const std::string& op);

// AVX-512 with VNNI (or AMX's CPUs): what mxamp's own INT8 kernel needs
// (depthwise.h). As oneDNN runs, so that a capped ISA turns it off too.
bool cpu_has_avx512_vnni();

// AVX-512 with VBMI's byte permutes: what mxamp's byte table needs
// (lookup.h). As oneDNN runs, so that a capped ISA turns it off too.
bool cpu_has_avx512_vbmi();

// Whether oneDNN reads and writes bfloat16 tensors here: AVX-512 and up,
// converting in software where the CPU has no AVX512-BF16. INT8 regions
// store what softmax and LayerNorm read and write in it (the narrowest
// float type) even where bfloat16 does not compute.
bool cpu_stores_bf16();

// The levels s8 weights may use with data of type src (see engine.cc).
int weight_levels(bool conv, memory::data_type src);

// The step s8 weights quantized ahead of time take, so that they stay exact
// where oneDNN changes them (see engine.cc): 2 where it halves them, else 1.
int weight_step(bool conv, memory::data_type src);

// The compute data type named by the option "compute" (bfloat16 when not
// given); s8 stands for "int8" (INT8 where calibrated, float32 elsewhere).
memory::data_type compute_type(const Attrs& options);
std::string compute_name(memory::data_type compute);

// The float type a region computes in where it does not compute in INT8:
// the compute type itself, or for INT8 the option "rest_dtype" (float32
// when not given, or bfloat16: mixed INT8 + bfloat16 regions).
memory::data_type float_type(const Attrs& options);

// What oneDNN uses of this CPU, as the names of mxamp.cpu.FEATURES.
std::string cpu_feature_names();

// Attributes for a primitive a region step runs: the region gives it its
// scratchpad. oneDNN's own is the creating thread's, and a region's chunks
// run its primitives on every thread (region.h, Chunks).
dnnl::primitive_attr step_attr();

// A data type as oneDNN's verbose lines name it ("s8", "bf16", ...): for
// the log lines of mxamp's own kernels.
std::string type_name(memory::data_type dt);

// Runs `call`, one call of a kernel of mxamp's own (depthwise.h), and logs
// it as oneDNN's verbose mode logs a primitive's call where oneDNN's exec
// lines are asked for: by ONEDNN_VERBOSE (or DNNL_VERBOSE) when the library
// loads, then by set_verbose. `fields`: the line's fields from the
// primitive kind to the problem, its implementation named as mxamp's.
void run_logged(const std::string& fields, const std::function<void()>& call);

// oneDNN's verbose mode from now on (dnnl_set_verbose: 1 and 2 log exec
// lines), and run_logged's alike, where oneDNN takes the level; returns
// oneDNN's status.
int set_verbose(int level);

// While one lives, the calling thread's OpenMP teams have `threads` threads
// (unchanged when 0), and oneDNN makes and runs primitives for that many.
class Team {
 public:
  explicit Team(int threads);
  ~Team();
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

 private:
  int restore_;  // the team size to restore; 0 when unchanged
};

// The team a region runs on: one thread per core this process may run on;
// 0 (MXNet's count for its engine thread) where OMP_NUM_THREADS or
// MXNET_OMP_MAX_THREADS sets a count, OMP_PROC_BIND, OMP_PLACES or
// GOMP_CPU_AFFINITY places threads, or sysfs does not say. Without those,
// MXNet halves the CPUs on x86 to leave out hyper-threads, which leaves half
// the cores idle where every CPU is a core (as on KVM guests that show one
// thread per core).
int region_threads();

// How many times longer a compute-bound bfloat16 inner product takes than
// the float32 one here, the fastest of `rounds` interleaved calls of each
// (speed.cc); 0 where oneDNN has no bfloat16 instructions, -1 where oneDNN
// failed to run them.
double bf16_dot_slowdown(int rounds);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_ENGINE_H_
