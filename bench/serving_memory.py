"""Serving memory, side by side: how much resident memory a server process
gains to load and run each of mxamp's backend models, float32 against the
bfloat16 and INT8 ones, on ResNet-50, MobileNet v2 and the BERT-base-sized
encoder.

    python bench/serving_memory.py [--models resnet50 mobilenetv2 bert] [--layers N]
                                   [--calls N] [--json OUT]

The networks are the other benches' (benchlib.models), at their bench batch,
with random weights and BatchNorm statistics set on one batch
(benchlib.export_model). Rows, each built in this process from the exported
float32 model, run once and exported:

  mxnet f32     the float32 model as exported (MXNet's own kernels)
  backend f32   apply_backend_block(compute="float32")
  backend bf16  convert_hybrid_block(bfloat16), then the backend
                (benchlib.backend_block; on a CPU without bfloat16 kernels
                its regions compute float32, and the row says so)
  backend int8  quantize_net_v2(calib_mode="naive") on one batch

Each row is then served by a fresh child process, as a server would: import
mxnet and mxamp, load the backend's library, then (measured from here) load the
export with SymbolBlock.imports, hybridize it with static_alloc and run
--calls batches. Columns:

  params MB   the export's parameter file
  load MB     the resident memory the process gained by the end of the load
  peak MB     the most it held up to the end of the last call (VmHWM reset
              before the load, minus the resident set before)
  held MB     what it still held after the last call
  vs f32      peak MB against the backend f32 row's

Memory is no timing: a busy machine moves it little, so each row is served
once. Linux only (VmHWM).
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
from benchlib import (ENCODER_LAYERS, MODEL_KEYS, backend_block, child_result,  # noqa: E402
                      clear_peak_rss, cpu_description, export_model, forward, imported,
                      machine, models, mxamp_int8, peak_rss, provenance)

import mxamp  # noqa: E402
import mxamp.backends  # noqa: E402

ROWS = ("mxnet f32", "backend f32", "backend bf16", "backend int8")
MB = 2 ** 20


def build(row, source, x):
    """Row `row` of the float32 block `source` (run once on x)."""
    if row == "mxnet f32":
        return source
    if row == "backend f32":
        return backend_block(source, x, compute="float32")
    if row == "backend bf16":
        return backend_block(source, x)
    return mxamp_int8(source, [x], "naive")


def child(spec):
    """Serves one export in this (fresh) process: prints one JSON line."""
    mxamp.backends.get("onednn")  # the library a server loads before any model
    x = mx.nd.array(np.load(spec["input"]))
    mx.nd.waitall()
    before = psutil.Process().memory_info().rss
    if not clear_peak_rss():
        raise SystemExit("needs Linux (/proc/self/clear_refs)")
    block = imported(spec["prefix"])
    block.hybridize(static_alloc=True, static_shape=True)
    mx.nd.waitall()
    load = psutil.Process().memory_info().rss - before
    run = forward(block, x)
    for _ in range(spec["calls"]):
        run()
    print(json.dumps({"load_mb": load / MB, "peak_mb": (peak_rss() - before) / MB,
                      "held_mb": (psutil.Process().memory_info().rss - before) / MB}))


def exported(source, row, x, prefix):
    """Builds row `row` of the exported float32 model `source` (a prefix),
    exports it at `prefix`; its spec for child()."""
    block = build(row, imported(source), x)
    block(x).wait_to_read()  # an export takes the parameters of a block that has run
    block.export(prefix)
    return {"prefix": prefix, "params_mb": Path(f"{prefix}-0000.params").stat().st_size / MB}


def report(results, keys):
    print(f"\n{'model':<13}{'row':<14}{'params MB':>10}{'load MB':>9}{'peak MB':>9}"
          f"{'held MB':>9}{'vs f32':>8}")
    for key in keys:
        base = results[key].get("backend f32", {}).get("peak_mb")
        for row in ROWS:
            r = results[key][row]
            if "error" in r:
                print(f"{key:<13}{row:<14}  failed: {r['error']}")
                continue
            ratio = f"{r['peak_mb'] / base:.2f}x" if base else "-"
            print(f"{key:<13}{row:<14}{r['params_mb']:>10.1f}{r['load_mb']:>9.1f}"
                  f"{r['peak_mb']:>9.1f}{r['held_mb']:>9.1f}{ratio:>8}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(MODEL_KEYS), choices=MODEL_KEYS)
    parser.add_argument("--layers", type=int, default=ENCODER_LAYERS,
                        help=f"the encoder's layers (bert; default {ENCODER_LAYERS})")
    parser.add_argument("--calls", type=int, default=3, help="batches served (default 3)")
    parser.add_argument("--json", help="also write every measurement to this JSON file")
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if min(args.layers, args.calls) < 1:
        parser.error(f"--layers and --calls must be at least 1, got {args.layers} and "
                     f"{args.calls}")
    run = provenance("serving_memory")
    print(f"CPU: {cpu_description()}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
          f"{args.calls} calls")
    networks = models(args.layers)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            model = networks[key]
            print(f"   {key}: {model.title}, batch {model.batch}", flush=True)
            source = export_model(model, key, tmp, calibrate_batchnorm=True)
            x, data = model.make_input(model.batch), Path(tmp) / f"{key}-input.npy"
            np.save(data, x.asnumpy())
            results[key] = {}
            for row in ROWS:
                try:
                    spec = exported(source, row, x, f"{source}-{row.replace(' ', '-')}")
                except Exception as err:  # the row shows the failure, the others go on
                    results[key][row] = {"error": f"{type(err).__name__}: {err}"}
                    continue
                served = child_result(__file__, {"prefix": spec["prefix"], "calls": args.calls,
                                                 "input": str(data)})
                results[key][row] = {**spec, **served}
                print(f"   {key} {row}: {results[key][row]}", flush=True)
    report(results, args.models)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"run": run, "machine": machine(), "calls": args.calls,
             "models": {key: {"title": networks[key].title, "batch": networks[key].batch}
                        for key in args.models},
             "rows": results}, indent=1))


if __name__ == "__main__":
    main()
