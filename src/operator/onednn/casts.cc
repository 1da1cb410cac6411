// amp_cast and amp_multicast: they vanish inside a region, whose values are
// in the compute type (or INT8) anyway.
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

bool supported(const Node*, int) { return true; }

// Each output is its input's value.
void add(Plan* r, const Node* n, int) {
  for (size_t i = 0; i < n->inputs.size(); ++i) {
    int v = r->value_of(input(n, i));
    r->bind(passed_to(n, i), v);
    r->value(v).uses--;
  }
}

// A cast passes any value on as it is.
bool passes_zero_point(const Node*, int) { return true; }

}  // namespace

// amp_multicast casts each input to an output of its own; amp_cast has one.
const Family kCasts = {supported, add, nullptr, nullptr, passes_zero_point, nullptr, true};
const FamilyName kCastsName("casts", kCasts);

}  // namespace mxamp_onednn
