"""INT8 inference speed and accuracy, side by side: MXNet float32, MXNet's own
INT8, mxamp.quantization on the oneDNN 3 backend, and OpenVINO (NNCF) / ONNX
Runtime INT8 as outside anchors.

    python bench/int8_speed.py [--models resnet50 mobilenetv2 bert] [--quick]
                               [--batches N ...] [--runs N] [--warmup N] [--layers N] [--calib-batches N]
                               [--no-anchor] [--no-profile] [--no-digits]
                               [--anchor-python PATH] [--setup-anchor]
                               [--clock wall|cpu] [--burst N] [--json OUT]

Variants, timed on the same input in one run. a and c stay built throughout;
every other variant is built, timed interleaved round by round with a and c
(the order rotates each round, so drift on a shared machine hits them alike;
--burst N: N calls back to back per variant per round, warm, instead of one
after another model's) and freed before the next is built, so memory holds
three models at a time in this process; the serving child also keeps the
INT8 rows of mxamp and MXNet, timed again in OpenVINO's rounds (ONNX
Runtime gets rounds of its own). Every variant but the anchors is timed as served:
exported once built, then loaded, run and timed by a serving child process
(benchlib.py --serve) that builds nothing (served(): a process that
builds keeps OpenMP teams that slow batch 1 on 2 threads). --burst is 10 by
default here: the variants run in up to three processes, and a process's
idle threads spin for milliseconds after its call (libgomp's, ONNX Runtime's),
which at --burst 1 takes the cores from the next process's first call:

  a mxnet fp32          the exported float32 model as a hybridized SymbolBlock
  b mxnet fp32 fused    the same after optimize_for(backend='MKLDNN')
  c mxnet int8          mxnet.contrib.quantization.quantize_net_v2 (MKLDNN
                        backend, calib_mode='naive', quantized_dtype='auto')
  c' mxnet int8 entropy the same with calib_mode='entropy'
  d mxamp int8 naive    mxamp.quantization.quantize_net_v2(net, calib_data=batches,
                        calib_mode='naive'): the oneDNN 3 backend in INT8
  e mxamp int8 entropy  the same with calib_mode='entropy'
  f mxamp fp32          the float32 model through the backend computing float32
  g mxamp bf16          mxamp.convert_hybrid_block + apply_backend_block, only
                        where the CPU has avx512_bf16 / amx_bf16
  h openvino int8       the model exported by mx.onnx.export_model, quantized by
                        nncf.quantize (anchor: own venv, own process)
  i ort int8            the same ONNX file through onnxruntime.quantization.
                        quantize_static (QDQ, per_channel=True)
  j openvino fp32       the ONNX file in OpenVINO, float32 (anchor)
  k ort fp32            the ONNX file in ONNX Runtime, float32 (anchor)
  l mxamp int8 ends fp32  d with the first and last layer kept out of INT8
                        (exclude_layers), computing in float32 in the region
  m mxamp int8 ends bf16  the same with rest_dtype='bfloat16': those layers and
                        the non-linear operators in bfloat16 (only where the
                        CPU has avx512_bf16 / amx_bf16)

Every INT8 variant calibrates on the same batches (--calib-batches of the
network's batch size, seeded, none of them the timed batch). Weights are
random (no downloads). Per network: the median time per batch, items per
second, the speed against the fastest MXNet float32 row (a, b, f) and against
c, the spread of the rounds, the calibration time, the first call, the
relative L2 error of the output against a, and where variants d and e spend
one batch (MXNet's profiler: backend regions against operators left on MXNet;
oneDNN 3's verbose mode: every primitive with its data types, so reorders and
layers left in float32 show; each primitive at its fastest of several
calls), beside the peers' own profiles by kind of operator, ms per call, with
GMAC/s and the fraction of an INT8 peak measured at the start (int8_peak): d
against c and e against c' (MXNet's oneDNN 2.4 verbose, from a child process:
MXNet reads DNNL_VERBOSE only when it starts), d against OpenVINO INT8's
per-layer profile (PERF_COUNT). Last, the accuracy check: a residual CNN and an
MLP trained here on scikit-learn's digits (tests/quantization/digits.py),
quantized by d, e, c and c', top-1 agreement with float32 and the accuracy change.

The anchors need a separate venv (bench/README.md; --setup-anchor makes it)
and `onnx<1.16` in this environment for MXNet 1.9.1's ONNX exporter. One
failing variant prints its error in its row; the rest go on.
"""
import os

# Before MXNet starts its OpenMP pool: the machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # no "backend MKLDNN is activated" lines

import dataclasses  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import mxamp  # noqa: E402
import mxamp.quantization  # noqa: E402
from benchlib import (HERE, MEMORY_HEADER, MODEL_KEYS, SEQ_LEN, THREADS,  # noqa: E402
                      anchor_skip_reason, AnchorProcess, backend_block, backend_computes,
                      backend_summary, cpu_description, describe, export_model, export_onnx,
                      fill_anchor_variants, fmt, fp32_peak, freed, imported, mac_rate, machine,
                      median, memory_columns, memory_row, models, mxamp_int8, mxnet_calib_data,
                      mxnet_int8, mxnet_verbose_runs, network_flops, parse_arguments, peak_fraction,
                      peak_ratio, percent, prepare, primitive_totals, print_breakdown, provenance,
                      served, serving_process, time_interleaved, timing_header, timing_settings,
                      Variant, verbose_calls)
from mxamp.verify import relative_error  # noqa: E402
from mxamp.dtypes import as_numpy  # noqa: E402

FP32 = ("a mxnet fp32", "b mxnet fp32 fused", "f mxamp fp32")
MXNET_INT8, MXNET_ENTROPY = "c mxnet int8", "c' mxnet int8 entropy"
NAIVE, ENTROPY = "d mxamp int8 naive", "e mxamp int8 entropy"
BF16 = "g mxamp bf16"
ENDS_FP32, ENDS_BF16 = "l mxamp int8 ends fp32", "m mxamp int8 ends bf16"
OPENVINO_INT8 = "h openvino int8"
ANCHOR_INT8 = {"openvino-int8": OPENVINO_INT8, "onnxruntime-int8": "i ort int8"}
ANCHOR_FP32 = {"openvino-fp32": "j openvino fp32", "onnxruntime-fp32": "k ort fp32"}
# Built first and timed with every other variant: the float32 and INT8 baselines.
REFERENCES = ("a mxnet fp32", MXNET_INT8)
# What mxamp's INT8 is measured against: every other INT8 implementation.
PEERS = (MXNET_INT8, MXNET_ENTROPY, *ANCHOR_INT8.values())
# Timed again in one set of rounds with OpenVINO's, for the comparison.
SHARED_ROUNDS = (MXNET_INT8, MXNET_ENTROPY, NAIVE, ENTROPY)
WIDTH = 23


# ---------------------------------------------------------------- variants

def hybridized(block):
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def end_layers(prefix):
    """The first and the last layer that start INT8 (kept out of it by the
    variants l and m, as is common practice)."""
    with open(f"{prefix}-symbol.json") as f:
        nodes = json.load(f)["nodes"]
    starts = mxamp.quantization.api.int8_layers()
    names = [n["name"] for n in nodes if n["op"] in starts]
    return [names[0], names[-1]]


def mxnet_int8_summary(block):
    """How many operators of MXNet's quantized graph run in INT8."""
    nodes = [n for n in json.loads(block._cached_graph[1].tojson())["nodes"]
             if n["op"] != "null"]
    int8 = sum(n.get("attrs", {}).get("quantized") == "true" or
               n["op"].startswith("_contrib_quantized") for n in nodes)
    edges = sum(n["op"] in ("_contrib_quantize_v2", "_contrib_dequantize") for n in nodes)
    return f"{int8} INT8 ops, {edges} (de)quantize, {len(nodes)} ops"


def timed(convert, *args):
    """(block, seconds) of convert(*args), hybridized for timing."""
    started = time.perf_counter()
    block = convert(*args)
    return hybridized(block), time.perf_counter() - started


def make_builders(prefix, x, calib):
    """{name: build() -> (block, seconds, notes)} of variants a-g, l and m from
    the exported float32 model, and the variants skipped on this CPU."""
    def plain():
        return hybridized(imported(prefix)), None, "-"

    def fused():
        block = imported(prefix)
        started = time.perf_counter()
        block.optimize_for(x, backend="MKLDNN", static_alloc=True, static_shape=True)
        return block, time.perf_counter() - started, "optimize_for('MKLDNN')"

    def theirs(calib_mode):
        block, seconds = timed(mxnet_int8, imported(prefix), mxnet_calib_data(calib),
                               calib_mode)
        return block, seconds, lambda: mxnet_int8_summary(block)

    def ours(calib_mode, exclude_layers=None, rest_dtype="float32"):
        block, seconds = timed(mxamp_int8, imported(prefix), calib, calib_mode,
                               exclude_layers, rest_dtype)
        return block, seconds, lambda: backend_summary(block, casts=False)

    def backend(compute):
        source = hybridized(imported(prefix))
        source(x)
        block, seconds = timed(backend_block, source, x, compute)
        return block, seconds, lambda: backend_summary(block, casts=compute == "bfloat16")

    builders = {"a mxnet fp32": plain, "b mxnet fp32 fused": fused,
                MXNET_INT8: lambda: theirs("naive"), MXNET_ENTROPY: lambda: theirs("entropy"),
                NAIVE: lambda: ours("naive"), ENTROPY: lambda: ours("entropy"),
                "f mxamp fp32": lambda: backend("float32"),
                BF16: lambda: backend("bfloat16"),
                ENDS_FP32: lambda: ours("naive", end_layers(prefix)),
                ENDS_BF16: lambda: ours("naive", end_layers(prefix), "bfloat16")}
    skipped = []
    if not mxamp.cpu.features("onednn").bf16:
        for name in (BF16, ENDS_BF16):
            del builders[name]
            skipped.append(Variant(name, error="skipped: no bfloat16 on this CPU"))
    return builders, skipped


def built(name, build, x):
    print(f"   preparing {name} ...", flush=True)
    return prepare(Variant(name), build, x)


def anchor_variants(anchor, key, prefix, x, calib, workdir, skip_reason):
    """Variants h-k: export to ONNX here; quantize, load and run in the
    anchor process."""
    variants = {runner: Variant(name) for runner, name in {**ANCHOR_INT8, **ANCHOR_FP32}.items()}
    if skip_reason is None:
        try:
            onnx_path = workdir / "model.onnx"
            export_s = export_onnx(prefix, x.shape, onnx_path)
            # The same examples as the other rows', in batches of the
            # exported (timed) batch size.
            examples = np.concatenate([b.asnumpy() for b in calib])
            np.save(workdir / "calib.npy", examples.reshape(-1, *x.shape))
            common = {"onnx": str(onnx_path), "input": str(workdir / "input.npy"),
                      "threads": THREADS, "out_dir": str(workdir)}
            print("   preparing the anchors (export, NNCF, quantize_static) ...", flush=True)
            quantized = anchor.ask(cmd="quantize", calib=str(workdir / "calib.npy"),
                                   runtimes=list(ANCHOR_INT8), transformer=key == "bert",
                                   vnni=mxamp.cpu.features("onednn").vnni, **common)
            fill_anchor_variants({r: variants[r] for r in ANCHOR_INT8}, anchor, quantized)
            loaded = anchor.ask(cmd="load", runtimes=list(ANCHOR_FP32), **common)
            fill_anchor_variants({r: variants[r] for r in ANCHOR_FP32}, anchor, loaded)
            for variant in variants.values():
                variant.casts += f", export {export_s:.1f} s"
        except Exception as err:
            skip_reason = describe(err)
    for variant in variants.values():
        if skip_reason is not None and variant.run is None:
            variant.error = skip_reason
    return list(variants.values())


# ---------------------------------------------------------------- table

def report(key, model, variants, calib_count, calib_batch, work):
    """The table of one network and batch; `work`: its FLOPs and the float32
    peak (GMAC/s) the "of peak" column is a share of (benchlib.peak_fraction)."""
    by_name = {v.name: v for v in variants}
    fp32_times = [median(by_name[n]) for n in FP32 if median(by_name[n])]
    best_fp32 = min(fp32_times) if fp32_times else None
    theirs = median(by_name[MXNET_INT8])
    base = by_name["a mxnet fp32"].output
    print(f"\n== {key}: {model.title}, batch {model.batch}, {THREADS} threads, calibration "
          f"{calib_count} x {calib_batch}")
    header = (f"{'variant':<{WIDTH}}{'ms/batch':>9}{'items/s':>9}{'vs fp32':>8}{'limit':>7}"
              f"{'of peak':>8}{'vs c':>7}{'spread':>7}{'calib s':>8}{'1st s':>7}"
              f"{MEMORY_HEADER}{'rel err':>9}  notes")
    print(header)
    print("-" * (len(header) + 30))
    rows = []
    for v in variants:
        t = median(v)
        if t is None:
            status = v.error if v.error.startswith(("skipped", "not run")) else \
                f"FAILED  {v.error}"
            print(f"{v.name:<{WIDTH}}{status}")
            rows.append({"variant": v.name, "error": v.error})
            continue
        err = relative_error(v.output, base) if base is not None and v.output is not None \
            and v.output.shape == base.shape else None
        # the default path's row computes in what the backend chooses here
        ratio = peak_ratio(v.name, backend_computes() if v.name == BF16 else None)
        spread = (max(v.times) - min(v.times)) / t
        row = {"variant": v.name, "ms": 1000 * t, "items_s": model.batch / t,
               "vs_best_fp32": best_fp32 / t if best_fp32 else None,
               "vs_mxnet_int8": theirs / t if theirs else None, "spread": spread,
               "peak_ratio": ratio,
               "peak_fraction": peak_fraction(work["flops"], t, ratio, work["fp32_gmacs"]),
               "calib_s": v.convert_s, "first_s": v.first_s, "rel_err": err, "notes": v.casts,
               "times_ms": [1000 * s for s in v.times], **memory_row(v)}
        rows.append(row)
        print(f"{v.name:<{WIDTH}}{fmt(row['ms'], '.1f', 9)}{fmt(row['items_s'], '.1f', 9)}"
              f"{fmt(row['vs_best_fp32'], '.2f', 8, 'x')}{fmt(row['peak_ratio'], '.1f', 7, 'x')}"
              f"{percent(row['peak_fraction'])}{fmt(row['vs_mxnet_int8'], '.2f', 7, 'x')}"
              f"{fmt(100 * spread, '.0f', 7, '%')}"
              f"{fmt(v.convert_s, '.1f', 8)}{fmt(v.first_s, '.2f', 7)}{memory_columns(row)}"
              f"{fmt(err, '.1e', 9)}  {v.casts}")
    return rows


def primitive_split(primitives):
    """ms in reorders, in INT8 compute (u8/s8 inputs) and in float compute."""
    split = {"reorder": 0.0, "int8": 0.0, "float": 0.0}
    for (kind, _, types), (_, ms, _) in primitives.items():
        inputs = types.split("->")[0].split(",")
        part = "reorder" if kind == "reorder" else \
            "int8" if {"u8", "s8"} & set(inputs) else "float"
        split[part] += ms
    return split


def breakdown(variant):
    ops, primitives, sums = print_breakdown(variant, dtypes=True, top=16)
    split = primitive_split({tuple(k.split(" ", 2)): v for k, v in primitives.items()})
    total = sum(split.values()) or 1.0
    print("   oneDNN time by kind: " + ", ".join(
        f"{part} {ms:.1f} ms ({100 * ms / total:.0f}%)" for part, ms in split.items()))
    return {"operators": ops, "primitives": primitives, "split_ms": split, "sums": sums}


def mxnet_profile(variant, x):
    """MXNet INT8's own profile (variant c or c'), in the form of the
    anchor's: its oneDNN 2.4 primitives on `x`, from the verbose of a child
    process running the exported model (benchlib.mxnet_verbose_runs), each
    at its fastest of verbose_calls' calls, summed by kind, implementation
    and data types."""
    print(f"   profiling {variant.name} (oneDNN 2.4 verbose, in a child process) ...",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "model")
        variant.block.export(prefix)
        np.save(f"{prefix}-input.npy", x.asnumpy())
        runs = mxnet_verbose_runs(prefix, f"{prefix}-input.npy", variant.run,
                                  verbose_calls(1000 * median(variant)))
    totals, sums = primitive_totals(runs, dtypes=True)
    return {"layers": {" ".join(key): (count, ms) for key, (count, ms, _) in totals.items()},
            "sums": sums}


def int8_peak():
    """The INT8 multiply-accumulate rate mxamp's backend reaches on this CPU
    (benchlib.mac_rate of each layer quantized naive). The rates of the
    breakdown are fractions of it."""
    return mac_rate("INT8", lambda net, x: mxamp_int8(net, [x], "naive"))


ENGINE = "MXNet's engine (waits, frees)"
# Where one call goes, mxamp's oneDNN primitives and operators left on MXNet
# against OpenVINO's layers, by what they compute (the first word of a
# primitive kind or an OpenVINO node type, lower case).
KINDS = (("convolutions, inner products", {"inner_product", "fullyconnected", "convolution",
                                            "fullyconnectedquantizedlegacy"}),
         ("grouped (depthwise) convolutions", {"grouped_convolution", "groupconvolution"}),
         ("matmuls (attention)", {"matmul", "scaleddotproductattention"}),
         ("softmax", {"softmax"}),
         ("LayerNorm", {"layer_normalization", "mvn"}),
         ("reorders, transposes, (de)quantize", {"reorder", "transpose", "fakequantize",
                                                 "convert"}),
         ("adds, eltwise", {"binary", "eltwise", "add", "multiply", "subgraph"}),
         ("embedding (gather)", {"embedding", "gather"}),
         ("pooling", {"pooling", "maxpool", "avgpool", "reducemean"}),
         (ENGINE, {"waitforvar", "deletevariable"}))


def kind_of(name):
    first = name.split(" ", 1)[0].lower()
    return next((kind for kind, words in KINDS if first in words), f"other: {first}")


def rate_cells(macs, ms, peak):
    """GMAC/s and the fraction of the INT8 peak, blank without work."""
    if not macs or not ms:
        return f"{'':>13}"
    gmacs = macs / ms / 1e6
    return f"{gmacs:>7.0f}{gmacs / peak:>6.0%}"


def side_by_side(breakdown_result, peer_answer, peak, ours, peer):
    """Prints the breakdown of mxamp's variant `ours` (oneDNN verbose inside
    the regions, MXNet's profiler for the operators outside them) against
    the peer's own per-layer profile (OpenVINO's PERF_COUNT, MXNet INT8's
    oneDNN 2.4 verbose; each layer at its fastest of the calls), by kind: ms
    per call, count, and for the kinds that multiply, GMAC/s and the
    fraction of `peak` (int8_peak's), the peer's on mxamp's count of the
    same network's work; last, all that work over each side's fastest whole
    call in CPU time. Returns the rows."""
    rows = {}  # kind -> [count, ms, peer count, peer ms, MACs]

    def add(name, count, ms, at, macs=0):
        row = rows.setdefault(kind_of(name), [0, 0.0, 0, 0.0, 0])
        row[at] += count
        row[at + 1] += ms
        row[4] += macs

    for key, (count, ms, macs) in breakdown_result["primitives"].items():
        add(key, count, ms, 0, macs)
    for name, (count, ms) in breakdown_result["operators"].items():
        if "_mxamp_onednn_region" not in name:
            add(name, count, ms, 0)
    layers = peer_answer["layers"]
    for key, (count, ms) in layers.items():
        if key.split(" ", 1)[0] not in ("Parameter", "Result", "Constant", "Input", "Output"):
            add(key, count, ms, 2)
    gmacs = peak["gmacs"]
    sums = peer_answer["sums"]
    print(f"\n   {ours} against {peer} by kind, ms per call (count), each "
          f"primitive / layer at its fastest of {sums['calls']} calls; GMAC/s and fraction "
          f"of the INT8 peak ({gmacs:.0f} GMAC/s); {peer}'s layers {sums['min_ms']:.1f} ms "
          f"(medians {sums['median_ms']:.1f}) in a call of {sums['cpu_ms']:.1f} ms CPU time:")
    print(f"     {'kind':<34}{'mxamp: ms (n) GMAC/s peak':>27}   {peer.split(' ', 1)[1]}: "
          "the same")
    for kind, (n, ms, peer_n, peer_ms, macs) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"     {kind:<34}{ms:>8.2f} ({n:>3.0f}){rate_cells(macs, ms, gmacs)}"
              f"{peer_ms:>11.2f} ({peer_n:>3.0f}){rate_cells(macs, peer_ms, gmacs)}".rstrip())
    # MXNet's waits last while a region computes: its time is counted already
    totals = [sum(r[i] for kind, r in rows.items() if kind != ENGINE) for i in (1, 3, 4)]
    print(f"     {'total, without the engine':<34}{totals[0]:>8.2f}{'':>6}{rate_cells(totals[2], totals[0], gmacs)}"
          f"{totals[1]:>11.2f}{'':>6}{rate_cells(totals[2], totals[1], gmacs)}")
    # the same work over a whole call's CPU time: no preemption left in it
    calls = [breakdown_result["sums"]["cpu_ms"], sums["cpu_ms"]]
    print(f"     {'one call, CPU time':<34}{calls[0]:>8.2f}{'':>6}"
          f"{rate_cells(totals[2], calls[0], gmacs)}{calls[1]:>11.2f}{'':>6}"
          f"{rate_cells(totals[2], calls[1], gmacs)}")
    print(f"   {peer}'s own layers:")
    for key, (count, ms) in sorted(layers.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"     {key:<56}{count:>5.0f}x{ms:>10.2f} ms")
    return {"by_kind": {kind: dict(zip(("count", "ms", "peer_count", "peer_ms", "macs"), row))
                        for kind, row in rows.items()},
            "peer_layers": layers, "peer_sums": sums, "int8_peak_gmacs": gmacs}


# Each mxamp variant profiled against each peer's own profile, when both ran.
COMPARED = ((NAIVE, MXNET_INT8), (ENTROPY, MXNET_ENTROPY), (NAIVE, OPENVINO_INT8))


def profilers(anchor, x):
    """{variant name: profile(variant)}: mxamp's breakdown, MXNet INT8's
    oneDNN 2.4 verbose, OpenVINO INT8's PERF_COUNT (the anchor's), each over
    verbose_calls' calls for the variant's time."""
    def openvino(variant):
        calls = verbose_calls(1000 * median(variant))
        return anchor.ask(cmd="profile", runtime="openvino-int8", calls=calls)

    return {NAIVE: breakdown, ENTROPY: breakdown,
            MXNET_INT8: functools.partial(mxnet_profile, x=x),
            MXNET_ENTROPY: functools.partial(mxnet_profile, x=x),
            OPENVINO_INT8: openvino}


def profile(variant, profiles, profile_of):
    """Adds `variant`'s profile (profile_of's) to `profiles` when it ran."""
    if variant.name not in profile_of or variant.run is None:
        return
    try:
        profiles[variant.name] = profile_of[variant.name](variant)
    except Exception as err:
        print(f"   profile of {variant.name} failed: {describe(err)}")


def compared(profiles, peak):
    """side_by_side of each pair of COMPARED that both profiled."""
    return {f"{ours} / {peer}": side_by_side(profiles[ours], profiles[peer], peak, ours, peer)
            for ours, peer in COMPARED if ours in profiles and peer in profiles}


# ---------------------------------------------------------------- digits

def digits_models():
    """tests/quantization/digits.py: the trained residual CNN and MLP the
    quantization tests use (scikit-learn's digits, upsampled to 16x16)."""
    path = HERE.parent / "tests" / "quantization" / "digits.py"
    spec = importlib.util.spec_from_file_location("mxamp_digits_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digits_accuracy(calib_batches, calib_size=64):
    """Per trained model: float32 accuracy on the held-out digits, and for
    each INT8 variant its top-1 agreement with float32, accuracy and
    calibration time (calibration on the first training digits)."""
    digits = digits_models()
    x_train, _, x_test, y_test = digits.data()
    calib = [mx.nd.array(x_train[i * calib_size:(i + 1) * calib_size])
             for i in range(calib_batches)]
    x = mx.nd.array(x_test)
    quantizers = {NAIVE: lambda b: mxamp_int8(b, calib, "naive"),
                  ENTROPY: lambda b: mxamp_int8(b, calib, "entropy"),
                  MXNET_INT8: lambda b: mxnet_int8(b, mxnet_calib_data(calib), "naive"),
                  MXNET_ENTROPY: lambda b: mxnet_int8(b, mxnet_calib_data(calib), "entropy")}
    results = {"test_digits": len(y_test), "calibration": f"{calib_batches} x {calib_size}"}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("residual_cnn", "mlp"):
            digits.trained(kind).export(str(Path(tmp) / kind))
            prefix = str(Path(tmp) / kind)
            fp32 = imported(prefix)(x).asnumpy()
            entry = {"fp32_accuracy": float((fp32.argmax(1) == y_test).mean()), "int8": {}}
            for name, quantize in quantizers.items():
                try:
                    block, seconds = timed(quantize, imported(prefix))
                    out = as_numpy(block(x))
                    entry["int8"][name] = {
                        "agreement": float((out.argmax(1) == fp32.argmax(1)).mean()),
                        "accuracy": float((out.argmax(1) == y_test).mean()),
                        "logit_rel_err": relative_error(out, fp32), "calib_s": seconds}
                except Exception as err:
                    entry["int8"][name] = {"error": describe(err)}
            results[kind] = entry
    return results


def print_digits(results):
    print(f"\n== accuracy on trained models: scikit-learn digits (16x16), "
          f"{results['test_digits']} held-out digits, calibration {results['calibration']} "
          "training digits")
    header = (f"{'model':<14}{'variant':<{WIDTH + 2}}{'top-1 agree':>12}{'accuracy':>10}"
              f"{'change':>8}{'logit err':>10}{'calib s':>8}")
    print(header)
    print("-" * len(header))
    for kind in ("residual_cnn", "mlp"):
        entry = results[kind]
        print(f"{kind:<14}{'fp32':<{WIDTH + 2}}{'':>12}{100 * entry['fp32_accuracy']:>9.1f}%")
        for name, r in entry["int8"].items():
            if "error" in r:
                print(f"{'':<14}{name:<{WIDTH + 2}}FAILED  {r['error']}")
                continue
            change = 100 * (r["accuracy"] - entry["fp32_accuracy"])
            print(f"{'':<14}{name:<{WIDTH + 2}}{100 * r['agreement']:>11.1f}%"
                  f"{100 * r['accuracy']:>9.1f}%{change:>+8.1f}{r['logit_rel_err']:>10.1e}"
                  f"{r['calib_s']:>8.1f}")


# ---------------------------------------------------------------- main

def row_label(key, batch):
    """'resnet50 b16', 'bert 8x128': a network at one batch size."""
    return f"{key} {batch}x{SEQ_LEN}" if key == "bert" else f"{key} b{batch}"


def against_peers(rows, shared):
    """mxamp's INT8 rows against the peers' (PEERS) of one table: the fastest
    peer, the most accurate one, and each mxamp row's speed against the
    fastest (above 1: mxamp is faster) with its error. `shared` ({name:
    Variant}) holds the rows timed again in one set of rounds with
    OpenVINO's (SHARED_ROUNDS): where it has both sides, they are compared
    by those times; else by each row's own."""
    timed_rows = {r["variant"]: r for r in rows if "ms" in r}
    shared_ms = {n: 1000 * median(v) for n, v in shared.items() if v.times}

    def ms(name):
        return shared_ms.get(name, timed_rows[name]["ms"])

    peers = [n for n in PEERS if n in timed_rows]
    if not peers:
        return None
    fastest = min(peers, key=ms)
    errors = [n for n in peers if timed_rows[n]["rel_err"] is not None]
    accurate = min(errors, key=lambda n: timed_rows[n]["rel_err"]) if errors else None

    def entry(name):
        return {"ms": ms(name), "ms_own_rounds": timed_rows[name]["ms"],
                "rel_err": timed_rows[name]["rel_err"],
                "times_ms_shared": [1000 * t for t in shared[name].times]
                if name in shared_ms else None}

    def ours(name):
        both = name in shared_ms and fastest in shared_ms
        return {**entry(name), "vs_fastest_peer": ms(fastest) / ms(name),
                "same_rounds": both or (fastest == MXNET_INT8 and name not in shared_ms)}

    return {"fastest_peer": fastest, "fastest_peer_ms": ms(fastest),
            "fastest_peer_rel_err": timed_rows[fastest]["rel_err"],
            "most_accurate_peer": accurate,
            "most_accurate_peer_rel_err": accurate and timed_rows[accurate]["rel_err"],
            "peers": {n: entry(n) for n in peers},
            "mxamp": {n: ours(n) for n in (NAIVE, ENTROPY) if n in timed_rows}}


def error_text(err):
    return fmt(err, ".1e", 0)


def print_peer_line(summary):
    if summary is None:
        print("   no peer INT8 row ran: nothing to compare mxamp with")
        return
    ours = ", ".join(f"{name.split()[-1]} {r['ms']:.1f} ms, {r['vs_fastest_peer']:.2f}x "
                     f"(err {error_text(r['rel_err'])}"
                     f"{'' if r['same_rounds'] else ', timed in other rounds'})"
                     for name, r in summary["mxamp"].items())
    print(f"   mxamp against the fastest peer ({summary['fastest_peer']}, "
          f"{summary['fastest_peer_ms']:.1f} ms, err "
          f"{error_text(summary['fastest_peer_rel_err'])}): {ours or 'no mxamp row ran'}; "
          f"most accurate peer: {summary['most_accurate_peer']} "
          f"(err {error_text(summary['most_accurate_peer_rel_err'])})")


def print_summary(results, labels):
    """One line per network and batch size: mxamp's INT8 and every peer's
    (ms, error), then mxamp against the fastest peer."""
    columns = [NAIVE, ENTROPY, *PEERS]
    print("\n== INT8 against the peers (ms per batch, from the rounds shared with OpenVINO "
          "where there were some; relative L2 error against float32; last column: the "
          "fastest peer's time over mxamp's, naive / entropy)")
    header = f"{'network':<16}" + "".join(f"{n.split(' ', 1)[1]:>24}" for n in columns) + \
        f"{'vs fastest peer':>18}"
    print(header)
    print("-" * len(header))
    for label in labels:
        summary = results.get(label, {}).get("peers")
        if summary is None:
            print(f"{label:<16}-")
            continue
        times = {**summary["peers"], **summary["mxamp"]}
        cells = "".join(f"{times[n]['ms']:.1f}, {error_text(times[n]['rel_err'])}".rjust(24)
                        if n in times else f"{'-':>24}" for n in columns)
        ratios = " / ".join(f"{r['vs_fastest_peer']:.2f}x" for r in summary["mxamp"].values())
        print(f"{label:<16}{cells}{ratios or '-':>18}")


def time_anchors(anchors, references, shared, args):
    """OpenVINO's variants timed in rounds with the INT8 rows of
    SHARED_ROUNDS (`shared`, which then holds them too), ONNX Runtime's
    with the references: its threads spin after its call and slow whatever
    runs next, so it gets rounds of its own."""
    print("   timing OpenVINO with the INT8 rows of mxamp and MXNet again, then "
          "ONNX Runtime ...", flush=True)
    ort = {ANCHOR_INT8["onnxruntime-int8"], ANCHOR_FP32["onnxruntime-fp32"]}
    openvino = [v for v in anchors if v.name not in ort]
    time_interleaved(openvino + list(shared.values()), args.warmup, args.runs, args.clock,
                     args.burst)
    shared.update((v.name, v) for v in openvino)
    time_interleaved(references + [v for v in anchors if v.name in ort], args.warmup,
                     args.runs, args.clock, args.burst)


def bench_model(key, model, batch, args, anchor, anchor_skip, peaks, server):
    """One network at one batch size. Every batch size quantizes the same
    weights on the same calibration examples (in batches of the network's
    own size; the anchors get them re-batched to the exported size).

    The references (REFERENCES) stay built throughout; every other variant
    is built, timed interleaved with them, and freed before the next is
    built (all at once, the 12-layer encoder's variants exceed 15 GB), then
    OpenVINO's are timed with the INT8 rows of SHARED_ROUNDS again (kept
    loaded in the serving child), ONNX Runtime's with the references."""
    result = {"model": model.title, "batch": batch, "calib_batch": model.batch,
              "calib_batches": args.calib_batches}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prefix = export_model(model, key, workdir, calibrate_batchnorm=True)
        x = model.make_input(batch, seed=100)
        np.save(workdir / "input.npy", as_numpy(x))
        calib = [model.make_input(model.batch, seed=1 + i) for i in range(args.calib_batches)]
        builders, variants = make_builders(prefix, x, calib)
        references = [served(built(name, builders.pop(name), x), server, workdir)
                      for name in REFERENCES]
        profile_of = {} if args.no_profile else profilers(anchor, x)
        profiles = {}
        # The INT8 rows of SHARED_ROUNDS stay loaded in the serving child, to
        # be timed again in OpenVINO's rounds: comparisons then come from
        # interleaved calls, not from rounds minutes apart.
        shared = {}

        def share(variant):
            if variant.name in SHARED_ROUNDS and variant.served is not None:
                shared[variant.name] = Variant(variant.name, served=variant.served)

        for reference in references:
            share(reference)
        try:
            for name, build in builders.items():
                variant = served(built(name, build, x), server, workdir)
                time_interleaved(references + [variant], args.warmup, args.runs, args.clock,
                                 args.burst)
                profile(variant, profiles, profile_of)
                share(variant)
                variants.append(freed(variant))
                server.ask(cmd="keep", names=[*REFERENCES, *shared])
            for reference in references:
                profile(reference, profiles, profile_of)
            anchors = anchor_variants(anchor, key, prefix, x, calib, workdir, anchor_skip)
            if any(v.run is not None for v in anchors):
                time_anchors(anchors, references, shared, args)
                for variant in anchors:
                    profile(variant, profiles, profile_of)
        finally:
            server.ask(cmd="keep", names=[])
        work = {"flops": network_flops(prefix, x.shape), "fp32_gmacs": peaks["fp32"]["gmacs"]}
    result.update(profiles=profiles, side_by_side=compared(profiles, peaks["int8"]), **work)
    variants += [freed(v) for v in references + anchors]
    variants.sort(key=lambda v: v.name)
    rows = report(key, dataclasses.replace(model, batch=batch), variants, args.calib_batches,
                  model.batch, work)
    result.update(rows=rows, peers=against_peers(rows, shared))
    print_peer_line(result["peers"])
    return result


def main():
    args = parse_arguments(
        __doc__, MODEL_KEYS, "a short run: fewer rounds and calibration batches, 2 layers",
        "skip the accuracy check", extra=[("calib_batches", 4, 2, "calibration batches of the "
                                           "network's batch size (default 4, --quick 2)")],
        batches_help="batch sizes to time every network at (default: the network's own, "
                     "then 1)", burst=10)

    note = "" if mxamp.cpu.features("onednn").vnni else \
        " -- no VNNI/AMX: INT8 dot products take 3 instructions"
    print(f"CPU: {cpu_description(note)}")
    print(f"mxnet {mx.__version__}, mxamp {getattr(mxamp, '__version__', '?')}, "
          f"OMP_NUM_THREADS={THREADS}, {timing_header(args)}")
    anchor_skip = anchor_skip_reason(args.anchor_python, not args.no_anchor)
    anchor = AnchorProcess(args.anchor_python) if anchor_skip is None else None
    server = serving_process()
    results = {"run": provenance("int8_speed"), "machine": machine(), **timing_settings(args)}
    labels = []
    peaks = {"fp32": fp32_peak(), "int8": None if args.no_profile else int8_peak()}
    results.update(fp32_peak=peaks["fp32"], int8_peak=peaks["int8"])
    try:
        for key in args.models:
            model = models(args.layers)[key]
            for batch in args.batches or dict.fromkeys((model.batch, 1)):
                label = row_label(key, batch)
                labels.append(label)
                print(f"\n-- {label}", flush=True)
                try:
                    results[label] = bench_model(key, model, batch, args, anchor, anchor_skip,
                                                 peaks, server)
                except Exception as err:  # one network failing must not stop the others
                    print(f"== {label} FAILED: {describe(err)}")
                    results[label] = {"error": describe(err)}
                if args.json:  # what was measured survives a later crash (or the OOM killer)
                    Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    finally:
        server.close()
        if anchor is not None:
            anchor.close()
    print_summary(results, labels)
    if not args.no_digits:
        try:
            results["digits"] = digits_accuracy(args.calib_batches)
            print_digits(results["digits"])
        except Exception as err:
            print(f"\n== digits accuracy FAILED: {describe(err)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
