// A byte-to-byte table of mxamp's own (lookup.cc): an INT8 activation that
// oneDNN would run as a costly post-op (GELU's erf added 11 % to an INT8
// inner product's time at BERT's 128x768 -> 3072 on Zen 4, docs/onednn.md)
// becomes its 256 possible answers, looked up with AVX-512 VBMI's byte
// permutes (engine.h, cpu_has_avx512_vbmi).
#ifndef MXAMP_ONEDNN_LOOKUP_H_
#define MXAMP_ONEDNN_LOOKUP_H_

#include <cstdint>

namespace mxamp_onednn {

// dst[i] = table[src[i]] for i < n. Runs on the calling thread's OpenMP
// team (one thread inside a region's chunks).
void lookup_bytes(const uint8_t table[256], const uint8_t* src, uint8_t* dst, int64_t n);

}  // namespace mxamp_onednn

#endif  // MXAMP_ONEDNN_LOOKUP_H_
