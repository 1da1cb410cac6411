"""bfloat16 inference speed, side by side: MXNet float32, the reference AMP,
mxamp, mxamp with its oneDNN 3 backend, and OpenVINO / ONNX Runtime as anchors.

    python bench/bf16_speed.py [--models resnet50 mobilenetv2 bert] [--runs N]
                               [--warmup N] [--layers N] [--quick] [--no-anchor]
                               [--anchor-python PATH] [--setup-anchor] [--json OUT]

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

Every MXNet variant runs with static_alloc/static_shape. Throughput is the
median over --runs timed rounds after --warmup rounds, one batch per variant
per round ("spread": slowest minus fastest round, against the median).
Weights are random (no downloads); "rel err" is the relative L2
error of each variant's output against variant a on the same input. After the
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

import argparse  # noqa: E402
import contextlib  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

import mxamp  # noqa: E402
import mxamp.backends  # noqa: E402
import mxamp.gluon  # noqa: E402
from mxamp import native as _lib  # noqa: E402
from mxamp.verify import relative_error  # noqa: E402

HERE = Path(__file__).resolve().parent
THREADS = int(os.environ["OMP_NUM_THREADS"])
DEFAULT_ANCHOR_PYTHON = "/tmp/anchor-venv/bin/python"
FP32 = ("a fp32", "b fp32+mkldnn")
REFERENCE = "c ref bf16"
BACKEND = "e mxamp+onednn"
ONEDNN_FP32 = "h onednn3 fp32"


# ---------------------------------------------------------------- networks

class EncoderLayer(gluon.HybridBlock):
    """One post-LayerNorm transformer encoder layer (BERT's), written with
    FullyConnected, batch_dot, softmax and LayerNorm."""

    def __init__(self, units, heads, hidden, seq_len, **kwargs):
        super().__init__(**kwargs)
        self.heads = heads
        # Explicit sizes: MXNet's ONNX exporter has no reshape codes -3/-4.
        self.head_shape = (seq_len, units // heads)
        self.scale = 1.0 / math.sqrt(units // heads)
        with self.name_scope():
            self.query = nn.Dense(units, flatten=False)
            self.key = nn.Dense(units, flatten=False)
            self.value = nn.Dense(units, flatten=False)
            self.proj = nn.Dense(units, flatten=False)
            self.norm1 = nn.LayerNorm()
            self.ffn1 = nn.Dense(hidden, flatten=False)
            self.ffn2 = nn.Dense(units, flatten=False)
            self.norm2 = nn.LayerNorm()

    def _split(self, F, x):  # (B, S, H) -> (B * heads, S, H / heads)
        x = F.transpose(F.reshape(x, shape=(0, 0, self.heads, -1)), axes=(0, 2, 1, 3))
        return F.reshape(x, shape=(-1, *self.head_shape))

    def hybrid_forward(self, F, x):
        q = self._split(F, self.query(x) * self.scale)
        k = self._split(F, self.key(x))
        v = self._split(F, self.value(x))
        attention = F.softmax(F.batch_dot(q, k, transpose_b=True), axis=-1)
        context = F.reshape(F.batch_dot(attention, v), shape=(-1, self.heads, *self.head_shape))
        context = F.reshape(F.transpose(context, axes=(0, 2, 1, 3)), shape=(0, 0, -1))
        x = self.norm1(x + self.proj(context))
        return self.norm2(x + self.ffn2(F.LeakyReLU(self.ffn1(x), act_type="gelu")))


class Encoder(gluon.HybridBlock):
    """A BERT-base-sized encoder: token and position embeddings, then layers.
    Token ids come in as float32 (MXNet's Embedding takes them so)."""

    def __init__(self, layers, seq_len, vocab=30522, units=768, heads=12, hidden=3072,
                 **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(vocab, units)
            self.position = self.params.get("position", shape=(1, seq_len, units))
            self.norm = nn.LayerNorm()
            self.layers = nn.HybridSequential()
            for _ in range(layers):
                self.layers.add(EncoderLayer(units, heads, hidden, seq_len))

    def hybrid_forward(self, F, tokens, position):
        return self.layers(self.norm(F.broadcast_add(self.embed(tokens), position)))


@dataclass
class Model:
    title: str
    batch: int
    build: object  # () -> initialized Gluon block
    make_input: object  # (batch) -> NDArray


def zoo(name):
    def build():
        from gluoncv import model_zoo
        return model_zoo.get_model(name, pretrained=False)
    return build


def images(batch):
    return mx.nd.random.uniform(shape=(batch, 3, 224, 224))


def models(layers, seq_len=128):
    return {
        "resnet50": Model("ResNet-50 v1 (resnet50_v1)", 16, zoo("resnet50_v1"), images),
        "mobilenetv2": Model("MobileNet v2 (mobilenetv2_1.0)", 32, zoo("mobilenetv2_1.0"), images),
        "bert": Model(f"BERT-base-sized encoder ({layers} layers, seq {seq_len})", 8,
                      lambda: Encoder(layers, seq_len),
                      lambda batch: mx.nd.random.randint(0, 30522, shape=(batch, seq_len))
                      .astype("float32")),
    }


# ---------------------------------------------------------------- variants

@dataclass
class Variant:
    name: str
    run: object = None        # () -> numpy output of one batch (blocks until done)
    convert_s: float = None
    first_s: float = None     # first call: graph build, partitioning, weight packing
    casts: str = ""
    error: str = None
    output: np.ndarray = None
    times: list = field(default_factory=list)
    block: object = None


def describe(err):
    """One line for a table row: the error type and the first line of its message."""
    lines = str(err).strip().splitlines() or [""]
    message = lines[0][:200]
    name = type(err).__name__
    return message if message.startswith(name) else f"{name}: {message}"


def forward(block, x):
    def run():
        out = block(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        return out.asnumpy().astype(np.float32)  # asnumpy waits for the result
    return run


def imported(prefix):
    return gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"],
                                     f"{prefix}-0000.params", ctx=mx.cpu())


def cast_counts(block):
    counts = mxamp.summarize(block._cached_graph[1])
    short = {"amp_cast:bfloat16": "bf16", "amp_cast:float32": "fp32", "amp_multicast": "multi"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in counts.items()) or "none"


def backend_summary(block):
    onednn = mxamp.backends.get("onednn")
    sym = block._cached_graph[1]
    regions = onednn.regions(sym)
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    outside = sum(n["op"] not in ("null", onednn.REGION_OP) for n in graph["nodes"])
    return (f"{len(regions)} regions/{sum(map(len, regions))} ops, "
            f"{outside} ops on MXNet, {cast_counts(block)}")


def backend_block(source, x, compute="bfloat16"):
    """mxamp's documented path from a run float32 block: convert_hybrid_block
    (which keeps float32 what MXNet has no bfloat16 kernel for on this CPU),
    then the oneDNN backend (which keeps on MXNet what it cannot speed up)."""
    block = source
    if compute == "bfloat16":
        block = mxamp.convert_hybrid_block(source, target_dtype="bfloat16")
        block(x)  # apply_backend_block takes a block that has run
    return mxamp.gluon.apply_backend_block(block, compute=compute)


def cpu_description():
    """The CPU model and the instruction sets that decide bfloat16 speed."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("model name")), "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines()
                      if line.startswith("flags")), []))
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    note = "" if {"avx512_bf16", "amx_bf16"} & flags else \
        " -- no bfloat16 instructions: bf16 rows measure fallbacks, not bf16 speed"
    return f"{model}, {os.cpu_count()} cpus, {' '.join(isa) or 'no AVX2'}{note}"


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
        start = time.perf_counter()
        block = convert(source)
        seconds = time.perf_counter() - start
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
                BACKEND: lambda: mxamp_backend("bfloat16"),
                ONEDNN_FP32: lambda: mxamp_backend("float32")}
    variants = []
    for name, build in builders.items():
        variant = Variant(name)
        try:
            variant.block, variant.convert_s, variant.casts = build()
            variant.run = forward(variant.block, x)
            start = time.perf_counter()
            variant.output = variant.run()
            variant.first_s = time.perf_counter() - start
        except Exception as err:  # the row shows the failure, the others go on
            variant.error = describe(err)
            variant.run = None
        variants.append(variant)
    return variants


# ---------------------------------------------------------------- anchors

class AnchorProcess:
    """bench/onnx_anchor.py running in the anchor venv, driven line by line."""

    def __init__(self, python):
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        self.proc = subprocess.Popen([python, str(HERE / "onnx_anchor.py")], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the anchor process ended (exit status {self.proc.wait()})")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(answer["error"])
        return answer

    def close(self):
        with contextlib.suppress(OSError):
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


ANCHORS = {"f openvino bf16": "openvino", "g ort fp32": "onnxruntime"}


@contextlib.contextmanager
def onnx_opset(version):
    """MXNet 1.9.1's exporter stamps the model with onnx's newest opset but
    writes operators in their opset 12/13 form (e.g. ReduceMean with an axes
    attribute, an input since opset 18), which runtimes then reject: pin the
    opset it reads, and the one its graph check uses."""
    import onnx.checker
    import onnx.defs
    newest, imports = onnx.defs.onnx_opset_version, onnx.checker.DEFAULT_CONTEXT.opset_imports
    onnx.defs.onnx_opset_version = lambda: version
    onnx.checker.DEFAULT_CONTEXT.opset_imports = {"": version}
    try:
        yield
    finally:
        onnx.defs.onnx_opset_version = newest
        onnx.checker.DEFAULT_CONTEXT.opset_imports = imports


def anchor_variants(anchor, prefix, x, workdir, skip_reason):
    """Variants f and g: export to ONNX here, run in the anchor process."""
    variants = [Variant(name, casts="-") for name in ANCHORS]
    if skip_reason is None:
        try:
            onnx_path = str(workdir / "model.onnx")
            start = time.perf_counter()
            with onnx_opset(13):
                mx.onnx.export_model(f"{prefix}-symbol.json", f"{prefix}-0000.params",
                                     [x.shape], [np.float32], onnx_path)
            export_s = time.perf_counter() - start
            np.save(workdir / "input.npy", x.asnumpy())
            loaded = anchor.ask(cmd="load", onnx=onnx_path, input=str(workdir / "input.npy"),
                                threads=THREADS, runtimes=list(ANCHORS.values()),
                                out_dir=str(workdir))
        except Exception as err:
            skip_reason = describe(err)
    for variant, runtime in zip(variants, ANCHORS.values()):
        if skip_reason is not None:
            variant.error = skip_reason
        elif runtime in loaded["errors"]:
            variant.error = loaded["errors"][runtime]
        else:
            variant.convert_s = export_s
            variant.first_s = loaded["load_s"][runtime]
            variant.casts = f"{runtime} {loaded['versions'][runtime]}"
            variant.output = np.load(loaded["outputs"][runtime])
            variant.run = (lambda r: lambda: anchor.ask(cmd="time", runtime=r)["seconds"])(runtime)
    return variants


def anchor_skip_reason(python, enabled):
    if not enabled:
        return "not run (--no-anchor)"
    if not Path(python).is_file():
        return f"not run: no anchor venv at {python} (make it with --setup-anchor)"
    try:
        import onnx  # noqa: F401  (MXNet's exporter needs it)
    except ImportError:
        return "not run: mx.onnx.export_model needs onnx: pip install 'onnx<1.16' 'numpy<1.24'"
    return None


def setup_anchor(python):
    venv = Path(python).parent.parent
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-r", str(HERE / "requirements-anchor.txt")],
                   check=True)


# ---------------------------------------------------------------- timing

def time_interleaved(variants, warmup, runs):
    live = [v for v in variants if v.run is not None]
    for round_index in range(warmup + runs):
        shift = round_index % max(len(live), 1)
        for variant in live[shift:] + live[:shift]:
            start = time.perf_counter()
            measured = variant.run()
            seconds = time.perf_counter() - start
            if variant.name in ANCHORS:  # the anchor times itself, without the pipe
                seconds = measured
            if round_index >= warmup:
                variant.times.append(seconds)


def median(variant):
    return statistics.median(variant.times) if variant.times else None


def report(key, model, variants):
    by_name = {v.name: v for v in variants}
    fp32_times = [median(by_name[n]) for n in FP32 if median(by_name[n])]
    best_fp32 = min(fp32_times) if fp32_times else None
    reference = median(by_name[REFERENCE])
    base = by_name["a fp32"].output
    print(f"\n== {key}: {model.title}, batch {model.batch}, {THREADS} threads")
    header = (f"{'variant':<16}{'ms/batch':>10}{'items/s':>9}{'vs fp32':>9}{'vs ref':>8}"
              f"{'spread':>7}{'conv s':>8}{'1st s':>7}{'rel err':>9}  casts / notes")
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
        row = {"variant": v.name, "ms": 1000 * t, "items_s": model.batch / t,
               "vs_best_fp32": best_fp32 / t if best_fp32 else None,
               "vs_ref": reference / t if reference else None,
               "convert_s": v.convert_s, "first_s": v.first_s, "rel_err": err,
               "notes": v.casts, "spread_ms": 1000 * (max(v.times) - min(v.times))}
        rows.append(row)

        def fmt(value, spec, width, unit=""):
            text = "-" if value is None else f"{value:{spec}}{unit}"
            return f"{text:>{width}}"
        print(f"{v.name:<16}{fmt(row['ms'], '.1f', 10)}{fmt(row['items_s'], '.1f', 9)}"
              f"{fmt(row['vs_best_fp32'], '.2f', 9, 'x')}{fmt(row['vs_ref'], '.2f', 8, 'x')}"
              f"{fmt(100 * (max(v.times) - min(v.times)) / t, '.0f', 7, '%')}"
              f"{fmt(v.convert_s, '.1f', 8)}{fmt(v.first_s, '.2f', 7)}"
              f"{fmt(err, '.1e', 9)}  {v.casts}")
    return rows


# ---------------------------------------------------------------- breakdown

def profile_operators(block_run, calls):
    """MXNet profiler aggregate: {op name: (count, total ms)} over `calls` runs."""
    with tempfile.TemporaryDirectory() as tmp:
        mx.profiler.set_config(profile_symbolic=True, profile_imperative=True,
                               aggregate_stats=True, filename=str(Path(tmp) / "profile.json"))
        mx.profiler.set_state("run")
        for _ in range(calls):
            block_run()
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        stats = json.loads(mx.profiler.dumps(reset=True, format="json"))
    ops = stats.get("Time", {}).get("operator", {})
    return {name: (s["Count"] // calls, s["Total"] / calls) for name, s in ops.items()}


@contextlib.contextmanager
def captured_stdout(path):
    """Sends file descriptor 1 (where oneDNN's verbose lines go) to `path`."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    with open(path, "w") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)


def onednn_primitives(block_run):
    """oneDNN 3 verbose over one run: {(kind, implementation): [count, ms]}."""
    dnnl = ctypes.CDLL(str(_lib.onednn_prefix() / "lib" / "libdnnl.so.3"))
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "verbose.txt"
        with captured_stdout(log):
            dnnl.dnnl_set_verbose(1)
            block_run()
            mx.nd.waitall()
            dnnl.dnnl_set_verbose(0)
        lines = log.read_text().splitlines()
    totals = {}
    for line in lines:
        fields = line.split(",")
        if not line.startswith("onednn_verbose") or "exec" not in fields:
            continue
        i = fields.index("exec")
        key = (fields[i + 2], fields[i + 3])
        entry = totals.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += float(fields[-1])
    return totals


def print_breakdown(variant, calls=3):
    # Rebuilt unbulked, so that the profiler sees operators, not segments of
    # bulked operators (MXNet reads this when the cached graph is built).
    saved = os.environ.get("MXNET_EXEC_BULK_EXEC_INFERENCE")
    os.environ["MXNET_EXEC_BULK_EXEC_INFERENCE"] = "0"
    try:
        variant.block.hybridize(static_alloc=True, static_shape=True)
        variant.run()
    finally:
        os.environ.pop("MXNET_EXEC_BULK_EXEC_INFERENCE")
        if saved is not None:
            os.environ["MXNET_EXEC_BULK_EXEC_INFERENCE"] = saved
    print(f"\n   where {variant.name} spends one batch (MXNet profiler, mean of {calls} runs):")
    ops = profile_operators(variant.run, calls)
    total = sum(ms for _, ms in ops.values()) or 1.0
    in_regions = sum(ms for name, (_, ms) in ops.items() if "_mxamp_onednn_region" in name)
    print(f"     total {total:.1f} ms: backend regions {in_regions:.1f} ms "
          f"({100 * in_regions / total:.0f}%), the rest on MXNet")
    for name, (count, ms) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"     {name:<34}{count:>6} calls{ms:>10.1f} ms{100 * ms / total:>6.1f}%")
    primitives = onednn_primitives(variant.run)
    if not primitives:
        return ops, {}
    inside = sum(ms for _, ms in primitives.values())
    print(f"   inside the regions (oneDNN 3 verbose, one run, {inside:.1f} ms in primitives):")
    for (kind, impl), (count, ms) in sorted(primitives.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"     {kind + ' ' + impl:<48}{count:>5}x{ms:>10.1f} ms")
    return ops, {f"{k} {i}": v for (k, i), v in primitives.items()}


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
    bf16 = fast(x_test).asnumpy().astype(np.float32)
    return {"agreement": float((fp32.argmax(1) == bf16.argmax(1)).mean()),
            "fp32_accuracy": float((fp32.argmax(1) == y_test).mean()),
            "bf16_accuracy": float((bf16.argmax(1) == y_test).mean()),
            "logit_rel_err": relative_error(bf16, fp32),
            "regions": len(onednn.regions(fast._cached_graph[1]))}


# ---------------------------------------------------------------- main

def bench_model(key, model, args, anchor, anchor_skip):
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        mx.random.seed(0)
        net = model.build()
        net.initialize(mx.init.Xavier())
        net.hybridize()
        x = model.make_input(model.batch)
        net(x)
        prefix = str(workdir / key)
        net.export(prefix)
        variants = make_variants(prefix, x)
        variants += anchor_variants(anchor, prefix, x, workdir, anchor_skip)
    variants.sort(key=lambda v: v.name)
    time_interleaved(variants, args.warmup, args.runs)
    result = {"model": model.title, "batch": model.batch, "rows": report(key, model, variants)}
    result["breakdown"] = {}
    for v in variants:
        if v.name in (BACKEND, ONEDNN_FP32) and v.run is not None and not args.no_profile:
            try:
                result["breakdown"][v.name] = print_breakdown(v)
            except Exception as err:
                print(f"   breakdown of {v.name} failed: {describe(err)}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenetv2", "bert"],
                        choices=["resnet50", "mobilenetv2", "bert"])
    parser.add_argument("--runs", type=int, help="timed rounds (default 7, --quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed rounds first (default 2, --quick 1)")
    parser.add_argument("--layers", type=int, help="encoder layers (default 12, --quick 2)")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: fewer rounds, a 2-layer encoder, fewer digits epochs")
    parser.add_argument("--no-anchor", action="store_true", help="skip OpenVINO / ONNX Runtime")
    parser.add_argument("--no-profile", action="store_true", help="skip the time breakdown")
    parser.add_argument("--no-digits", action="store_true", help="skip the digits check")
    parser.add_argument("--anchor-python", default=DEFAULT_ANCHOR_PYTHON,
                        help=f"python of the anchor venv (default {DEFAULT_ANCHOR_PYTHON})")
    parser.add_argument("--setup-anchor", action="store_true",
                        help="create the anchor venv from bench/requirements-anchor.txt first")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    args.runs = args.runs or (3 if args.quick else 7)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.layers = args.layers or (2 if args.quick else 12)
    if min(args.runs, args.layers) < 1 or args.warmup < 0:
        parser.error("--runs and --layers must be at least 1, --warmup at least 0")
    if args.setup_anchor:
        setup_anchor(args.anchor_python)

    print(f"CPU: {cpu_description()}")
    print(f"mxnet {mx.__version__}, OMP_NUM_THREADS={THREADS}, runs {args.runs} "
          f"after {args.warmup} warm-up; times are per batch (median)")
    anchor_skip = anchor_skip_reason(args.anchor_python, not args.no_anchor)
    anchor = AnchorProcess(args.anchor_python) if anchor_skip is None else None
    results = {}
    try:
        for key in args.models:
            results[key] = bench_model(key, models(args.layers)[key], args, anchor, anchor_skip)
    finally:
        if anchor is not None:
            anchor.close()
    if not args.no_digits:
        try:
            digits = digits_check(epochs=5 if args.quick else 15)
            results["digits"] = digits
            print(f"\n== digits CNN (float32-trained), bf16 with the backend: top-1 agreement "
                  f"{100 * digits['agreement']:.1f}% (target >= 99%), accuracy fp32 "
                  f"{100 * digits['fp32_accuracy']:.1f}% / bf16 {100 * digits['bf16_accuracy']:.1f}%"
                  f", logit rel err {digits['logit_rel_err']:.1e}, {digits['regions']} regions"
                  + ("" if digits["regions"] else " (nothing ran in bfloat16 on this CPU)"))
        except Exception as err:
            print(f"\n== digits check FAILED: {describe(err)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
