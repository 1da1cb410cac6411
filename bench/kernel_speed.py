"""Which of MXNet 1.9.1's low-precision CPU kernels are too slow to use:
measures this CPU's class and writes it into the package's speed data,
mxamp/convert/kernel_speed.json (read by mxamp.convert.probe.slowdown).

    python bench/kernel_speed.py [--repeats N] [--dtypes bfloat16 float16] [--out PATH]

The class is mxamp.convert.probe.cpu_class() (AVX2, AVX512_CORE,
AVX512_CORE_BF16, AVX512_CORE_AMX); run under DNNL_MAX_CPU_ISA=<limit> to
measure a lesser class on a bigger CPU. Entries of other classes in the file
are kept; a class never measured names the nearest measured one.

What is timed: every operator the default lists let run in a low precision
because its inputs arrive so (neutral, follow and widest-type operators:
the only ones conversion asks the speed of), with default attributes, in
every act_type / pool_type variant, and with the attributes the nodes of
three networks carry (ResNet-18 v1, MobileNet v2, one BERT-sized encoder
layer). For each, probe.timed gives the low-precision time over the float32
time on the same synthetic inputs (batch 64; float32 and low interleaved,
best of three per kernel). That is repeated --repeats times, every operator
once per round in a rotating order, so that a busy machine slows all alike;
the file keeps the median per operator and the largest median where several
configurations share one entry.
"""
import argparse
import collections
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# One thread (before MXNet starts its pool): on a shared machine a one-thread kernel is
# the least disturbed, and the element-wise kernels this is about barely use more.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import mxnet as mx  # noqa: E402

from mxamp import cpu  # noqa: E402
from mxamp.convert import probe  # noqa: E402
from mxamp.dtypes import DTYPE_CODES  # noqa: E402
from mxamp.graph import node_types  # noqa: E402
from mxamp.policy import Category, resolve  # noqa: E402
from mxamp.registry import canonical_op_names  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

TIMED = (Category.NEUTRAL, Category.FOLLOW, Category.WIDEST)
# Not operators of inference graphs (_NoGradient crashes MXNet when run alone).
SKIPPED = ("_backward", "_contrib_backward", "_np", "_random", "_sample", "_image", "_cv",
           "_NoGradient", "_CrossDeviceCopy")
KINDS = {"Activation": ("relu", "sigmoid", "tanh", "softrelu", "softsign"),
         "LeakyReLU": ("leaky", "elu", "selu", "gelu"),
         "Pooling": ("max", "avg", "sum")}
KIND_ATTRS = {"Activation": "act_type", "LeakyReLU": "act_type", "Pooling": "pool_type"}
EXTRA_ATTRS = {"Pooling": (("kernel", "(2, 2)"),), "clip": (("a_max", "6"), ("a_min", "0"))}
# The nearest class to stand in for one never measured, in order of preference.
NEAREST = {"AVX512_CORE_AMX": ("AVX512_CORE_BF16", "AVX512_CORE", "AVX2"),
           "AVX512_CORE_BF16": ("AVX512_CORE_AMX", "AVX512_CORE", "AVX2"),
           "AVX512_CORE": ("AVX512_CORE_BF16", "AVX2", "AVX512_CORE_AMX"),
           "AVX2": ("AVX512_CORE", "AVX512_CORE_BF16", "AVX512_CORE_AMX")}
WHY = {
    "AVX512_CORE_AMX": "not measured (no AMX CPU at hand): MXNet 1.9.1's oneDNN 2 uses AMX "
                       "only in Convolution / FullyConnected, which conversion never times; "
                       "the kernels timed here are the same element-wise code on both",
    "AVX512_CORE": "not measured: bfloat16 Convolution / FullyConnected are emulated by "
                   "oneDNN 2 here (never timed); the element-wise kernels timed here are "
                   "the same code",
    "AVX2": "not measured: MXNet 1.9.1 has no bfloat16 Convolution / FullyConnected here "
            "(found by running them), so little runs in bfloat16; the element-wise kernels "
            "timed here are the same code",
}
ABOUT = ("How many times longer MXNet 1.9.1's low-precision CPU kernel of an operator takes "
         "than its float32 kernel, per CPU class and target dtype (written by "
         "bench/kernel_speed.py; see its docstring for how). Conversion for the CPU keeps an "
         "operator float32 when its entry exceeds mxamp.convert.probe.SLOWER and it would run "
         "low only because its inputs arrive low; operators without an entry are taken as "
         "fast. A class with 'same_as' was not measured and uses that class's entries.")


def _configs(dtype):
    """(op, attrs pairs, number of inputs) to time for `dtype`."""
    policy = resolve(dtype, None, None, None, None, None, True)
    timed_ops = {op for op in set(canonical_op_names().values())
                 if not op.startswith(SKIPPED) and policy.category(op, "", {}) in TIMED}
    configs = set()
    for op in timed_ops:
        kinds = [((KIND_ATTRS[op], kind),) for kind in KINDS.get(op, ())] or [()]
        for kind in kinds:
            for n in (1, 2, 3):
                configs.add((op, tuple(sorted(EXTRA_ATTRS.get(op, ()) + kind)), n))
    for node in benchlib.network_nodes():
        if node[0] in timed_ops:
            configs.add(node)
    return sorted(configs)


def _questions(dtype):
    """(key, question for probe.timed) of each configuration with a
    low-precision kernel here."""
    target = DTYPE_CODES[dtype]
    found = []
    for op, attrs, n in _configs(dtype):
        info = node_types(op, attrs, (-1,) * n, target)
        if info is None:
            continue
        question = (op, attrs, tuple(info[0]), dtype, mx.cpu())
        if probe.has_kernel(*question):
            found.append((probe.kernel_key(op, attrs), question))
    return found


def measure(dtypes, repeats):
    """{dtype: {key: median slowdown}} on this machine."""
    questions = [(dtype, key, q) for dtype in dtypes for key, q in _questions(dtype)]
    print(f"{len(questions)} kernels, {repeats} rounds", file=sys.stderr)
    ratios = collections.defaultdict(list)
    for round_index in range(repeats):
        shift = round_index * len(questions) // repeats
        for i, (dtype, key, question) in enumerate(questions[shift:] + questions[:shift]):
            ratio = probe.timed.__wrapped__(*question)  # uncached: a new measurement
            if ratio is not None:
                ratios[(dtype, key, question)].append(ratio)
        print(f"round {round_index + 1}/{repeats} done", file=sys.stderr)
    speeds = {dtype: {} for dtype in dtypes}
    for (dtype, key, _), values in ratios.items():
        median = round(statistics.median(values), 2)
        speeds[dtype][key] = max(median, speeds[dtype].get(key, 0))
    return {dtype: dict(sorted(s.items())) for dtype, s in speeds.items()}


def write(path, name, speeds, repeats):
    """Merges class `name`'s measurement into the data file at `path` (whole
    or not at all)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    classes = {k: v for k, v in data.get("classes", {}).items() if "speeds" in v}
    classes[name] = {
        "measured": {
            "cpu": cpu.describe(), "date": datetime.date.today().isoformat(),
            "mxnet": mx.__version__, "threads": os.environ["OMP_NUM_THREADS"],
            "how": f"probe.timed (batch 64, float32 and low interleaved, best of 3) repeated "
                   f"{repeats} times in rotating order; median per operator, largest median "
                   f"per entry; on a machine shared with other jobs"},
        "speeds": speeds}
    measured = set(classes)
    for other in NEAREST:
        if other not in measured:
            stand_in = next(c for c in NEAREST[other] if c in measured)
            classes[other] = {"same_as": stand_in, "why": WHY.get(other, "not measured")}
    default = next(c for c in ("AVX512_CORE_BF16",) + NEAREST["AVX512_CORE_BF16"]
                   if "speeds" in classes.get(c, {}))  # for a class this file does not know
    out = {"about": ABOUT, "threshold": probe.SLOWER, "default": default,
           "classes": dict(sorted(classes.items()))}
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(out, f, indent=1, sort_keys=False)
        f.write("\n")
    os.chmod(f.name, 0o644)  # package data: readable by all, as the checkout's other files
    os.replace(f.name, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16"],
                        choices=["bfloat16", "float16"])
    parser.add_argument("--out", type=Path, default=probe.SPEEDS)
    args = parser.parse_args()
    name = probe.cpu_class()
    print(f"measuring {name}: {cpu.describe()}", file=sys.stderr)
    write(args.out, name, measure(args.dtypes, args.repeats), args.repeats)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
