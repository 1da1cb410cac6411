"""mxamp's own INT8 depthwise kernel against oneDNN's, on MobileNet v2.

    python bench/depthwise_speed.py [--batch 32] [--runs 11] [--warmup 2]
                                    [--burst 10] [--calls 20]

MobileNet v2 (random weights, BatchNorm statistics set, bench/benchlib.py)
quantized once by mxamp (naive, 2 calibration batches) and exported, then
loaded twice: planned with MXAMP_ONEDNN_DEPTHWISE=onednn (every convolution
on oneDNN) and with mxamp's kernel for the depthwise layers it takes
(docs/onednn.md, "What a region does"). Prints the CPU, whether the two give
the same output, each one's median call (the calls interleaved round by
round, `--burst` calls each per round, wall-clock), and per depthwise layer
the fastest of `--calls` calls of each kernel, from oneDNN's verbose lines
(mxamp's kernel logs its calls alike).
"""
import argparse
import os
import tempfile

import numpy as np

import benchlib as bl

CHOICE = "MXAMP_ONEDNN_DEPTHWISE"  # "onednn": no kernel of mxamp's own


def planned(prefix, x, kernel):
    """The quantized model at `prefix`, loaded as served (static memory, so
    its region plans once: on its first call) and planned with `kernel`'s
    depthwise convolutions; and its output."""
    if kernel == "onednn":
        os.environ[CHOICE] = "onednn"
    try:
        block = bl.imported(prefix)
        block.hybridize(static_alloc=True, static_shape=True)
        return block, block(x).asnumpy()
    finally:
        os.environ.pop(CHOICE, None)


def depthwise_layers(run, calls):
    """{problem: [implementation, calls, ms]}: a call's depthwise
    convolutions of each shape (a layer, or layers alike; in a batch run in
    chunks, once per chunk), each at its fastest of `calls` verbose calls,
    and their time summed."""
    layers = {}
    for (kind, impl, _, problem, _), (ms, _) in bl.fastest_primitives(
            bl.verbose_runs(run, calls)).items():
        if kind == "convolution" and bl.problem_sizes(problem).get("g", 1) > 1:
            layer = layers.setdefault(problem, [impl, 0, 0.0])
            layer[1] += 1
            layer[2] += ms
    return layers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20, help="verbose calls per kernel")
    args = parser.parse_args()
    model = bl.models(2)["mobilenetv2"]
    x = model.make_input(args.batch, seed=99)
    with tempfile.TemporaryDirectory() as work:
        prefix = bl.export_model(model, "mobilenetv2", work, calibrate_batchnorm=True)
        calib = [model.make_input(args.batch, seed=1 + i) for i in range(2)]
        quantized = bl.mxamp_int8(bl.imported(prefix), calib)
        quantized(x)
        quantized.export(f"{work}/int8")
        built = {kernel: planned(f"{work}/int8", x, kernel) for kernel in ("onednn", "mxamp")}
    print(f"CPU: {bl.cpu_description()}, {bl.THREADS} threads")
    print(f"MobileNet v2 INT8 (mxamp, naive), batch {args.batch}")
    out, own = built["onednn"][1], built["mxamp"][1]
    same = np.array_equal(out, own)
    print("outputs: " + ("the same, bit for bit" if same else
                         f"differ: relative L2 {bl.relative_error(own, out):.1e}"))
    variants = [bl.Variant(kernel, run=lambda b=block: b(x).wait_to_read())
                for kernel, (block, _) in built.items()]
    bl.time_interleaved(variants, args.warmup, args.runs, burst=args.burst)
    a, b = (bl.median(v) * 1e3 for v in variants)
    print(f"call (median of {args.runs} rounds, bursts of {args.burst}, wall-clock): "
          f"oneDNN's kernels {a:.2f} ms, with mxamp's {b:.2f} ms: {a / b:.2f}x")
    layers = {kernel: depthwise_layers(lambda b=block: b(x).wait_to_read(), args.calls)
              for kernel, (block, _) in built.items()}
    print(f"depthwise layers of a call, each primitive call at its fastest of {args.calls}, "
          "summed per shape (ms):")
    print(f"{'layer':<24} {'calls':>5}  {'oneDNN':<30} {'ms':>7}   {'with mxamp':<30} {'ms':>7}"
          "  ratio")
    totals = {}
    if any(impl.startswith("mxamp") for impl, _, _ in layers["onednn"].values()):
        raise SystemExit("the oneDNN plan ran mxamp's kernel: its region planned again")
    for problem in sorted(layers["onednn"], key=lambda p: -bl.problem_sizes(p)["ih"]):
        size = bl.problem_sizes(problem)
        name = f"{size['ih']}x{size['iw']}x{size['g']} stride {size['sh']}"
        (i1, n, t1), (i2, _, t2) = layers["onednn"][problem], layers["mxamp"][problem]
        print(f"{name:<24} {n:>5}  {i1:<30} {t1:7.3f}   {i2:<30} {t2:7.3f}  {t1 / t2:.2f}x")
        for group in ("all", f"stride {size['sh']}"):
            sums = totals.setdefault(group, [0, 0.0, 0.0])
            sums[0] += n
            sums[1] += t1
            sums[2] += t2
    for group, (n, t1, t2) in sorted(totals.items()):
        print(f"{group:<24} {n:>5}  {'':<30} {t1:7.3f}   {'':<30} {t2:7.3f}  {t1 / t2:.2f}x")


if __name__ == "__main__":
    main()
