"""mxamp's oneDNN backend built against two oneDNN versions, side by side:
the same INT8 and float32 rows timed in two virtual environments, each in its
own child process (one libdnnl.so.3 per process), interleaved round by round.

    python bench/onednn_versions.py --python A_PYTHON --python B_PYTHON
                                    [--models resnet50 mobilenetv2 bert] [--batches N ...]
                                    [--runs N] [--warmup N] [--layers N]
                                    [--calib-batches N] [--json OUT]

Each environment needs mxamp (an editable install of this checkout builds the
backend library against that environment's oneDNN on first use), MXNet 1.9.1
and GluonCV. A venv whose oneDNN runs on SYCL (the `onednn` 2026 wheels: its
lib/ holds libsycl.so) gets its lib/ on LD_LIBRARY_PATH and its OpenCL CPU
runtime named in OCL_ICD_FILENAMES, which the wheels do not set up.

Per network and batch size (default: the network's own, then 1), both
children export the same seeded model and quantize it on the same
calibration batches (`int8_speed.py`'s d and e rows, mxamp naive / entropy),
plus the float32 backend (row f). The table: median ms per batch, each
environment's oneDNN version, the second environment's speed against the
first's (above 1: B is faster), the rounds' spread and the relative error
against MXNet float32.
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")

import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = ("d mxamp int8 naive", "e mxamp int8 entropy", "f mxamp fp32")


# ---------------------------------------------------------------- child side

def serve():
    """The child: requests from the parent over a pipe (onnx_anchor.serve)."""
    import onnx_anchor

    answers = onnx_anchor.answering()
    import benchlib
    import mxamp.quantization
    import numpy as np

    blocks, x = {}, None

    def prepare(key, batch, layers, calib_batches, out_dir):
        nonlocal x
        blocks.clear()
        model = benchlib.models(layers)[key]
        prefix = benchlib.export_model(model, key, out_dir, calibrate_batchnorm=True)
        x = model.make_input(batch, seed=100)
        calib = [model.make_input(model.batch, seed=1 + i) for i in range(calib_batches)]
        reference = benchlib.forward(benchlib.imported(prefix), x)()
        builders = {
            ROWS[0]: lambda: mxamp.quantization.quantize_net_v2(
                benchlib.imported(prefix), calib_data=calib, calib_mode="naive"),
            ROWS[1]: lambda: mxamp.quantization.quantize_net_v2(
                benchlib.imported(prefix), calib_data=calib, calib_mode="entropy"),
            ROWS[2]: lambda: fp32_backend(prefix)}
        errors, rel_err = {}, {}
        for name, build in builders.items():
            try:
                block = build()
                block.hybridize(static_alloc=True, static_shape=True)
                blocks[name] = benchlib.forward(block, x)
                rel_err[name] = float(np.linalg.norm(blocks[name]() - reference)
                                      / np.linalg.norm(reference))
            except Exception as err:  # one row failing must not stop the others
                errors[name] = benchlib.describe(err)
        return {"rel_err": rel_err, "errors": errors, "onednn": onednn_version()}

    def fp32_backend(prefix):
        source = benchlib.imported(prefix)
        source.hybridize(static_alloc=True, static_shape=True)
        source(x)
        return benchlib.backend_block(source, x, "float32")

    def timed(name, calls=1):
        return onnx_anchor.timed_call(blocks[name], calls)

    onnx_anchor.serve({"prepare": prepare, "time": timed}, answers)


def onednn_version():
    """oneDNN's own version string (dnnl_version()) of the loaded library."""
    import ctypes

    from mxamp import native

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                    ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                    ("gpu_runtime", ctypes.c_uint)]

    dnnl = ctypes.CDLL(str(native.onednn_prefix(headers=False) / "lib" / "libdnnl.so.3"))
    dnnl.dnnl_version.restype = ctypes.POINTER(Version)
    v = dnnl.dnnl_version().contents
    runtimes = {1: "seq", 2: "OpenMP", 4: "TBB", 8: "threadpool", 256: "OpenCL", 512: "SYCL"}
    return f"{v.major}.{v.minor}.{v.patch} ({runtimes.get(v.cpu_runtime, v.cpu_runtime)})"


# ---------------------------------------------------------------- parent side

def child_env(python):
    """The environment for a child running `python`: a venv whose oneDNN runs
    on SYCL gets its lib/ searched and its OpenCL CPU runtime named."""
    env = dict(os.environ)
    lib = Path(python).parent.parent / "lib"
    if (lib / "libsycl.so").exists():
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
        env["OCL_ICD_FILENAMES"] = str(lib / "libintelocl.so")
    return env


def start_child(python):
    """A child serving this script's requests with `python`."""
    import benchlib

    return benchlib.AnchorProcess(python, (str(Path(__file__).resolve()), "--serve"),
                                  child_env(python))


def bench_row(children, key, batch, args):
    """Prepares every row in both children, times them interleaved; returns
    {row: {child index: entry}}."""
    import benchlib

    prepared = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, child in enumerate(children):
            out_dir = Path(tmp) / str(i)
            out_dir.mkdir()
            prepared.append(child.ask(cmd="prepare", key=key, batch=batch, layers=args.layers,
                                      calib_batches=args.calib_batches, out_dir=str(out_dir)))
    variants = []
    for i, (child, answer) in enumerate(zip(children, prepared)):
        for name in ROWS:
            variant = benchlib.Variant(f"{name} [{i}]", self_timed=True)
            if name in answer["rel_err"]:
                variant.run = (lambda calls, c=child, n=name: c.ask(cmd="time", name=n,
                                                                    calls=calls))
            variants.append(variant)
    benchlib.time_interleaved(variants, args.warmup, args.runs)
    table = {}
    for i, answer in enumerate(prepared):
        for j, name in enumerate(ROWS):
            v = variants[i * len(ROWS) + j]
            t = benchlib.median(v)
            table.setdefault(name, {})[i] = {
                "onednn": answer["onednn"], "error": answer["errors"].get(name),
                "rel_err": answer["rel_err"].get(name),
                "ms": None if t is None else 1000 * t,
                "spread": None if t is None else (max(v.times) - min(v.times)) / t,
                "times_ms": [1000 * s for s in v.times]}
    return table


def print_row(label, table):
    fmt = lambda value, spec: "-" if value is None else format(value, spec)  # noqa: E731
    print(f"\n== {label}")
    print(f"{'row':<24}{'A ms':>9}{'B ms':>9}{'B vs A':>8}{'spread A/B':>12}"
          f"{'err A':>9}{'err B':>9}")
    for name, entries in table.items():
        a, b = entries[0], entries[1]
        ratio = a["ms"] / b["ms"] if a["ms"] and b["ms"] else None
        spread = f"{fmt(a['spread'] and 100 * a['spread'], '.0f')}/" \
                 f"{fmt(b['spread'] and 100 * b['spread'], '.0f')}%"
        print(f"{name:<24}{fmt(a['ms'], '.1f'):>9}{fmt(b['ms'], '.1f'):>9}"
              f"{fmt(ratio, '.2f') + 'x':>8}{spread:>12}{fmt(a['rel_err'], '.1e'):>9}"
              f"{fmt(b['rel_err'], '.1e'):>9}"
              + "".join(f"  [{k}] {e['error']}" for k, e in entries.items() if e["error"]))


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", action="append", required=True,
                        help="the python of an environment (give it twice: A, then B)")
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenetv2", "bert"],
                        choices=("resnet50", "mobilenetv2", "bert"))
    parser.add_argument("--batches", type=int, nargs="+",
                        help="batch sizes (default: the network's own, then 1)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--calib-batches", type=int, default=4)
    parser.add_argument("--json")
    args = parser.parse_args()
    if len(args.python) != 2:
        parser.error("--python must be given twice (A, then B)")
    sys.path.insert(0, str(HERE))
    import benchlib

    children = [start_child(p) for p in args.python]
    results = {"machine": benchlib.machine(), "pythons": args.python, "runs": args.runs}
    try:
        for key in args.models:
            own = benchlib.models(args.layers)[key].batch
            for batch in args.batches or dict.fromkeys((own, 1)):
                label = f"{key} {batch}x{benchlib.SEQ_LEN}" if key == "bert" else \
                    f"{key} b{batch}"
                try:
                    results[label] = table = bench_row(children, key, batch, args)
                except (RuntimeError, OSError) as err:  # e.g. a child killed for memory
                    print(f"\n== {label} FAILED: {err}")
                    results[label] = {"error": str(err)}
                    continue
                finally:  # what was measured survives a later failure
                    if args.json:
                        Path(args.json).write_text(json.dumps(results, indent=1))
                versions = {i: e["onednn"] for i, e in table[ROWS[0]].items()}
                print_row(f"{label}: A = oneDNN {versions[0]}, B = oneDNN {versions[1]}", table)
    finally:
        for child in children:
            child.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main()
