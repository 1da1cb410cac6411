// The INT8 types and encodings of a linear layer's source and output: s8,
// or u8 from 0 or with a zero point where the readers compensate one
// (docs/onednn.md, "Why signed INT8 tensors are u8 with a zero point").
#include <algorithm>
#include <cmath>
#include <tuple>

#include "engine.h"
#include "linear.h"
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {

namespace {

// Whether n reads `read` as its data in INT8, compensating a zero point:
// through its bias, or a padded convolution by oneDNN's source zero point
// (bias_takes_zero_point).
bool reads_as_data(const Node* n, Entry read) {
  return is(n, kLinear) && !keeps_float(n) && input(n, 0) == read;
}

// reads_as_data, by a FullyConnected layer.
bool fc_reads_as_data(const Node* n, Entry read) {
  return is(n, kLinear, kFullyConnected) && reads_as_data(n, read);
}

// Whether add n, reading e, is a residual sum a convolution planned later
// takes as its sum post-op: its other operand is such a convolution's
// output (a BatchNorm folded into it).
bool summed_into_convolution(Plan* r, const Node* n, Entry e) {
  if (!is(n, kBinary)) return false;
  Entry other = input(n, input(n, 0) == e ? 1 : 0), conv = other;
  if (is(conv.first, kNormalisation, kBatchNorm)) conv = input(conv.first, 0);
  return is(conv.first, kLinear, kConvolution) && other.second == 0 && !r->has_value(other) &&
         r->readers().sole(other) == n &&
         (conv == other || r->readers().sole(conv) == other.first);
}

// Whether signed INT8 entry e is better written as u8 with zero point 128:
// with VNNI a convolution reading it so takes 7-21% less than reading s8,
// which oneDNN compensates (docs/onednn.md); so where a convolution reads e
// as its data and every other reader compensates the zero point too or is
// an add that a convolution planned later takes as its sum post-op (an
// inverted residual block's input).
bool zero_point_128(Plan* r, Entry e) {
  if (!cpu_has_vnni()) return false;
  bool conv = false;
  bool all = r->zero_point_readers(e, [&](const Node* n, Entry read) {
    conv |= is(n, kLinear, kConvolution) && reads_as_data(n, read);
    return reads_as_data(n, read) || summed_into_convolution(r, n, read);
  });
  return all && conv;
}

// Whether float value v, quantized where it is read, is better quantized to
// u8 with zero point 128 than to s8: with VNNI an inner product reading u8
// takes 10-21% less (BERT's shapes), a network's first convolution 13-23%
// less (docs/onednn.md). So where each reader that quantizes v (through any
// entry v is: one s8 copy would serve them all) is a FullyConnected or, v
// in a plain layout (its quantizing reorder then two steps, as fast as to
// s8), an ungrouped convolution, each reading it as its data and taking
// the zero point back. Grouped convolutions were not measured.
bool quantized_at_128(Plan* r, int v) {
  if (!cpu_has_vnni()) return false;
  bool plain = r->value(v).md.get_inner_nblks() == 0;
  for (Entry e : r->entries_of(v)) {
    const std::vector<const Node*>& readers = r->readers().of(e);
    if (!std::all_of(readers.begin(), readers.end(), [&](const Node* n) {
          const Row* row = n ? row_of(n) : nullptr;
          return !row || row->int8 != Int8Role::kQuantizes || keeps_float(n) ||
                 fc_reads_as_data(n, e) ||
                 (plain && is(n, kLinear, kConvolution) && conv_attributes(n).groups == 1 &&
                  reads_as_data(n, e));
        }))
      return false;
  }
  return true;
}

// GELU's output never falls below its minimum (-0.16997, at x = -0.75):
// where FullyConnected layers are its readers it is written u8 from that
// floor, about twice the levels s8 gives the same range. Only GELU: an
// activation without a floor (leaky relu, a scaling) could go below what
// calibration saw, and u8 would clip it there. Returns the floor's
// magnitude, or 0.
float gelu_floor(Plan* r, const Fusion& f, const Range& out) {
  if (!f.has_act || f.act.alg != dnnl::algorithm::eltwise_gelu_erf || f.sum_with >= 0 ||
      !(out.min < 0) || -out.min > out.amax / 2)
    return 0;
  if (!r->zero_point_readers(f.last, fc_reads_as_data)) return 0;
  return std::max(static_cast<float>(-out.min), 0.16997f);
}

}  // namespace

// A requantized output's type and encoding: calibrated (s8, or u8 from 0),
// with a zero point where the rules above give one. GELU's floor becomes a
// whole number of steps, rounded up, and the scale grows (by 0.6% at most)
// to keep the top: nothing clips at either end. A float shift need not stay
// exact: where the grid lies against 0 moves the error by noise only
// (docs/quantization.md), and 0 itself is now exact.
void output_encoding(Plan* r, const Fusion& f, const Range& out, Types* t) {
  t->dst = out.type();
  t->out = {out.scale(), 0};
  if (t->dst == kS8 && zero_point_128(r, f.last)) {
    t->dst = kU8;
    t->out.zp = 128;
  } else if (float floor = gelu_floor(r, f, out)) {
    int zp = static_cast<int>(std::ceil(255 * floor / (out.amax + floor)));
    t->dst = kU8;
    t->out = {static_cast<float>(out.amax / (255 - zp)), zp};
  }
}

bool linear_readers_take_zero_point(Plan* r, Entry e) {
  return cpu_has_vnni() && r->zero_point_readers(e, reads_as_data);
}

std::pair<memory::data_type, Encoding> int8_source(Plan* r, int v, const Range& in) {
  if (r->is_int8(v)) return {r->value(v).md.get_data_type(), r->value(v).enc};
  return {in.type(), Encoding{in.scale(), 0}};
}

// INT8 when the input is INT8 already or calibrated. The output is
// requantized when calibrated, read as INT8 by all its readers and, with a
// residual add, the other operand is INT8 too (it is summed in place), in
// output_encoding's encoding; else it is written in the float type of what
// reads it. A layer not in INT8 computes in the rest type.
Types types(Plan* r, const Node* n, const Fusion& f) {
  Types t;
  int v = r->value_of(input(n, 0));
  Range in = r->range_of(input(n, 0)), out = r->range_of(f.last);
  t.q = r->int8() && !keeps_float(n) && (r->is_int8(v) || in.known());
  t.q_out = t.q && out.known() && r->int8_readers(f.last) &&
            (f.sum_with < 0 || r->is_int8(f.sum_with));
  t.src = r->rest();
  if (t.q) std::tie(t.src, t.src_enc) = int8_source(r, v, in);
  if (t.q && !r->is_int8(v) && t.src == kS8 && quantized_at_128(r, v)) {
    t.src = kU8;
    t.src_enc.zp = 128;
  }
  t.dst = r->float_out(f.last, t.q ? r->dt() : r->rest());
  if (t.q_out) output_encoding(r, f, out, &t);
  // The residual operand sits in dst in its own type and encoding (INT8) or
  // in dst's type (float).
  bool sum_int8 = t.q_out && f.sum_with >= 0;
  t.sum = sum_int8 ? r->value(f.sum_with).md.get_data_type() : t.dst;
  if (sum_int8) t.sum_enc = r->value(f.sum_with).enc;
  return t;
}

}  // namespace mxamp_onednn
