"""What bench/bf16_speed.py and bench/int8_speed.py share: the networks, the
variant record and interleaved timing, the CPU line, the serving child that
times the MXNet-side rows as served (this file with --serve), the outside
anchors' child process (bench/onnx_anchor.py in its own venv) and the ONNX
export, and the time breakdowns (MXNet's profiler, oneDNN 3's verbose mode);
and how int8_speed.py and quant_memory.py quantize with each library
(mxnet_int8, mxamp_int8).

Import it after setting OMP_NUM_THREADS (the scripts default it to 2 before
MXNet starts its OpenMP pool).
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")

import collections  # noqa: E402
import contextlib  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
from mxnet import gluon  # noqa: E402
from mxnet.contrib import quantization as mxnet_quantization  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

import mxamp  # noqa: E402
import mxamp.backends  # noqa: E402
import mxamp.gluon  # noqa: E402
import mxamp.graph  # noqa: E402
import mxamp.quantization  # noqa: E402
from mxamp.dtypes import as_numpy, dtype_name, to_code, to_ndarray  # noqa: E402
from mxamp.errors import mxnet_message  # noqa: E402
from mxamp.tools.inspection import flops  # noqa: E402
from mxamp.verify import relative_error  # noqa: E402

HERE = Path(__file__).resolve().parent
THREADS = int(os.environ["OMP_NUM_THREADS"])
DEFAULT_ANCHOR_PYTHON = "/tmp/anchor-venv/bin/python"
MODEL_KEYS = ("resnet50", "mobilenetv2", "bert")
SEQ_LEN = 128
ENCODER_LAYERS = 12  # BERT-base's depth: the encoder's default --layers
VOCAB = 30522


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

    def __init__(self, layers, seq_len, vocab=VOCAB, units=768, heads=12, hidden=3072,
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
    build: object       # () -> uninitialized Gluon block
    make_input: object  # (batch, seed=0) -> NDArray


def zoo(name):
    def build():
        from gluoncv import model_zoo
        return model_zoo.get_model(name, pretrained=False)
    return build


def images(batch, seed=0):
    """Uniform pixels normalized with ImageNet's mean and deviation (so the
    first layer's input is signed, as a real pipeline's is)."""
    rs = np.random.RandomState(seed)
    mean = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
    return mx.nd.array((rs.uniform(size=(batch, 3, 224, 224)) - mean) / std)


def tokens(batch, seed=0, seq_len=SEQ_LEN):
    rs = np.random.RandomState(seed)
    return mx.nd.array(rs.randint(0, VOCAB, size=(batch, seq_len)).astype(np.float32))


def models(layers, seq_len=SEQ_LEN):
    """The benchmarks' networks by key, at their bench batch (other sizes:
    --batches); `layers` sizes the encoder."""
    return {
        "resnet50": Model("ResNet-50 v1 (resnet50_v1)", 16, zoo("resnet50_v1"), images),
        "mobilenetv2": Model("MobileNet v2 (mobilenetv2_1.0)", 32, zoo("mobilenetv2_1.0"), images),
        "bert": Model(f"BERT-base-sized encoder ({layers} layers, seq {seq_len})", 8,
                      lambda: Encoder(layers, seq_len),
                      lambda batch, seed=0: tokens(batch, seed, seq_len)),
    }


def network_nodes():
    """(op, attrs pairs, number of inputs) of every operator node of three
    small networks (ResNet-18 v1, MobileNet v2, one 16-token encoder layer):
    attributes real models give operators, for per-operator sweeps."""
    nets = models(layers=1, seq_len=16)
    nodes = set()
    for build, shape in ((nets["mobilenetv2"].build, (1, 3, 32, 32)),
                         (nets["bert"].build, (1, 16)), (zoo("resnet18_v1"), (1, 3, 32, 32))):
        net = build()
        net.initialize()
        net.hybridize()
        net(mx.nd.ones(shape))
        graph = mxamp.graph.graph_json(net._cached_graph[1])
        nodes |= {(n["op"], tuple(sorted(n.get("attrs", {}).items())), len(n["inputs"]))
                  for n in graph["nodes"] if n["op"] != "null"}
    return nodes


def export_model(model, key, workdir, seed=0, calibrate_batchnorm=False):
    """Builds `model` with random weights (fixed seed), runs it once and
    exports it to workdir/key; returns the prefix. With
    `calibrate_batchnorm`, BatchNorm statistics are set on one more batch
    (mxamp.tools.zoo.calibrate_batchnorm: every layer then hands on
    activations of unit scale, as a trained network's do; left at (0, 1),
    MobileNet v2's activations shrink to ~1e-11 at its end, where INT8
    ranges say little about real models)."""
    mx.random.seed(seed)
    net = model.build()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(model.make_input(model.batch))
    if calibrate_batchnorm and '"BatchNorm"' in net._cached_graph[1].tojson():
        from mxamp.tools.zoo import calibrate_batchnorm as calibrate
        calibrate(net, model.make_input(model.batch, seed=seed + 50))
    prefix = str(Path(workdir) / key)
    net.export(prefix)
    return prefix


def imported(prefix):
    return gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"],
                                     f"{prefix}-0000.params", ctx=mx.cpu())


def mxnet_calib_data(calib):
    """The batches `calib` as MXNet's quantize_net_v2 takes them: one
    NDArrayIter over them, whose input is named 'data' as `imported`'s is."""
    return mx.io.NDArrayIter(mx.nd.concat(*calib, dim=0), batch_size=calib[0].shape[0])


def mxnet_int8(block, calib_data, calib_mode="naive"):
    """MXNet's own quantization of `block` (its MKLDNN backend on the CPU,
    quantized_dtype='auto', no layer excluded) on `calib_data`
    (mxnet_calib_data's)."""
    return mxnet_quantization.quantize_net_v2(block, quantized_dtype="auto",
                                              calib_mode=calib_mode, calib_data=calib_data,
                                              ctx=mx.cpu())


def mxamp_int8(block, calib, calib_mode="naive", exclude_layers=None, rest_dtype="float32"):
    """mxamp's quantization of `block` on the list of batches `calib`."""
    return mxamp.quantization.quantize_net_v2(block, calib_data=calib, calib_mode=calib_mode,
                                              exclude_layers=exclude_layers,
                                              rest_dtype=rest_dtype)


# ---------------------------------------------------------------- variants

@dataclass
class Variant:
    name: str
    run: object = None        # () -> numpy output of one batch (blocks until done),
    #                           or when self_timed (calls) -> the seconds per call
    #                           of `calls` calls back to back, per clock
    convert_s: float = None   # conversion / calibration time
    first_s: float = None     # first call: graph build, partitioning, weight packing
    casts: str = ""           # notes: cast counts, regions, runtime versions
    error: str = None         # why it has no row ("skipped: ..." or the failure)
    output: np.ndarray = None
    times: list = field(default_factory=list)
    block: object = None
    self_timed: bool = False  # an anchor: run() returns its own CLOCKS times, without the pipe
    served: object = None     # when set, what is timed: (calls) -> the seconds per call per
    #                           clock of the exported block in a serving process
    param_bytes: dict = None  # bytes of the parameters the block holds, per dtype
    peak_mb: float = None     # resident memory gained at the peak of build + first call


def describe(err):
    """One line for a table row: the error type and the first line of its
    message (for MXNet's, the line that says what went wrong)."""
    lines = str(err).strip().splitlines() or [""]
    message = (mxnet_message(err) if isinstance(err, mx.base.MXNetError) else lines[0])[:200]
    name = type(err).__name__
    return message if message.startswith(name) else f"{name}: {message}"


def forward(block, x):
    def run():
        out = block(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        # Waits for the result; bfloat16 widened; a large output copied on
        # the engine, not by asnumpy with an OpenMP team on this thread.
        return as_numpy(out).astype(np.float32)
    return run


def param_bytes(block):
    """Bytes of the parameters `block` holds (what its export writes), per
    dtype name."""
    sizes = collections.Counter()
    for param in block.collect_params().values():
        array = param.data()
        sizes[dtype_name(to_code(array.dtype))] += array.size * np.dtype(array.dtype).itemsize
    return dict(sizes)


def clear_peak_rss():
    """Resets the kernel's peak resident set (VmHWM) of this process; False
    where that is not possible (not Linux)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def child_result(script, spec):
    """Runs `script --child <spec as JSON>` in a fresh process (so no earlier
    measurement's memory hides or adds to it); the last JSON line it prints,
    or {'error': text}."""
    done = subprocess.run([sys.executable, str(script), "--child", json.dumps(spec)],
                          capture_output=True, text=True, cwd=HERE)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def prepare(variant, build, x):
    """Fills `variant` from build() -> (block, convert seconds, notes), runs it
    once on `x` (first-call time, output); a failure is kept in variant.error.
    Notes may be a function, called after that run (a block's graph is there
    only once it has run). Memory: `param_bytes` of the block, and `peak_mb`,
    the peak resident set (VmHWM) during build and first call minus the
    resident set before (earlier variants' blocks stay resident; memory the
    allocator kept from them can be reused unseen, so it is a lower bound)."""
    before = psutil.Process().memory_info().rss if clear_peak_rss() else None
    try:
        variant.block, variant.convert_s, variant.casts = build()
        variant.run = forward(variant.block, x)
        started = time.perf_counter()
        variant.output = variant.run()
        variant.first_s = time.perf_counter() - started
        if callable(variant.casts):
            variant.casts = variant.casts()
        variant.param_bytes = param_bytes(variant.block)
        if before is not None:
            variant.peak_mb = (peak_rss() - before) / 2 ** 20
    except Exception as err:  # the row shows the failure, the others go on
        variant.error = describe(err)
        variant.run = None
    return variant


def cast_counts(block):
    counts = mxamp.summarize(block._cached_graph[1])
    short = {"amp_cast:bfloat16": "bf16", "amp_cast:float32": "fp32", "amp_multicast": "multi"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in counts.items()) or "none"


def backend_summary(block, casts=True):
    """How much of a run block mxamp's oneDNN backend took."""
    onednn = mxamp.backends.get("onednn")
    sym = block._cached_graph[1]
    regions = onednn.regions(sym)
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    outside = sum(n["op"] not in ("null", onednn.REGION_OP) for n in graph["nodes"])
    text = f"{len(regions)} regions/{sum(map(len, regions))} ops, {outside} ops on MXNet"
    return f"{text}, {cast_counts(block)}" if casts else text


def backend_block(source, x, compute=None):
    """mxamp's documented path from a run float32 block: convert_hybrid_block
    (which keeps float32 what MXNet has no bfloat16 kernel for on this CPU),
    then the oneDNN backend (which keeps on MXNet what it cannot speed up);
    `compute` as apply_backend_block's (None: the backend's choice on this
    CPU; "float32": the float32 block straight to the backend)."""
    block = source
    if compute != "float32":
        block = mxamp.convert_hybrid_block(source, target_dtype="bfloat16")
        block(x)  # apply_backend_block takes a block that has run
    return mxamp.gluon.apply_backend_block(block, compute=compute)


def cpu_description(note=""):
    """One line: the CPU model, what MXNet's and oneDNN 3's kernels use of it
    (mxamp.cpu, ISA limits included), its cpus, then `note`."""
    return f"{mxamp.cpu.describe()}, {os.cpu_count()} cpus{note}"


def machine():
    """What --json records of the machine next to every figure."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        onednn = version("onednn-cpu-gomp")
    except PackageNotFoundError:
        onednn = None
    return {"cpu": mxamp.cpu.model(), "identity": mxamp.cpu.identity(),
            "describe": mxamp.cpu.describe(), "cpus": os.cpu_count(), "threads": THREADS,
            "features": {e: mxamp.cpu.features(e).names() for e in mxamp.cpu.ENGINES},
            "isa_limits": {e: mxamp.cpu.features(e).limit for e in mxamp.cpu.ENGINES},
            "mxnet": mx.__version__, "onednn_wheel": onednn, "mxamp": mxamp.__version__}


# The environment variables a run's figures depend on, given with its command.
RUN_VARIABLES = ("OMP_NUM_THREADS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def _git(*args):
    done = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def provenance(script):
    """What --json records of the run: the script (bf16_speed, ...), when it
    started (UTC), the commit it measured ("-dirty" with uncommitted changes
    to tracked files) and the command that repeats it."""
    import datetime
    import shlex
    commit = _git("rev-parse", "--short=12", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    settings = [f"{name}={os.environ[name]}" for name in RUN_VARIABLES if name in os.environ]
    return {"script": script,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit,
            "command": shlex.join([*settings, "python", f"bench/{script}.py", *sys.argv[1:]])}


def mac_rate(label, build, calls=40):
    """The multiply-accumulate rate (GMAC/s, the run's threads) of the blocks
    `build(net, x)` makes of a FullyConnected 2048 -> 2048 at batch 128 and of
    a 3x3 convolution 256 -> 256 at 28x28 (0.5 GMAC each, ~2 ms: short enough
    that on a shared machine some of `calls` runs are not preempted), each
    compute primitive at its fastest run; printed as `label`'s peak.
    Returns {"gmacs": the best, "cases": {layer: GMAC/s}}."""
    cases = {"FullyConnected 2048x2048 b128": (nn.Dense(2048, in_units=2048), (128, 2048)),
             "Convolution 3x3 256x256 28x28": (nn.Conv2D(256, 3, padding=1, in_channels=256),
                                               (1, 256, 28, 28))}
    rates = {}
    for name, (layer, shape) in cases.items():
        net = nn.HybridSequential()
        net.add(layer)
        net.initialize()
        net.hybridize()
        x = mx.nd.random.uniform(-1, 1, shape)
        block = build(net, x)
        primitives, _ = onednn_primitives(lambda: block(x).asnumpy(), calls=calls)
        work = [(macs, ms) for _, ms, macs in primitives.values() if macs]
        rates[name] = sum(m for m, _ in work) / sum(ms for _, ms in work) / 1e6
    best = max(rates, key=rates.get)
    print(f"{label} peak: {rates[best]:.0f} GMAC/s ({best}; " + ", ".join(
        f"{n} {r:.0f}" for n, r in rates.items() if n != best) + ")")
    return {"gmacs": rates[best], "cases": rates}


def fp32_peak():
    """mac_rate of the backend's float32 kernels: the float32 multiply-add
    rate that peak_ratio's multiples scale into each dtype's ISA peak."""
    def float32_backend(net, x):
        net(x)
        return mxamp.gluon.apply_backend_block(net, compute="float32")
    return mac_rate("float32", float32_backend)


def network_flops(prefix, shape):
    """The floating-point operations of the exported model `prefix` on one
    input of `shape` (mxamp.tools.inspection.flops: 2 per multiply-add of the
    matrix products, 1 per output element of the other operators)."""
    sym = mx.sym.load(f"{prefix}-symbol.json")
    return sum(flops(sym, {"data": shape}).values())


def peak_fraction(network, seconds, ratio, fp32_gmacs):
    """The share of its dtype's ISA peak a row reaches: `network` FLOPs in
    `seconds`, against the float32 rate `fp32_gmacs` (2 FLOPs a multiply-add)
    times the row's peak_ratio `ratio`; None without the figures."""
    if not (network and seconds and fp32_gmacs):
        return None
    return network / seconds / (2e9 * fp32_gmacs * ratio)


def peak_ratio(variant_name, computes=None):
    """The CPU's peak multiply-accumulate rate in the dtype a variant computes
    in (`computes`, else read off its name: int8, bf16, else float32) against
    float32's, per core: an upper bound for its speedup. Against AVX-512 /
    AVX2 FMA: VNNI does 4 INT8 MACs per 32-bit lane (4x), without it u8 x s8
    products take 3 instructions (4/3x); AVX512-BF16 does 2 bfloat16 MACs per
    lane (2x); AMX tiles 16x (bfloat16) and 32x (INT8) an AVX-512 core's
    float32 FMAs."""
    name = variant_name.lower()
    engine = "mxnet" if "mxnet" in name or "ref" in name else "onednn"
    dtype = computes or next((t for t in ("int8", "bf16") if t in name), "fp32")
    have = mxamp.cpu.features(engine)
    if dtype == "int8":
        return 32.0 if have.amx else 4.0 if have.vnni else 4 / 3
    if dtype == "bf16":
        return 16.0 if have.amx else 2.0 if have.bf16 else 1.0
    return 1.0


def backend_computes():
    """What the backend's default path computes in on this CPU, in
    peak_ratio's words: "bf16" where oneDNN 3 has bfloat16 dot products at
    least as fast as float32 ones, else "fp32"."""
    speed = mxamp.backends.onednn.bf16_speed()
    return "bf16" if speed is not None and not speed.slower else "fp32"


# ---------------------------------------------------------------- timing

# What a call's time is: wall-clock, or the CPU time of the process that ran
# it (all its threads). On a shared machine other jobs stretch the first and
# barely move the second, which with OMP_NUM_THREADS=1 is one core's time.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK_NAMES = {"wall": "wall-clock", "cpu": "CPU time of the process running it"}


def time_interleaved(variants, warmup, runs, clock="wall", burst=1):
    """Each round, every live variant runs `burst` batches back to back and
    its time for the round is the burst's over `burst`; the order rotates
    each round, so drift on a shared machine hits every variant alike.
    With burst 1 each call follows another variant's (caches cold: the
    latency of a call out of the blue), with more all but the first follow
    their own (warm: a serving loop's). `clock` is a key of CLOCKS
    (self-timed variants run the burst themselves and answer every clock's
    time)."""
    now = CLOCKS[clock]
    live = [v for v in variants if v.run is not None or v.served is not None]
    for round_index in range(warmup + runs):
        shift = round_index % max(len(live), 1)
        for variant in live[shift:] + live[:shift]:
            timer = variant.served or (variant.run if variant.self_timed else None)
            if timer is not None:
                seconds = timer(burst)[clock]
            else:
                started = now()
                for _ in range(burst):
                    variant.run()
                seconds = (now() - started) / burst
            if round_index >= warmup:
                variant.times.append(seconds)


def timing_header(args):
    """The header's words on how the scripts time (parse_arguments' args)."""
    calls = "1 call" if args.burst == 1 else f"a burst of {args.burst} calls"
    return (f"runs {args.runs} after {args.warmup} warm-up, {calls} per variant per round; "
            f"times are per batch (median, {CLOCK_NAMES[args.clock]})")


def timing_settings(args):
    """What --json records of how the scripts time."""
    return {"runs": args.runs, "warmup": args.warmup, "clock": args.clock, "burst": args.burst}


def median(variant):
    return statistics.median(variant.times) if variant.times else None


def memory_row(variant):
    """The --json fields of a variant's memory (None for the anchors: they
    run in another process)."""
    sizes = variant.param_bytes
    return {"param_bytes": sizes, "param_mb": None if sizes is None else
            sum(sizes.values()) / 2 ** 20, "peak_rss_mb": variant.peak_mb}


def memory_columns(row):
    """The table's two memory columns: parameters' MB, peak resident MB."""
    return f"{fmt(row['param_mb'], '.1f', 8)}{fmt(row['peak_rss_mb'], '.0f', 8)}"


MEMORY_HEADER = f"{'par MB':>8}{'peak MB':>8}"


def percent(fraction, width=8):
    """A share as a right-aligned percentage ("-" without one)."""
    return fmt(None if fraction is None else 100 * fraction, ".1f", width, "%")


def fmt(value, spec, width, unit=""):
    text = "-" if value is None else f"{value:{spec}}{unit}"
    return f"{text:>{width}}"


# ---------------------------------------------------------------- anchors

class AnchorProcess:
    """bench/onnx_anchor.py running in the anchor venv, driven line by line
    (or `command`, another script serving the same protocol, in `env`), on
    `threads` OpenMP threads (None: OMP_NUM_THREADS left unset); its stderr
    to `stderr` (a file; None: this process's)."""

    def __init__(self, python, command=(str(HERE / "onnx_anchor.py"),), env=None,
                 threads=THREADS, stderr=None):
        env = {k: v for k, v in (env or os.environ).items() if k != "OMP_NUM_THREADS"}
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen([python, *command], env=env, cwd=HERE, stderr=stderr,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the child process {self.proc.args[1]} ended "
                               f"(exit status {self.proc.wait()})")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(answer["error"])
        return answer

    def timer(self, runner):
        """A Variant.run for one of the process's runners (self-timed)."""
        return lambda calls: self.ask(cmd="time", runtime=runner, calls=calls)

    def close(self):
        with contextlib.suppress(OSError):
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def freed(variant):
    """`variant` without its block: its times, output and notes stay. The
    heap glibc kept goes back to the kernel (without it the encoder's run
    still grew to 8.7 GB resident), so the next variant's peak counts it."""
    variant.block = variant.run = None
    gc.collect()
    mx.nd.waitall()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peaks stay lower bounds
        pass
    return variant


def served(variant, server, workdir):
    """`variant` as a server runs it: its block exported, then loaded, run and
    timed (when time_interleaved asks) in the serving child (serving_process), which
    builds nothing. This process cannot time that itself: building (MXNet's
    quantization, MXNet's copies of large arrays from numpy) starts OpenMP
    teams on its main thread, which stay; with the team of the engine thread
    that runs the model, libgomp then lets idle threads sleep at once, and
    every primitive waits to wake them (docs/onednn.md,
    "Threads"). The output, and so the row's error, is the served model's.
    Profiles still run the block here. A block whose export computes
    otherwise than the block does (MXNet's own bfloat16 AMP block, whose
    export computes float32's output) is timed here, with a note."""
    if variant.run is None:
        return variant
    try:
        prefix, output = workdir / "served", workdir / "served-output.npy"
        variant.block.export(str(prefix))
        server.ask(cmd="load", name=variant.name, prefix=str(prefix),
                   input=str(workdir / "input.npy"), output=str(output))
        answer = np.load(output)
        off = relative_error(answer, variant.output)
        if off > 1e-4:  # the same model on the same input: the same values but for rounding
            variant.casts = f"{variant.casts}; timed here: its export's output is {off:.1e} off"
            return variant
        variant.output = answer
        variant.served = lambda calls: server.ask(cmd="time", name=variant.name, calls=calls)
    except Exception as err:  # the row shows the failure, the others go on
        variant.error = f"served: {describe(err)}"
        variant.run = None
    return variant


def serving_process():
    """The serving child of served(): this file with --serve."""
    return AnchorProcess(sys.executable, (str(HERE / "benchlib.py"), "--serve"))


def serve():
    """The serving child: loads the exports of served() and times them on
    request (onnx_anchor.serve's protocol); "keep" frees all but the named."""
    import onnx_anchor

    answers = onnx_anchor.answering()
    mxamp.backends.get("onednn")  # mxamp's exports hold its region operator
    runs = {}

    def load(name, prefix, input, output):
        block = imported(prefix)
        block.hybridize(static_alloc=True, static_shape=True)
        runs[name] = forward(block, to_ndarray(np.load(input)))
        np.save(output, runs[name]())
        return {}

    def keep(names):
        for name in set(runs) - set(names):
            del runs[name]
        gc.collect()
        return {}

    onnx_anchor.serve({"load": load, "keep": keep,
                       "time": lambda name, calls: onnx_anchor.timed_call(runs[name], calls)},
                      answers)


def fill_anchor_variants(variants, anchor, answer, convert_s=None):
    """Fills the anchor `variants` ({runner name: Variant}) from a load or
    quantize answer of the anchor process."""
    for runner, variant in variants.items():
        if runner in answer["errors"]:
            variant.error = answer["errors"][runner]
            continue
        calib = answer.get("calib_s", {}).get(runner)
        variant.convert_s = calib if calib is not None else convert_s
        variant.first_s = answer["load_s"][runner]
        variant.casts = answer["versions"][runner]
        variant.output = np.load(answer["outputs"][runner])
        variant.run = anchor.timer(runner)
        variant.self_timed = True


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


def export_onnx(prefix, shape, path):
    """The exported MXNet model (prefix-symbol.json, prefix-0000.params) as
    ONNX at `path` (opset 13, float32 input of `shape`); returns the seconds."""
    started = time.perf_counter()
    with onnx_opset(13):
        mx.onnx.export_model(f"{prefix}-symbol.json", f"{prefix}-0000.params",
                             [shape], [np.float32], str(path))
    return time.perf_counter() - started


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
    """Creates the anchor venv at `python`'s venv from requirements-anchor.txt."""
    venv = Path(python).parent.parent
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-r", str(HERE / "requirements-anchor.txt")],
                   check=True)


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


def data_types(descriptors):
    """'s8,s8->u8' from a verbose line's memory descriptors (src[,wei]->dst):
    oneDNN 3.2 writes them `src_u8:a:blocked:...`, later 3.x `src:u8::blocked:...`."""
    types = {}
    for md in descriptors.split():
        arg, dtype = re.match(r"([a-z]+?)[_:]([a-z0-9]+)", md).groups()
        types.setdefault(arg, dtype)
    inputs = ",".join(types[a] for a in ("src", "wei") if a in types)
    return f"{inputs}->{types.get('dst', '?')}"


def problem_sizes(problem):
    """A verbose problem string's sizes: 'g32mb1_ic32oc32_ih112oh112kh3...'
    -> {"g": 32, "mb": 1, "ic": 32, ...}."""
    return {name: int(n) for name, n in re.findall(r"([a-z]+)(\d+)", problem)}


def work_macs(kind, problem):
    """Multiply-accumulates of one convolution, inner product or matmul, from
    its verbose problem string (None for other kinds, and for a matmul with
    run-time sizes '*'). A convolution's ic and oc count every group."""
    if kind == "matmul":  # 'BxMxK:BxKxN[:BxMxN]', batch dims broadcast
        try:
            src, wei = ([int(d) for d in part.split("x")] for part in problem.split(":")[:2])
        except ValueError:
            return None
        batch = [max(a, b) for a, b in itertools.zip_longest(
            src[-3::-1], wei[-3::-1], fillvalue=1)]
        return math.prod(batch) * src[-2] * src[-1] * wei[-1]
    size = problem_sizes(problem)
    get = lambda *names: math.prod(size.get(n, 1) for n in names)  # noqa: E731
    if kind == "inner_product":
        return get("mb", "ic", "oc", "id", "ih", "iw")
    if kind == "convolution":
        return get("mb", "ic", "oc", "od", "oh", "ow", "kd", "kh", "kw") // get("g")
    return None


# The prefix of oneDNN's verbose lines: 3.x (mxamp's) writes onednn_verbose,
# 2.x (MXNet 1.9.1's own, linked into libmxnet.so) dnnl_verbose; the fields
# after it are the same.
VERBOSE_PREFIXES = ("onednn_verbose,", "dnnl_verbose,")


def verbose_primitive(line):
    """(kind, implementation, data types, problem, ms) of a verbose exec line
    of oneDNN 2.x or 3.x, None for any other line."""
    fields = line.split(",")
    if not line.startswith(VERBOSE_PREFIXES) or "exec" not in fields:
        return None
    i = fields.index("exec")  # later 3.x put a timestamp and "primitive" before it
    return (fields[i + 2], fields[i + 3], data_types(fields[i + 5]), fields[-2],
            float(fields[-1]))


def verbose_primitives(text):
    """The primitives of a verbose log, in order (verbose_primitive's)."""
    return [p for p in map(verbose_primitive, text.splitlines()) if p is not None]


def verbose_runs(block_run, calls):
    """oneDNN 3 verbose of `calls` runs of `block_run`: per run, the CPU time
    (ms) of a run right after it without the verbose (whose lines cost CPU
    time: about 1 ms of MobileNet v2's 56 primitives here), and its
    primitives in order, as (kind, implementation, data types, problem, ms)."""
    backend = mxamp.backends.get("onednn")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "verbose.txt"
        for _ in range(calls):
            with captured_stdout(log):
                backend.set_verbose(1)
                block_run()
                mx.nd.waitall()
                backend.set_verbose(0)
            runs.append((cpu_ms_of(block_run), verbose_primitives(log.read_text())))
    return runs


def cpu_ms_of(block_run):
    """The CPU time (ms, every thread of this process) of one call."""
    started = time.process_time()
    block_run()
    mx.nd.waitall()
    return 1e3 * (time.process_time() - started)


# Marks the start of each call in bench/mxnet_verbose.py's output.
CALL_MARK = "=== mxnet_verbose call"


def mxnet_verbose_runs(prefix, input_path, block_run, calls):
    """oneDNN 2's verbose of `calls` calls of the MXNet model exported at
    `prefix` on the array saved at `input_path`, in the form of verbose_runs,
    each call's CPU time that of `block_run` (the same model here) without
    the verbose. MXNet links its oneDNN statically and reads DNNL_VERBOSE
    only when it starts, so a child process (bench/mxnet_verbose.py) runs the
    model with it set."""
    done = subprocess.run(
        [sys.executable, str(HERE / "mxnet_verbose.py"), prefix, input_path, str(calls)],
        env={**os.environ, "DNNL_VERBOSE": "1"}, capture_output=True, text=True,
        timeout=1200)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
        raise RuntimeError(f"bench/mxnet_verbose.py failed: {last}")
    logs = done.stdout.split(CALL_MARK + "\n")[1:]
    if len(logs) != calls:
        raise RuntimeError(f"bench/mxnet_verbose.py marked {len(logs)} calls of {calls}")
    return [(cpu_ms_of(block_run), verbose_primitives(log)) for log in logs]


def verbose_calls(ms):
    """Verbose runs for a call of `ms`: 5 to 40, about 4 s of them (the more
    runs, the likelier that some are not preempted on a shared machine)."""
    return max(5, min(40, int(4000 / ms)))


def fastest_primitives(runs):
    """Each primitive's time as its minimum over the runs of verbose_runs,
    matched across runs by its place among the primitives of the same kind,
    implementation, types and problem (the k-th such in one run with the k-th
    in every other). Preemption on a shared machine only adds time, so the
    minimum is the closest to an undisturbed call; the median would keep a
    spike that hits one primitive in most runs. Returns {(kind,
    implementation, types, problem, k): (min ms, median ms)}."""
    placed = []
    for _, primitives in runs:
        seen = collections.Counter()
        timed = {}
        for *what, ms in primitives:
            what = tuple(what)
            timed[what + (seen[what],)] = ms
            seen[what] += 1
        placed.append(timed)
    common = set.intersection(*(set(timed) for timed in placed))
    return {key: (min(t[key] for t in placed), statistics.median(t[key] for t in placed))
            for key in common}


def onednn_primitives(block_run, dtypes=False, calls=5):
    """primitive_totals of oneDNN 3's verbose over `calls` runs of `block_run`."""
    return primitive_totals(verbose_runs(block_run, calls), dtypes)


def primitive_totals(runs, dtypes=False):
    """Runs of verbose_runs' form, each primitive at its fastest
    (fastest_primitives), summed: ({(kind, implementation[, data types]):
    [count, ms, MACs]} per run, {"calls", "primitives", "min_ms",
    "median_ms", "cpu_ms"}: the sums of the primitives' minimum and median
    times against the runs' fastest CPU time). A convolution with groups is
    kind "grouped_convolution"."""
    fastest = fastest_primitives(runs)
    totals = {}
    for (kind, impl, types, problem, _), (ms, _) in fastest.items():
        macs = work_macs(kind, problem) or 0
        if kind == "convolution" and problem_sizes(problem).get("g", 1) > 1:
            kind = "grouped_convolution"
        entry = totals.setdefault((kind, impl) + ((types,) if dtypes else ()), [0, 0.0, 0])
        entry[0] += 1
        entry[1] += ms
        entry[2] += macs
    sums = {"calls": len(runs), "primitives": len(fastest),
            "min_ms": sum(t[0] for t in fastest.values()),
            "median_ms": sum(t[1] for t in fastest.values()),
            "cpu_ms": min(cpu_ms for cpu_ms, _ in runs)}
    return totals, sums


def print_breakdown(variant, calls=3, dtypes=False, top=12):
    """Where `variant` (a block on mxamp's backend) spends one batch: MXNet's
    profiler (backend regions against operators left on MXNet), then oneDNN
    3's primitives inside the regions, each at its fastest of verbose_calls'
    runs. Returns (operators, primitives, their
    sums) as onednn_primitives."""
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
    for name, (count, ms) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"     {name:<34}{count:>6} calls{ms:>10.1f} ms{100 * ms / total:>6.1f}%")
    runs = verbose_calls(total)
    primitives, sums = onednn_primitives(variant.run, dtypes, calls=runs)
    if not primitives:
        return ops, {}, sums
    inside = sums["min_ms"] or 1.0
    print(f"   inside the regions (oneDNN 3 verbose, each of {sums['primitives']} primitives "
          f"at its fastest of {runs} runs): {sums['min_ms']:.1f} ms (at their medians "
          f"{sums['median_ms']:.1f} ms) in a run of {sums['cpu_ms']:.1f} ms CPU time")
    for key, (count, ms, _) in sorted(primitives.items(), key=lambda kv: -kv[1][1])[:top]:
        label = " ".join(key[:2]) + (f" {key[2]}" if dtypes else "")
        print(f"     {label:<56}{count:>5}x{ms:>10.2f} ms{100 * ms / inside:>6.1f}%")
    return ops, {" ".join(k): v for k, v in primitives.items()}, sums


def parse_arguments(doc, model_keys, quick_help, digits_help, extra=(), batches_help=None,
                    burst=1):
    """The options bf16_speed.py and int8_speed.py share, plus `extra`
    (name, default, quick default, help) integer options, and with
    `batches_help` `--batches N [N ...]` (None when not given: the caller's
    default); defaults filled in and checked (`burst`: --burst's), the anchor
    venv made when asked."""
    import argparse
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(model_keys), choices=model_keys)
    parser.add_argument("--runs", type=int, help="timed rounds (default 7, --quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed rounds first (default 2, --quick 1)")
    parser.add_argument("--layers", type=int, help="encoder layers (default 12, --quick 2)")
    for name, _, _, text in extra:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=text)
    if batches_help:
        parser.add_argument("--batches", type=int, nargs="+", help=batches_help)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--no-anchor", action="store_true", help="skip OpenVINO / ONNX Runtime")
    parser.add_argument("--no-profile", action="store_true", help="skip the time breakdown")
    parser.add_argument("--no-digits", action="store_true", help=digits_help)
    parser.add_argument("--anchor-python", default=DEFAULT_ANCHOR_PYTHON,
                        help=f"python of the anchor venv (default {DEFAULT_ANCHOR_PYTHON})")
    parser.add_argument("--setup-anchor", action="store_true",
                        help="create the anchor venv from bench/requirements-anchor.txt first")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="what a call's time is: wall-clock (default), or the CPU time of "
                             "the process running it, for a shared machine (with "
                             "OMP_NUM_THREADS=1: one core's time, which other jobs barely move)")
    parser.add_argument("--burst", type=int, default=burst,
                        help=f"calls back to back per variant per round, timed together "
                             f"(default {burst}; 1: each call follows another model's, caches "
                             f"cold; e.g. 10: warm calls, as a serving loop makes them)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    counts = [("runs", 7, 3), ("layers", ENCODER_LAYERS, 2)] + [(n, d, q) for n, d, q, _ in extra]
    for name, default, quick in counts:
        setattr(args, name, getattr(args, name) or (quick if args.quick else default))
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if min(getattr(args, name) for name, _, _ in counts) < 1 or args.warmup < 0 or \
            args.burst < 1 or min(getattr(args, "batches", None) or [1]) < 1:
        names = [n for n, _, _ in counts] + ["burst"] + ["batches"] * bool(batches_help)
        parser.error(f"{', '.join('--' + n.replace('_', '-') for n in names)} must be "
                     "at least 1, --warmup at least 0")
    if args.setup_anchor:
        setup_anchor(args.anchor_python)
    return args


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
