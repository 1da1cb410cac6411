// A region's batch in chunks (region.h, Chunks): whether a region may cut
// its batch, and into how many images a chunk.
#include <algorithm>
#include <set>

#include "region.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// Whether every operator of g computes each image from that image alone
// (the weights' dequantization reads parameters only).
bool keeps_images_apart(const Graph* g) {
  for (size_t i = 0; i < g->size(); ++i) {
    const Node* n = g->getNode(i);
    if (is_variable(n) || dequantizes(n)) continue;
    const Row* row = row_of(n);
    if (!row || !row->apart) return false;
  }
  return true;
}

// How e is read, directly or through casts: as a parameter (by a row's
// parameter input or a weight's dequantization) and as data (by anything
// else, a region output included).
struct Reads {
  bool param = false, data = false;
};

void reads_of(const Readers& readers, Entry e, Reads* reads) {
  for (const Node* r : readers.of(e)) {
    if (!r || (!dequantizes(r) && !row_of(r))) {
      reads->data = true;
      continue;
    }
    for (size_t k = 0; k < r->inputs.size(); ++k) {
      if (input(r, k) != e) continue;
      if (is(r, kCasts))
        reads_of(readers, passed_to(r, k), reads);
      else if (dequantizes(r) || row_of(r)->is_param(static_cast<int>(k)))
        reads->param = true;
      else
        reads->data = true;
    }
  }
}

// The least input a chunk reads: each of its primitive calls must do enough
// work that the fixed cost of a call stays small, and INT8 kernels do about
// 4x float32's work in a cycle. One 224x224 RGB image is 588 KiB: MobileNet
// v2 and ResNet-50 ran fastest in chunks of 1 image in bfloat16, of 4 in
// INT8 (docs/onednn.md).
constexpr size_t kFloatChunkBytes = 512 << 10, kInt8ChunkBytes = 2 << 20;

// Images per chunk: the fewest that read `least` bytes of the `image`
// bytes each and cut the batch n into chunks that spread evenly over the
// threads; n where none does.
int64_t chunk_images(int64_t n, int threads, size_t image, size_t least) {
  for (int64_t images = 1; images < n; ++images)
    if (images * image >= least && n % images == 0 && (n / images) % threads == 0)
      return images;
  return n;
}

}  // namespace

std::vector<MXTensor> Chunks::of(const std::vector<MXTensor>& ts, bool outputs) const {
  std::vector<MXTensor> out(ts);
  for (size_t i = 0; i < out.size() && images; ++i)
    if (outputs || split[i]) out[i].shape[0] = images;
  return out;
}

Chunks chunks_of(const Graph* g, const std::vector<MXTensor>& ins,
                 const std::vector<MXTensor>& outs, int threads, bool int8) {
  Chunks whole;
  whole.split.assign(ins.size(), false);
  // Rank 2 at least: a softmax or LayerNorm over a 1-d tensor mixes images.
  if (outs.empty() || outs[0].shape.size() < 2 || !keeps_images_apart(g)) return whole;
  const int64_t n = outs[0].shape[0];
  for (const MXTensor& t : outs)
    if (t.shape.size() < 2 || t.shape[0] != n) return whole;
  Readers readers(g);
  Chunks c = whole;
  size_t image = 0;  // input bytes per image, each tensor once (region.cc, same_tensors)
  std::set<const void*> counted;
  for (size_t i = 0; i < ins.size(); ++i) {
    Reads reads;
    reads_of(readers, {g->inputs[i], 0}, &reads);
    if (reads.param && reads.data) return whole;  // one tensor, cut and whole
    if (!reads.data) continue;
    if (ins[i].shape.size() < 2 || ins[i].shape[0] != n) return whole;
    c.split[i] = true;
    if (counted.insert(ins[i].data_ptr).second) image += ins[i].size() / n * sizeof(float);
  }
  if (image == 0) return whole;
  c.images = chunk_images(n, std::max(threads, 1), image,
                          int8 ? kInt8ChunkBytes : kFloatChunkBytes);
  if (c.images == n) return whole;
  c.count = n / c.images;
  c.workers = std::min<int64_t>(threads, c.count);
  return c;
}

}  // namespace mxamp_onednn
