// Flatten and Reshape (views of a dense tensor, any data type) and
// transpose (any data type), INT8 in its encoding: a strided view where only batch_dots read it
// (and where a batch_dot wrote its input in the transposed order, a dense
// one), else one reorder through permuted strides.
#include <algorithm>

#include "fusion.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

// transpose's axes, negative ones counted from the end.
Dims axes_of(const Node* n) {
  Dims axes = ints(n, "axes");
  int64_t rank = static_cast<int64_t>(axes.size());
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  return axes;
}

// A permutation of up to 5 axes.
bool permutation(Dims axes) {
  int64_t rank = static_cast<int64_t>(axes.size());
  std::sort(axes.begin(), axes.end());
  for (int64_t i = 0; i < rank; ++i)
    if (axes[i] != i) return false;
  return rank > 0 && rank <= 5;
}

bool supported(const Node* n, int variant) {
  if (variant == kTranspose) return permutation(axes_of(n));
  if (variant == kFlatten) return true;
  // Reshape with plain sizes, 0 (keep) and -1 (infer).
  Dims shape = ints(n, "shape");
  return !flag(n, "reverse", false) && !shape.empty() &&
         std::all_of(shape.begin(), shape.end(), [](int64_t x) { return x >= -1; });
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

// Whether shapes a and b (of as many elements) differ only in how their
// batch axes, all but the last two, group: batch_dot's view of both is one.
bool same_matrices(const Dims& a, const Dims& b) {
  return a.size() >= 3 && b.size() >= 3 && a[a.size() - 2] == b[b.size() - 2] &&
         a.back() == b.back();
}

// Whether every reader of e (of shape d) is a batch_dot, through casts and
// Reshapes that regroup only the batch axes: then a transpose writing e
// stays a strided view that the batch_dots read in place.
bool read_by_batch_dots(const Plan& r, Entry e, const Dims& d) {
  const std::vector<const Node*>& readers = r.readers().of(e);
  for (const Node* n : readers) {
    if (n && is(n, kBatchDot)) continue;
    if (n && is(n, kCasts)) {
      for (size_t k = 0; k < n->inputs.size(); ++k)
        if (input(n, k) == e && !read_by_batch_dots(r, passed_to(n, k), d)) return false;
      continue;
    }
    if (!n || !is(n, kViews, kReshape)) return false;
    Dims shape = reshaped(n, d);
    if (!same_matrices(shape, d) || !read_by_batch_dots(r, {n, 0}, shape)) return false;
  }
  return !readers.empty();
}

void add_view(Plan* r, const Node* n, int variant) {
  int v = r->value_of(input(n, 0));
  const Dims d = r->value(v).dims;
  const Encoding enc = r->value(v).enc;
  const bool strided = r->value(v).permuted;
  Dims shape = variant == kFlatten ? Dims{d[0], count(d) / d[0]} : reshaped(n, d);
  // A strided view stays one while only its batch axes regroup.
  bool keep = strided && variant == kReshape && same_matrices(shape, r->value(v).md.get_dims());
  Arg src = keep ? Arg{r->value(v).buf, r->value(v).md} : r->view(v, shape);
  int out = r->new_value(src.first, src.second, shape, {n, 0}, enc);
  r->value(out).permuted = keep;
  r->consume(input(n, 0));
}

// md's axes in the order `axes` gives, by strides: no data moves.
memory::desc permuted(const memory::desc& md, const Dims& axes) {
  Dims d = md.get_dims(), s = md.get_strides(), out(d.size()), strides(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    out[i] = d[axes[i]];
    strides[i] = s[axes[i]];
  }
  return memory::desc(out, md.get_data_type(), strides);
}

// Transposing moves values, it changes none: the type stays (INT8 with its
// encoding). The value's own strides are permuted where it has them (dense,
// strided or nhwc), so that a transpose of a batch_dot's output that the
// matmul wrote in transposed order is dense where it lies.
void add_transpose(Plan* r, const Node* n) {
  int v = r->value_of(input(n, 0));
  const Dims d = r->value(v).dims;
  const Encoding enc = r->value(v).enc;
  Dims axes = axes_of(n);
  if (axes.size() != d.size())
    throw std::runtime_error("transpose " + n->name + ": axes do not match the rank");
  const memory::desc md = r->value(v).md;
  Arg src = md.get_inner_nblks() == 0 && md.get_dims() == d ? Arg{r->value(v).buf, md}
                                                             : r->view(v, d);
  memory::desc view = permuted(src.second, axes);
  Dims out = view.get_dims();
  memory::desc dst = plain(out, view.get_data_type());
  bool lazy = !is_plain(view) && read_by_batch_dots(*r, {n, 0}, out);
  int b = src.first;
  if (!is_plain(view) && !lazy) {
    b = r->new_buffer(dst);
    r->add_reorder({src.first, view}, {b, dst});
  }
  int w = r->new_value(b, lazy ? view : dst, out, {n, 0}, enc);
  r->value(w).permuted = lazy;
  r->consume(input(n, 0));
}

// Flatten and Reshape are views (no primitive of their own).
std::vector<Dims> probe(const Node* n, int variant) {
  if (variant != kTranspose) return {};
  Dims dims = {2, 3, 4, 5, 6};
  dims.resize(ints(n, "axes").size());
  return {dims};
}

void add(Plan* r, const Node* n, int variant) {
  if (variant == kTranspose) add_transpose(r, n);
  else add_view(r, n, variant);
}

// Views and transposes move values, they change none.
bool passes_zero_point(const Node*, int) { return true; }

}  // namespace

memory::desc layout_for_views(const Plan& r, Entry e, const Dims& d, memory::data_type dt) {
  const Node* n = r.readers().sole(e);
  Dims dims = d;
  if (n && is(n, kViews, kReshape)) {
    dims = reshaped(n, d);
    if (!same_matrices(dims, d)) return plain(d, dt);
    n = r.readers().sole({n, 0});
  }
  if (!n || !is(n, kViews, kTranspose) || axes_of(n).size() != dims.size()) return plain(d, dt);
  // Each axis's stride is its stride in the transpose's dense output.
  Dims axes = axes_of(n), out(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) out[i] = dims[axes[i]];
  Dims dense = plain(out, dt).get_strides();
  for (size_t i = 0; i < dims.size(); ++i) strides[axes[i]] = dense[i];
  return memory::desc(dims, dt, strides);
}

const Family kViews = {supported, add, probe, nullptr, passes_zero_point};
const FamilyName kViewsName("views", kViews);

}  // namespace mxamp_onednn
