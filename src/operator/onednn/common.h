// What every file of mxamp's oneDNN backend shares: oneDNN, MXNet's
// extension API, and the small types used throughout. See library.cc for an
// overview of the backend.
#ifndef MXAMP_ONEDNN_COMMON_H_
#define MXAMP_ONEDNN_COMMON_H_

#include <dnnl.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mxnet/lib_api.h"

namespace mxamp_onednn {

using namespace mxnet::ext;  // NOLINT
using dnnl::memory;
using Dims = std::vector<int64_t>;
using Attrs = std::unordered_map<std::string, std::string>;
using Entry = std::pair<const Node*, int>;  // a node's output
using Arg = std::pair<int, memory::desc>;   // a buffer of a region, and how it is read

const auto kF32 = memory::data_type::f32;
const auto kBF16 = memory::data_type::bf16;
const auto kS8 = memory::data_type::s8;
const auto kU8 = memory::data_type::u8;

inline bool is_int8(memory::data_type t) { return t == kS8 || t == kU8; }

// Input k of node n as an entry.
inline Entry input(const Node* n, size_t k) { return {n->inputs[k].node, n->inputs[k].entry}; }

// The number of elements of a tensor of these dims.
int64_t count(const Dims& dims);

// Python's str() of a tuple, as MXNet reads shapes and split indices.
std::string tuple_text(const Dims& dims);

// A dense row-major tensor of these dims.
memory::desc plain(const Dims& dims, memory::data_type dt);

// Whether md is dense row-major (as plain() makes it).
bool is_plain(const memory::desc& md);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_COMMON_H_
