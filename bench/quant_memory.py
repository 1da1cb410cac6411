"""Quantization's own cost, side by side: the peak resident memory and the
time of one quantization call, mxamp.quantization against MXNet's own
mxnet.contrib.quantization, on ResNet-50, MobileNet v2 and the BERT-base-sized encoder.

    python bench/quant_memory.py [--models resnet50 mobilenetv2 bert] [--modes naive entropy]
                                 [--layers N] [--rounds N] [--calib-batches N] [--json OUT]

The networks are int8_speed.py's (benchlib.models): ResNet-50 v1 at batch 16,
MobileNet v2 1.0 at batch 32, the encoder at 8 sequences of 128 token ids and
--layers layers (default 12, as int8_speed.py's), each calibrated on
--calib-batches seeded batches of that size. Each measurement runs in a fresh
child process (so no earlier variant's memory hides or adds to it): the
exported float32 model and the calibration batches are loaded, put in the form
each library takes (MXNet: one NDArrayIter), then quantized as int8_speed.py's
rows c/c' and d/e are (benchlib.mxnet_int8: MXNet's quantize_net_v2 with
quantized_dtype='auto' on its MKLDNN backend, no layer excluded;
benchlib.mxamp_int8), and the model runs its first batch. Columns, the median
over --rounds rounds (the order of the two libraries alternates, the models
and modes interleave, so a busy machine slows both alike):

  quant MB   the most resident memory the process gained during the call
             (VmHWM reset first, minus the resident set before)
  +1st MB    the same up to the end of the first batch (what int8_speed.py's
             'peak MB' column shows)
  calib s    the quantization call's time (calibration, graph rewrite), up to
             the end of the work it left MXNet's engine
  cpu s      the same in CPU time of the process (all its threads), which a
             machine other jobs share moves far less than wall-clock

and the ratios mxamp / MXNet (below 1: mxamp uses less), the median over the
rounds of each round's ratio (its two measurements ran back to back). Linux
only (VmHWM).

The default runs all three networks, both modes, 3 rounds: 36 child
processes, roughly 20 minutes on one thread of a 2-core Xeon (estimated: one
round of the 12-layer encoder, both modes and libraries, took 2 min 15 s, its
children gaining up to 2.1 GB; the CNNs' calls add about 3 minutes a round).
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
from benchlib import (ENCODER_LAYERS, MODEL_KEYS, child_result, clear_peak_rss,  # noqa: E402
                      cpu_description, export_model, imported, machine, models, mxamp_int8,
                      mxnet_calib_data, mxnet_int8, peak_rss, provenance)

MODES = ("naive", "entropy")
TOOLS = ("mxamp", "mxnet")
MEASURES = ("quant_mb", "first_mb", "calib_s", "calib_cpu_s")


def child(spec):
    """One measurement in this (fresh) process: prints one JSON line."""
    block = imported(spec["prefix"])
    calib = [mx.nd.array(b) for b in np.load(spec["calib"])]
    # the batches in the form each library takes, made before the measurement
    if spec["tool"] == "mxnet":
        quantize, calib_data = mxnet_int8, mxnet_calib_data(calib)
    else:
        quantize, calib_data = mxamp_int8, calib
    mx.nd.waitall()
    before = psutil.Process().memory_info().rss
    if not clear_peak_rss():
        raise SystemExit("needs Linux (/proc/self/clear_refs)")
    started, cpu = time.perf_counter(), time.process_time()
    quantized = quantize(block, calib_data, spec["mode"])
    mx.nd.waitall()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    quant_mb = (peak_rss() - before) / 2 ** 20
    quantized.hybridize(static_alloc=True, static_shape=True)
    quantized(calib[0]).wait_to_read()
    first_mb = (peak_rss() - before) / 2 ** 20
    print(json.dumps({"quant_mb": quant_mb, "first_mb": first_mb, "calib_s": seconds,
                      "calib_cpu_s": cpu_seconds}))


def ratio(ours, theirs, measure):
    """The median over rounds of mxamp / MXNet, each round's pair measured
    back to back (a load that changes between rounds cancels out)."""
    pairs = [(a[measure], b[measure]) for a, b in zip(ours, theirs)
             if "error" not in a and "error" not in b and b[measure]]
    return f"{statistics.median(a / b for a, b in pairs):.2f}x" if pairs else "-"


def report(results, args):
    print(f"\n{'model':<12}{'mode':<8}{'tool':<7}{'quant MB':>9}{'+1st MB':>9}{'calib s':>9}"
          f"{'cpu s':>9}")
    table = {}
    for key in args.models:
        for mode in args.modes:
            row = {}
            for tool in TOOLS:
                runs = [r for r in results[(key, mode, tool)] if "error" not in r]
                errors = [r["error"] for r in results[(key, mode, tool)] if "error" in r]
                row[tool] = {m: statistics.median(r[m] for r in runs) if runs else None
                             for m in MEASURES}
                row[tool]["rounds"] = [r for r in results[(key, mode, tool)]]
                cells = "".join(f"{row[tool][m]:>9.{p}f}" if row[tool][m] is not None else
                                f"{'-':>9}" for m, p in zip(MEASURES, (0, 0, 1, 1)))
                print(f"{key:<12}{mode:<8}{tool:<7}{cells}"
                      + (f"  failed: {errors[0]}" if errors else ""))
            rounds = results[(key, mode, "mxamp")], results[(key, mode, "mxnet")]
            print(f"{'':<12}{'':<8}{'ratio':<7}"
                  + "".join(f"{ratio(*rounds, m):>9}" for m in MEASURES))
            table[f"{key}/{mode}"] = row
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(MODEL_KEYS), choices=MODEL_KEYS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--layers", type=int, default=ENCODER_LAYERS,
                        help=f"the encoder's layers (bert; default {ENCODER_LAYERS})")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each (default 3)")
    parser.add_argument("--calib-batches", type=int, default=4,
                        help="calibration batches of the network's batch size (default 4)")
    parser.add_argument("--json", help="also write every measurement to this JSON file")
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if min(args.layers, args.rounds, args.calib_batches) < 1:
        parser.error("--layers, --rounds and --calib-batches must be at least 1, got "
                     f"{args.layers}, {args.rounds} and {args.calib_batches}")
    run = provenance("quant_memory")
    print(f"CPU: {cpu_description()}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
          f"{args.calib_batches} calibration batches, median of {args.rounds} rounds")
    networks = models(args.layers)
    chosen = {key: networks[key] for key in args.models}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        specs = []
        for key, model in chosen.items():
            print(f"   {key}: {model.title}, batch {model.batch}", flush=True)
            prefix = export_model(model, key, tmp, calibrate_batchnorm=True)
            calib = Path(tmp) / f"{key}-calib.npy"
            np.save(calib, np.stack([model.make_input(model.batch, seed=1 + i).asnumpy()
                                     for i in range(args.calib_batches)]))
            specs += [{"model": key, "mode": mode, "prefix": prefix, "calib": str(calib)}
                      for mode in args.modes]
        for n in range(args.rounds):
            for spec in specs:
                order = TOOLS if n % 2 == 0 else TOOLS[::-1]
                for tool in order:
                    result = child_result(__file__, {**spec, "tool": tool})
                    results.setdefault((spec["model"], spec["mode"], tool), []).append(result)
                    print(f"   round {n + 1}: {spec['model']} {spec['mode']} {tool}: {result}",
                          flush=True)
    table = report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"run": run, "machine": machine(), "calib_batches": args.calib_batches,
             "rounds": args.rounds,
             "models": {key: {"title": m.title, "batch": m.batch} for key, m in chosen.items()},
             "rows": table}, indent=1))


if __name__ == "__main__":
    main()
