"""bfloat16 inference speed, side by side: MXNet float32, the reference AMP,
mxamp, mxamp with its oneDNN 3 backend, and OpenVINO / ONNX Runtime as anchors.

    python bench/bf16_speed.py [--models resnet50 mobilenetv2 bert] [--runs N]
                               [--batches N [N ...]]
                               [--warmup N] [--layers N] [--quick] [--no-anchor]
                               [--anchor-python PATH] [--setup-anchor]
                               [--clock wall|cpu] [--burst N] [--json OUT]

Variants, timed on the same input in one run, interleaved round by round (the
order rotates each round, so drift on a shared machine hits all of them):

  a fp32         the exported float32 model as a hybridized SymbolBlock
  b fp32+mkldnn  the same with MXNet's own oneDNN fusion (backend='MKLDNN')
  c ref bf16     mxnet.contrib.amp.convert_hybrid_block(..., 'bfloat16')
  d mxamp bf16   mxamp.convert_hybrid_block(..., 'bfloat16'), plain operators
  e mxamp+onednn d, then mxamp.gluon.apply_backend_block
  f openvino     the model exported by mx.onnx.export_model, OpenVINO with
                 INFERENCE_PRECISION_HINT=bf16 (anchor, own venv and process)
  g ort fp32     the same ONNX file in ONNX Runtime, float32 (anchor)
  h onednn3 fp32 the float32 model through mxamp's backend computing in
                 float32: what oneDNN 3's fused chains give without bfloat16
  i onednn3 bf16 e with compute='bfloat16': the regions in bfloat16 even
                 where this CPU's bfloat16 dot products are slower (where
                 they are not, e is this)

Each network runs at its bench batch, or at each of --batches (e.g.
`--batches 1 32`: batch 1 too, where the default path must not lose to
float32 either). Every MXNet variant is timed as served: exported once
built, then loaded with static_alloc/static_shape, run and timed in a serving
child process that builds nothing (benchlib.served: a process that builds
keeps OpenMP teams that slow batch 1 on 2 threads). Throughput is the median
over --runs timed rounds after --warmup rounds, each the time per call of
--burst calls back to back (default 10, warm, as in int8_speed.py: with the
anchors the variants run in three processes, and a process's idle threads
spin for milliseconds after its call; "spread": slowest minus fastest round,
against the median). Weights are random (no downloads); "rel err" is the
relative L2 error of each variant's served output against variant a's on the
same input. After the
table come the per-operator time of variants e and h (MXNet's profiler:
regions against operators left on MXNet) and the oneDNN 3 primitives inside
their regions (oneDNN's verbose mode), then the digits check: a small CNN trained
here in float32 on scikit-learn's digits, converted with the backend, top-1
agreement with float32 on held-out digits.

The anchors need a separate venv (see bench/README.md; --setup-anchor makes
it) and `onnx<1.16` in this environment for MXNet 1.9.1's ONNX exporter.
One failing variant prints its error in its row; the rest go on.
"""
import os

# Before MXNet starts its OpenMP pool: the machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "2")

import dataclasses  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

import mxamp  # noqa: E402
import mxamp.backends  # noqa: E402
from benchlib import (MEMORY_HEADER, MODEL_KEYS, THREADS,  # noqa: E402
                      anchor_skip_reason, AnchorProcess, backend_block, backend_computes,
                      backend_summary, cast_counts, cpu_description, describe, export_model,
                      export_onnx, fill_anchor_variants, fmt, fp32_peak, freed, imported, machine,
                      median, memory_columns, memory_row, models, network_flops, parse_arguments,
                      peak_fraction, peak_ratio, percent, prepare, print_breakdown, provenance,
                      served, serving_process, time_interleaved, timing_header, timing_settings,
                      Variant)
from mxamp.verify import relative_error  # noqa: E402
from mxamp.dtypes import as_numpy  # noqa: E402

FP32 = ("a fp32", "b fp32+mkldnn")
REFERENCE = "c ref bf16"
BACKEND = "e mxamp+onednn"
ONEDNN_FP32 = "h onednn3 fp32"
FORCED_BF16 = "i onednn3 bf16"
PROFILED = (BACKEND, ONEDNN_FP32)  # their breakdowns run in this process
ANCHORS = {"f openvino bf16": "openvino-bf16", "g ort fp32": "onnxruntime-fp32"}


# ---------------------------------------------------------------- variants

def make_variants(prefix, x):
    """Builds variants a-e and h from the exported float32 model; a failure
    is kept in its variant's error."""
    def plain():
        block = imported(prefix)
        block.hybridize(static_alloc=True, static_shape=True)
        return block, None, "-"

    def mkldnn_fused():
        block = imported(prefix)
        block.hybridize(backend="MKLDNN", static_alloc=True, static_shape=True)
        return block, None, "-"

    def converted(convert):
        source = imported(prefix)
        source.hybridize()
        source(x)
        started = time.perf_counter()
        block = convert(source)
        seconds = time.perf_counter() - started
        block.hybridize(static_alloc=True, static_shape=True)
        return block, seconds, cast_counts(block)

    def reference():
        from mxnet.contrib import amp
        return converted(lambda b: amp.convert_hybrid_block(b, target_dtype="bfloat16",
                                                            ctx=mx.cpu()))

    def mxamp_plain():
        return converted(lambda b: mxamp.convert_hybrid_block(b, target_dtype="bfloat16"))

    def mxamp_backend(compute):
        block, seconds, _ = converted(lambda source: backend_block(source, x, compute))
        return block, seconds, backend_summary(block)

    builders = {"a fp32": plain, "b fp32+mkldnn": mkldnn_fused, REFERENCE: reference,
                "d mxamp bf16": mxamp_plain,
                BACKEND: lambda: mxamp_backend(None),
                ONEDNN_FP32: lambda: mxamp_backend("float32"),
                FORCED_BF16: lambda: mxamp_backend("bfloat16")}
    return [prepare(Variant(name), build, x) for name, build in builders.items()]


def anchor_variants(anchor, prefix, x, workdir, skip_reason):
    """Variants f and g: export to ONNX here, run in the anchor process on
    workdir/input.npy (bench_model's)."""
    variants = {runner: Variant(name, casts="-") for name, runner in ANCHORS.items()}
    if skip_reason is None:
        try:
            onnx_path = workdir / "model.onnx"
            export_s = export_onnx(prefix, x.shape, onnx_path)
            loaded = anchor.ask(cmd="load", onnx=str(onnx_path),
                                input=str(workdir / "input.npy"), threads=THREADS,
                                runtimes=list(variants), out_dir=str(workdir))
            fill_anchor_variants(variants, anchor, loaded, export_s)
        except Exception as err:
            skip_reason = describe(err)
    for variant in variants.values():
        if skip_reason is not None:
            variant.error = skip_reason
    return list(variants.values())


# ---------------------------------------------------------------- table

def report(key, model, variants, work):
    """The table of one network and batch; `work`: its FLOPs and the float32
    peak (GMAC/s) the "of peak" column is a share of (benchlib.peak_fraction)."""
    by_name = {v.name: v for v in variants}
    fp32_times = [median(by_name[n]) for n in FP32 if median(by_name[n])]
    best_fp32 = min(fp32_times) if fp32_times else None
    reference = median(by_name[REFERENCE])
    base = by_name["a fp32"].output
    print(f"\n== {key}: {model.title}, batch {model.batch}, {THREADS} threads")
    header = (f"{'variant':<16}{'ms/batch':>10}{'items/s':>9}{'vs fp32':>9}{'limit':>7}"
              f"{'of peak':>8}{'vs ref':>8}{'spread':>7}{'conv s':>8}{'1st s':>7}"
              f"{MEMORY_HEADER}{'rel err':>9}  casts / notes")
    print(header)
    print("-" * len(header))
    rows = []
    for v in variants:
        t = median(v)
        if t is None:
            print(f"{v.name:<16}FAILED  {v.error}")
            rows.append({"variant": v.name, "error": v.error})
            continue
        err = relative_error(v.output, base) if base is not None and v.output is not None \
            and v.output.shape == base.shape else None
        # the default path's row computes in what the backend chooses here
        ratio = peak_ratio(v.name, backend_computes() if v.name == BACKEND else None)
        row = {"variant": v.name, "ms": 1000 * t, "items_s": model.batch / t,
               "vs_best_fp32": best_fp32 / t if best_fp32 else None,
               "vs_ref": reference / t if reference else None, "peak_ratio": ratio,
               "peak_fraction": peak_fraction(work["flops"], t, ratio, work["fp32_gmacs"]),
               "convert_s": v.convert_s, "first_s": v.first_s, "rel_err": err,
               "notes": v.casts, "spread_ms": 1000 * (max(v.times) - min(v.times)),
               **memory_row(v)}
        rows.append(row)
        print(f"{v.name:<16}{fmt(row['ms'], '.1f', 10)}{fmt(row['items_s'], '.1f', 9)}"
              f"{fmt(row['vs_best_fp32'], '.2f', 9, 'x')}{fmt(row['peak_ratio'], '.1f', 7, 'x')}"
              f"{percent(row['peak_fraction'])}{fmt(row['vs_ref'], '.2f', 8, 'x')}"
              f"{fmt(100 * (max(v.times) - min(v.times)) / t, '.0f', 7, '%')}"
              f"{fmt(v.convert_s, '.1f', 8)}{fmt(v.first_s, '.2f', 7)}{memory_columns(row)}"
              f"{fmt(err, '.1e', 9)}  {v.casts}")
    return rows


# ---------------------------------------------------------------- digits

def digits_check(epochs, seed=0):
    """Trains a small CNN on scikit-learn's digits in float32, converts it with
    the backend; returns top-1 agreement and accuracies on held-out digits."""
    from sklearn.datasets import load_digits

    onednn = mxamp.backends.get("onednn")
    digits = load_digits()
    images = (digits.images[:, None] / 16.0).astype(np.float32)
    order = np.random.RandomState(seed).permutation(len(images))
    test, train = order[:500], order[500:]
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(64, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.MaxPool2D(2), nn.Conv2D(64, 3, padding=1), nn.Activation("relu"),
            nn.Flatten(), nn.Dense(128, activation="relu"), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-3})
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    x_train, y_train = mx.nd.array(images[train]), mx.nd.array(digits.target[train])
    for _ in range(epochs):
        for start in range(0, len(train), 64):
            xb, yb = x_train[start:start + 64], y_train[start:start + 64]
            with autograd.record():
                value = loss(net(xb), yb)
            value.backward()
            trainer.step(xb.shape[0])
    x_test, y_test = mx.nd.array(images[test]), digits.target[test]
    fp32 = net(x_test).asnumpy()
    fast = backend_block(net, x_test)
    bf16 = as_numpy(fast(x_test)).astype(np.float32)
    return {"agreement": float((fp32.argmax(1) == bf16.argmax(1)).mean()),
            "fp32_accuracy": float((fp32.argmax(1) == y_test).mean()),
            "bf16_accuracy": float((bf16.argmax(1) == y_test).mean()),
            "logit_rel_err": relative_error(bf16, fp32),
            "regions": len(onednn.regions(fast._cached_graph[1]))}


# ---------------------------------------------------------------- main

def bench_model(key, model, args, anchor, anchor_skip, server, fp32_gmacs):
    """Every MXNet-side variant is timed as served (benchlib.served), the
    anchors in their own process."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prefix = export_model(model, key, workdir)
        x = model.make_input(model.batch)
        np.save(workdir / "input.npy", as_numpy(x))
        variants = [served(v, server, workdir) for v in make_variants(prefix, x)]
        for variant in variants:  # here, only the rows profiled or timed here stay built
            if variant.served is not None and (variant.name not in PROFILED or args.no_profile):
                freed(variant)
        variants += anchor_variants(anchor, prefix, x, workdir, anchor_skip)
        work = {"flops": network_flops(prefix, x.shape), "fp32_gmacs": fp32_gmacs}
    variants.sort(key=lambda v: v.name)
    try:
        time_interleaved(variants, args.warmup, args.runs, args.clock, args.burst)
    finally:
        server.ask(cmd="keep", names=[])
    result = {"model": model.title, "batch": model.batch, **work,
              "rows": report(key, model, variants, work)}
    result["breakdown"] = {}
    for v in variants:
        if v.name in PROFILED and v.run is not None and not args.no_profile:
            try:
                result["breakdown"][v.name] = print_breakdown(v)
            except Exception as err:
                print(f"   breakdown of {v.name} failed: {describe(err)}")
    return result


def main():
    args = parse_arguments(
        __doc__, MODEL_KEYS, "a short run: fewer rounds, a 2-layer encoder, fewer digits epochs",
        "skip the digits check",
        batches_help="batch sizes to time, each network at each (default: each network's own "
                     "batch; e.g. --batches 1 32)", burst=10)

    note = "" if mxamp.cpu.features("onednn").bf16 else \
        " -- no bfloat16 instructions: bf16 rows measure fallbacks, not bf16 speed"
    print(f"CPU: {cpu_description(note)}")
    print(f"mxnet {mx.__version__}, OMP_NUM_THREADS={THREADS}, {timing_header(args)}")
    anchor_skip = anchor_skip_reason(args.anchor_python, not args.no_anchor)
    anchor = AnchorProcess(args.anchor_python) if anchor_skip is None else None
    server = serving_process()
    results = {"run": provenance("bf16_speed"), "machine": machine(), **timing_settings(args),
               "fp32_peak": fp32_peak()}
    try:
        for key in args.models:
            model = models(args.layers)[key]
            for batch in args.batches or [model.batch]:
                name = key if args.batches is None else f"{key} b{batch}"
                results[name] = bench_model(key, dataclasses.replace(model, batch=batch), args,
                                            anchor, anchor_skip, server,
                                            results["fp32_peak"]["gmacs"])
    finally:
        server.close()
        if anchor is not None:
            anchor.close()
    if not args.no_digits:
        try:
            digits = digits_check(epochs=5 if args.quick else 15)
            results["digits"] = digits
            print(f"\n== digits CNN (float32-trained), bf16 with the backend: top-1 agreement "
                  f"{100 * digits['agreement']:.1f}% (target >= 99%), accuracy fp32 "
                  f"{100 * digits['fp32_accuracy']:.1f}% / bf16 "
                  f"{100 * digits['bf16_accuracy']:.1f}%, logit rel err "
                  f"{digits['logit_rel_err']:.1e}, {digits['regions']} regions"
                  + ("" if digits["regions"] else " (nothing ran in bfloat16 on this CPU)"))
        except Exception as err:
            print(f"\n== digits check FAILED: {describe(err)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
