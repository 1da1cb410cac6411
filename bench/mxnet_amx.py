"""MXNet 1.9.1's own kernels with and without AMX, side by side.

    python bench/mxnet_amx.py [--models resnet50 mobilenetv2 bert] [--runs N] [--warmup N]
                              [--layers N] [--quick] [--clock wall|cpu] [--burst N] [--json OUT]

On a CPU with AMX, importing mxamp has MXNet's own oneDNN run AMX kernels
(mxamp.cpu.enable_mxnet_amx). Two serving children build the same variants
of each network from one float32 export:

  amx     a process that imports mxamp: MXNet's kernels as mxamp's users run them
  no amx  the same with MXAMP_MXNET_AMX=0: MXNet's kernels as they run without
          mxamp (the reference's users)

Variants in each:

  fp32        the float32 model
  mxamp bf16  mxamp.convert_hybrid_block(net, target_dtype="bfloat16") alone
  ref bf16    mxnet.contrib.amp.convert_hybrid_block(net, target_dtype="bfloat16")
  mxnet int8  mxnet.contrib.quantization.quantize_net_v2 (naive, one batch)

The rounds interleave every variant of both children (benchlib.time_interleaved,
bursts of --burst calls). Each row: median ms per batch, speed against the
faster fp32 row, relative L2 error against the no-amx fp32 output, and the
share of its oneDNN primitives' time in AMX kernels (a third child, amx with
MXNet's verbose on, runs each variant twice more). On a CPU without AMX both
children run alike; the header says so.
"""
import os

# Before MXNet starts its OpenMP pool: the machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "2")

import ctypes  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import mxamp  # noqa: E402
from benchlib import (CALL_MARK, MODEL_KEYS, THREADS, AnchorProcess, Variant, cpu_description,  # noqa: E402
                      export_model, fmt, forward, imported, machine, median, models,
                      mxnet_calib_data, mxnet_int8, parse_arguments, time_interleaved,
                      timing_header, timing_settings, verbose_primitives)
from mxamp.verify import relative_error  # noqa: E402

VARIANTS = ("fp32", "mxamp bf16", "ref bf16", "mxnet int8")
CHILDREN = {"amx": {}, "no amx": {mxamp.cpu.AMX_SWITCH: "0"}}


def build(name, prefix, x):
    """The block of variant `name` from the float32 export at `prefix`."""
    block = imported(prefix)
    if name == "mxamp bf16":
        return mxamp.convert_hybrid_block(block, target_dtype="bfloat16")
    if name == "ref bf16":
        from mxnet.contrib import amp
        return amp.convert_hybrid_block(block, target_dtype="bfloat16", ctx=mx.cpu())
    if name == "mxnet int8":
        return mxnet_int8(block, mxnet_calib_data([x]))
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def child():
    """A serving child: builds the variants of one export on request and
    times them (onnx_anchor.serve's protocol); "verbose" runs one twice,
    between marks on this process's stderr (where MXNet's verbose goes)."""
    import onnx_anchor

    answers = onnx_anchor.answering()
    runs = {}

    def load(prefix, input, outputs):
        x = mx.nd.array(np.load(input))
        errors = {}
        for name in VARIANTS:
            try:
                block = build(name, prefix, x)
                block(x)  # the graph made and the weights reordered
                runs[name] = forward(block, x)
                np.save(Path(outputs) / f"{name}.npy", runs[name]())
            except Exception as err:  # one variant failing must not stop the others
                errors[name] = f"{type(err).__name__}: {str(err).strip()[:300]}"
        return {"errors": errors, "amx": mxamp.cpu.features("mxnet").amx}

    def verbose(name):
        libc = ctypes.CDLL(None)
        libc.fflush(None)  # MXNet's oneDNN writes through C stdio
        os.write(1, f"{CALL_MARK} {name}\n".encode())
        for _ in range(2):
            runs[name]()
        libc.fflush(None)
        return {}

    onnx_anchor.serve({"load": load, "verbose": verbose,
                       "time": lambda name, calls: onnx_anchor.timed_call(runs[name], calls)},
                      answers)


def start(setting, stderr=None, verbose=False):
    env = {**os.environ, **CHILDREN[setting]}
    if verbose:
        env["DNNL_VERBOSE"] = "1"
    return AnchorProcess(sys.executable, (str(Path(__file__).resolve()), "--child"), env=env,
                         stderr=stderr)


def amx_shares(prefix, input_path, workdir):
    """{variant: share of its primitives' time in AMX kernels} in the amx
    setting, from MXNet's verbose (None where the variant did not run)."""
    log = workdir / "verbose.txt"
    with open(log, "w") as stderr:
        proc = start("amx", stderr=stderr, verbose=True)
        try:
            loaded = proc.ask(cmd="load", prefix=prefix, input=input_path,
                              outputs=str(workdir))
            for name in VARIANTS:
                if name not in loaded["errors"]:
                    proc.ask(cmd="verbose", name=name)
        finally:
            proc.close()
    shares = dict.fromkeys(VARIANTS)
    for part in log.read_text().split(CALL_MARK)[1:]:
        name, text = part.split("\n", 1)
        prims = verbose_primitives(text)
        total = sum(p[4] for p in prims)
        shares[name.strip()] = sum(p[4] for p in prims if "amx" in p[1]) / total if total else 0.0
    return shares


def bench_model(key, model, args, servers, workdir):
    prefix = export_model(model, key, workdir)
    input_path = str(workdir / f"{key}-input.npy")
    np.save(input_path, model.make_input(model.batch).asnumpy())
    rows = {}
    for setting, server in servers.items():
        outputs = workdir / setting.replace(" ", "_")
        outputs.mkdir(exist_ok=True)
        answer = server.ask(cmd="load", prefix=prefix, input=input_path, outputs=str(outputs))
        for name in VARIANTS:
            variant = Variant(f"{setting}: {name}", error=answer["errors"].get(name))
            if variant.error is None:
                variant.output = np.load(outputs / f"{name}.npy")
                variant.served = (lambda s, n: lambda calls: s.ask(cmd="time", name=n,
                                                                   calls=calls))(server, name)
            rows[setting, name] = variant
    time_interleaved(list(rows.values()), args.warmup, args.runs, args.clock, args.burst)
    shares = amx_shares(prefix, input_path, workdir)
    return report(model, rows, shares)


def report(model, rows, shares):
    """Prints the table of one network; its --json entry."""
    fp32 = [median(rows[s, "fp32"]) for s in CHILDREN if median(rows[s, "fp32"])]
    best = min(fp32) if fp32 else None
    reference = rows["no amx", "fp32"].output
    print(f"\n== {model.title}, batch {model.batch}")
    print(f"{'variant':<20}{'ms':>9}{'vs fp32':>9}{'rel err':>10}{'AMX time':>10}")
    entry = {}
    for (setting, name), variant in rows.items():
        ms = median(variant)
        ms = ms * 1e3 if ms is not None else None
        speed = best * 1e3 / ms if best and ms else None
        error = None if variant.output is None or reference is None else \
            relative_error(variant.output, reference)
        share = shares.get(name) if setting == "amx" else None
        entry[variant.name] = {"ms": ms, "vs_fp32": speed, "rel_err": error, "amx_share": share,
                               "times_ms": [t * 1e3 for t in variant.times],
                               "error": variant.error}
        if variant.error:
            print(f"{variant.name:<20}  failed: {variant.error}")
            continue
        print(f"{variant.name:<20}{fmt(ms, '.1f', 9)}{fmt(speed, '.2f', 9, 'x')}"
              f"{fmt(error, '.1e', 10)}{fmt(share and 100 * share, '.0f', 9, '%')}")
    plain, ref = median(rows["amx", "mxamp bf16"]), median(rows["no amx", "ref bf16"])
    if plain and ref:
        entry["mxamp_bf16_vs_reference"] = ref / plain
        print(f"mxamp's plain bfloat16 conversion ({'AMX' if shares.get('mxamp bf16') else 'no AMX'}"
              f" kernels) against the reference's without mxamp: {ref / plain:.2f}x")
    return entry


def main():
    args = parse_arguments(__doc__, MODEL_KEYS, "a short run: fewer rounds, a 2-layer encoder",
                           "unused", burst=3)
    note = "" if "amx" in mxamp.cpu._hardware() else \
        " -- no AMX: both settings run MXNet's kernels alike"
    print(f"CPU: {cpu_description(note)}")
    print(f"mxnet {mx.__version__}, OMP_NUM_THREADS={THREADS}, {timing_header(args)}")
    results = {"machine": machine(), **timing_settings(args), "command": sys.argv}
    servers = {setting: start(setting) for setting in CHILDREN}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for key in args.models:
                results[key] = bench_model(key, models(args.layers)[key], args, servers,
                                           Path(tmp))
    finally:
        for server in servers.values():
            server.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()
    else:
        main()
