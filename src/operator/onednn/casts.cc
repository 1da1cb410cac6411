// amp_cast and amp_multicast: they vanish inside a region, whose values are
// in the compute type (or INT8) anyway.
#include "region.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

bool supported(const Node*, int) { return true; }

// Each output is its input's value.
void add(Region* r, const Node* n, int) {
  for (size_t i = 0; i < n->inputs.size(); ++i) {
    int v = r->value_of(input(n, i));
    r->bind({n, static_cast<int>(i)}, v);
    r->value(v).uses--;
  }
}

}  // namespace

const Family kCasts = {supported, add, nullptr, nullptr};

}  // namespace mxamp_onednn
