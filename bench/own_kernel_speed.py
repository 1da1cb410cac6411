"""mxamp's own kernels against oneDNN's, each on the network it is for: the
INT8 depthwise convolution on MobileNet v2 (where oneDNN runs AVX-512 with
VNNI), the INT8 softmax on the BERT encoder (from float32 scores where
oneDNN's INT8 softmax is its reference kernel: AVX2, or
ONEDNN_MAX_CPU_ISA=AVX2 above it; from bfloat16 scores on AVX-512), GELU's
byte table on the BERT encoder (AVX-512 with VBMI).

    python bench/own_kernel_speed.py [--kernel depthwise|softmax|gelu] [--batch N]
                                     [--runs 11] [--warmup 2] [--burst 10] [--calls 20]

The network (random weights, bench/benchlib.py; the encoder with 2 layers)
quantized once by mxamp (naive, 2 calibration batches) and exported, then
loaded twice: planned with MXAMP_ONEDNN_<KERNEL>=onednn (oneDNN's kernels
only) and as mxamp plans it, with its own kernel where it applies
(docs/onednn.md, "What a region does"). Prints the CPU, whether the two give
the same output, each one's median call (the calls interleaved round by
round, `--burst` calls each per round, wall-clock), and the steps the kernel
stands in for, per shape, each at its fastest of `--calls` calls, from
oneDNN's verbose lines (mxamp's kernels log their calls alike): the
depthwise convolutions; softmax and the reorders of float32 to INT8 (the
probabilities' requantization where softmax writes float32); the first
feed-forward layer and GELU's table.
"""
import argparse
import os
import re
import tempfile

import numpy as np

import benchlib as bl


def depthwise_step(kind, types, problem):
    """A depthwise convolution's row and subtotal ('stride N'); None for
    other primitives."""
    size = bl.problem_sizes(problem)
    if kind != "convolution" or size.get("g", 1) == 1:
        return None
    return f"{size['ih']}x{size['iw']}x{size['g']} stride {size['sh']}", f"stride {size['sh']}"


def softmax_step(kind, types, problem):
    """softmax's row, or a reorder's of float32 to INT8; None for others."""
    if kind == "softmax" or (kind == "reorder" and types in ("f32->u8", "f32->s8")):
        return f"{kind} {types} {problem}", kind
    return None


def gelu_step(kind, types, problem):
    """The table's row, or that of an inner product GELU reads (the first
    feed-forward layer, 3072 outputs); None for others."""
    if kind == "eltwise" or (kind == "inner_product" and
                             bl.problem_sizes(problem).get("oc") == 3072):
        return f"{kind} {types} {problem}", kind
    return None


# kernel: (network, its batch by default, the steps it stands in for)
KERNELS = {"depthwise": ("mobilenetv2", 32, depthwise_step),
           "softmax": ("bert", 1, softmax_step),
           "gelu": ("bert", 1, gelu_step)}


def planned(prefix, x, choice, kernel):
    """The quantized model at `prefix`, loaded as served (static memory, so
    its region plans once: on its first call) and planned with `choice`
    ("onednn", or "mxamp" as planned) for `kernel`; and its output."""
    variable = f"MXAMP_ONEDNN_{kernel.upper()}"
    if choice == "onednn":
        os.environ[variable] = "onednn"
    try:
        block = bl.imported(prefix)
        block.hybridize(static_alloc=True, static_shape=True)
        return block, block(x).asnumpy()
    finally:
        os.environ.pop(variable, None)


def steps(run, calls, step):
    """{row: [implementation, calls, ms, subtotal]}: a call's steps that
    `step` names a row, each at its fastest of `calls` verbose calls, summed
    per row."""
    rows = {}
    for (kind, impl, types, problem, _), (ms, _) in bl.fastest_primitives(
            bl.verbose_runs(run, calls)).items():
        named = step(kind, types, problem)
        if named:
            row = rows.setdefault(named[0], [impl, 0, 0.0, named[1]])
            row[1] += 1
            row[2] += ms
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", choices=sorted(KERNELS), default="depthwise")
    parser.add_argument("--batch", type=int, help="default: 32 for depthwise, 1 for softmax and gelu")
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20, help="verbose calls per plan")
    args = parser.parse_args()
    network, batch, step = KERNELS[args.kernel]
    batch = args.batch or batch
    model = bl.models(2)[network]
    x = model.make_input(batch, seed=99)
    with tempfile.TemporaryDirectory() as work:
        prefix = bl.export_model(model, network, work, calibrate_batchnorm=True)
        calib = [model.make_input(batch, seed=1 + i) for i in range(2)]
        quantized = bl.mxamp_int8(bl.imported(prefix), calib)
        quantized(x)
        quantized.export(f"{work}/int8")
        built = {choice: planned(f"{work}/int8", x, choice, args.kernel)
                 for choice in ("onednn", "mxamp")}
    print(f"CPU: {bl.cpu_description()}, {bl.THREADS} threads")
    print(f"{model.title} INT8 (mxamp, naive), batch {batch}, {args.kernel}")
    out, own = built["onednn"][1], built["mxamp"][1]
    same = np.array_equal(out, own)
    print("outputs: " + ("the same, bit for bit" if same else
                         f"differ: relative L2 {bl.relative_error(own, out):.1e}"))
    variants = [bl.Variant(choice, run=lambda b=block: b(x).wait_to_read())
                for choice, (block, _) in built.items()]
    bl.time_interleaved(variants, args.warmup, args.runs, burst=args.burst)
    a, b = (bl.median(v) * 1e3 for v in variants)
    print(f"call (median of {args.runs} rounds, bursts of {args.burst}, wall-clock): "
          f"oneDNN's kernels {a:.2f} ms, with mxamp's {b:.2f} ms: {a / b:.2f}x")
    rows = {choice: steps(lambda b=block: b(x).wait_to_read(), args.calls, step)
            for choice, (block, _) in built.items()}
    if any(impl.startswith("mxamp") for impl, _, _, _ in rows["onednn"].values()):
        raise SystemExit("the oneDNN plan ran mxamp's kernel: its region planned again")
    print(f"the steps of a call mxamp's {args.kernel} kernel stands in for, each at its "
          f"fastest of {args.calls} calls, summed per row (ms):")
    print(f"{'step':<40} {'calls':>5}  {'oneDNN':<30} {'ms':>7}   {'with mxamp':<30} {'ms':>7}")
    totals = {}

    def cells(row):  # implementation and ms of one plan's row, blank where it has none
        return f"{row[0]:<30} {row[2]:7.3f}" if row else f"{'':<30} {'':>7}"

    def by_size(name):  # natural order: 7x7 before 14x14 before 112x112
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

    for name in sorted(set(rows["onednn"]) | set(rows["mxamp"]), key=by_size):
        theirs, ours = rows["onednn"].get(name), rows["mxamp"].get(name)
        ratio = f"  {theirs[2] / ours[2]:.2f}x" if theirs and ours else ""
        print(f"{name:<40} {(theirs or ours)[1]:>5}  {cells(theirs)}   {cells(ours)}{ratio}")
        for plan, row in enumerate((theirs, ours)):
            for key in ("all", (theirs or ours)[3]):
                totals.setdefault(key, [0.0, 0.0])[plan] += row[2] if row else 0.0
    for group, (t1, t2) in sorted(totals.items()):
        ratio = f"  {t1 / t2:.2f}x" if t1 and t2 else ""
        print(f"{group:<40} {'':>5}  {'':<30} {t1:7.3f}   {'':<30} {t2:7.3f}{ratio}")


if __name__ == "__main__":
    main()
