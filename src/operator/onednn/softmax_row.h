// mxamp's softmax over one row (softmax_int8.cc), written once over the
// vector operations of the ISA that includes it: Vec (kLanes floats, with
// GCC's vector operators + - * +=), splat, vmax, vmin, fmadd, fnmadd,
// nearest, times_two_to, load (a row's floats from j, -infinity past its
// end), max_of, sum_of and store_steps (as bytes, the row's end not
// passed), and MXAMP_ISA, its target attribute, which every function here
// carries too. Included inside that ISA's namespace, once per ISA: no
// include guard, and no #include of its own.

// e^x for x <= 0: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor
// series to r^6 (relative error about 2e-7), times 2^n. Below -87, where
// 2^n would leave float's normal range, e^-87 (1.6e-38: 0 in u8 after any
// scale a probability can have).
MXAMP_ISA inline Vec exp_nonpositive(Vec x) {
  x = vmax(x, splat(-87.0f));
  const Vec n = nearest(x * splat(1.44269504f));
  // ln 2 in two parts, the first exact in few bits, so that n * ln2_hi is exact.
  Vec r = fnmadd(n, splat(0.693145751953125f), x);
  r = fnmadd(n, splat(1.428606765330187e-6f), r);
  // Horner's rule, 1/720 down to 1 (written out: a loop over the
  // coefficients stays one at -O2)
  Vec p = fmadd(splat(1.0f / 720), r, splat(1.0f / 120));
  p = fmadd(p, r, splat(1.0f / 24));
  p = fmadd(p, r, splat(1.0f / 6));
  p = fmadd(p, r, splat(0.5f));
  p = fmadd(p, r, splat(1.0f));
  p = fmadd(p, r, splat(1.0f));
  return times_two_to(p, n);
}

// One row; `exps` holds the row's exponentials (cols rounded up to a whole
// vector), computed once.
template <typename T>
MXAMP_ISA void softmax_row(const T* src, uint8_t* dst, int64_t cols, float scale,
                           float most_steps, float* exps) {
  Vec most = splat(-INFINITY);
  for (int64_t j = 0; j < cols; j += kLanes) most = vmax(most, load(src, j, cols));
  const Vec top = splat(max_of(most));
  Vec sum = splat(0);
  for (int64_t j = 0; j < cols; j += kLanes) {
    const Vec e = exp_nonpositive(load(src, j, cols) - top);
    std::memcpy(exps + j, &e, sizeof e);
    sum += e;
  }
  // Each exponential in output steps, capped at the type's saturation, then
  // rounded to the nearest (even) integer as oneDNN's conversion rounds. A
  // probability is never negative: s8's bytes are u8's up to 127.
  const Vec step = splat(1 / (sum_of(sum) * scale)), cap = splat(most_steps);
  for (int64_t j = 0; j < cols; j += kLanes) {
    Vec e;
    std::memcpy(&e, exps + j, sizeof e);
    store_steps(vmin(e * step, cap), dst, j, cols);
  }
}
