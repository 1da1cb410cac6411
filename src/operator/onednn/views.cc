// Flatten and Reshape (views of a dense tensor, any data type) and
// transpose (one reorder through permuted strides, any data type).
#include <algorithm>

#include "region.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// transpose's axes: a permutation of up to 5 axes (negative ones count
// from the end).
bool permutation(Dims axes) {
  int64_t rank = static_cast<int64_t>(axes.size());
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  for (int64_t i = 0; i < rank; ++i)
    if (axes[i] != i) return false;
  return rank > 0 && rank <= 5;
}

bool supported(const Node* n, int variant) {
  if (variant == kTranspose) return permutation(ints(n, "axes"));
  if (variant == kFlatten) return true;
  // Reshape with plain sizes, 0 (keep) and -1 (infer).
  Dims shape = ints(n, "shape");
  return !flag(n, "reverse", false) && !shape.empty() &&
         std::all_of(shape.begin(), shape.end(), [](int64_t x) { return x >= -1; });
}

int64_t count(const Dims& d) {
  int64_t total = 1;
  for (int64_t x : d) total *= x;
  return total;
}

// The shape a Reshape node gives a tensor of shape d.
Dims reshaped(const Node* n, const Dims& d) {
  Dims shape = ints(n, "shape");
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) {
      if (i >= d.size()) throw std::runtime_error("Reshape " + n->name + ": 0 past the rank");
      shape[i] = d[i];
    }
    if (shape[i] == -1) infer = static_cast<int>(i);
    else known *= shape[i];
  }
  if (infer >= 0 && known > 0) shape[infer] = count(d) / known;
  if (count(shape) != count(d))
    throw std::runtime_error("Reshape " + n->name + ": sizes do not match");
  return shape;
}

void add_view(Region* r, const Node* n, int variant) {
  int v = r->value_of(input(n, 0));
  const Dims d = r->value(v).dims;
  Dims shape = variant == kFlatten ? Dims{d[0], count(d) / d[0]} : reshaped(n, d);
  Arg src = r->view(v, shape);
  r->new_value(src.first, src.second, shape, {n, 0}, r->value(v).scale);
  r->consume(input(n, 0));
}

void add_transpose(Region* r, const Node* n) {
  int v = r->value_of(input(n, 0));
  const Dims d = r->value(v).dims;
  Dims axes = ints(n, "axes");
  if (axes.size() != d.size())
    throw std::runtime_error("transpose " + n->name + ": axes do not match the rank");
  Dims strides(d.size(), 1), out(d.size()), out_strides(d.size());
  for (size_t i = d.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * d[i];
  for (size_t i = 0; i < d.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + static_cast<int64_t>(d.size()) : axes[i];
    out[i] = d[a];
    out_strides[i] = strides[a];
  }
  // Transposing moves values, it changes none: the type stays (INT8 with
  // its scale).
  Arg src = r->view(v, d);
  memory::data_type dt = src.second.get_data_type();
  memory::desc permuted(out, dt, out_strides), dst = plain(out, dt);
  int b = r->new_buffer(dst);
  r->add_reorder({src.first, permuted}, {b, dst});
  r->new_value(b, dst, out, {n, 0}, r->value(v).scale);
  r->consume(input(n, 0));
}

// Flatten and Reshape are views (no primitive of their own).
std::vector<Dims> probe(const Node* n, int variant) {
  if (variant != kTranspose) return {};
  Dims dims = {2, 3, 4, 5, 6};
  dims.resize(ints(n, "axes").size());
  return {dims};
}

void add(Region* r, const Node* n, int variant) {
  if (variant == kTranspose) add_transpose(r, n);
  else add_view(r, n, variant);
}

}  // namespace

const Family kViews = {supported, add, nullptr, probe};

}  // namespace mxamp_onednn
