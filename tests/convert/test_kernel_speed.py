"""Conversion for the CPU does not time kernels: which MXNet kernels are too
slow in low precision comes from the speed data shipped for the CPU's class
(bench/kernel_speed.py writes it), so a loaded machine converts as an idle
one does. ``measure_kernels=True`` times them here instead."""
import contextlib
import json
import os
import subprocess
import sys

import mxnet as mx
import pytest

import mxamp
from graphs import structure
from mxamp import cpu
from mxamp.convert import probe

CLASSES = ("AVX2", "AVX512_CORE", "AVX512_CORE_BF16", "AVX512_CORE_AMX")


def resnet18():
    from gluoncv import model_zoo
    net = model_zoo.get_model("resnet18_v1", pretrained=False)
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((1, 3, 32, 32)))
    return net


def graph_text(block):
    return block._cached_graph[1].tojson(remove_amp_cast=False)


def forget_probes():
    for cached in (probe.has_kernel, probe.slowdown, probe._fitting_shapes):
        cached.cache_clear()


@pytest.fixture
def no_timing(monkeypatch):
    def timed(*question):
        raise AssertionError(f"a kernel was timed: {question}")
    monkeypatch.setattr(probe, "timed", timed)


@contextlib.contextmanager
def cpu_hog():
    """A busy loop per core while the body runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.cpu
def test_a_conversion_under_load_is_byte_identical(no_timing):
    """ResNet-18 v1 for the CPU under a busy loop per core: the graph is the
    one converted before the load began (with the probes' caches cleared, so
    that the existence of each kernel is asked again under load)."""
    net = resnet18()
    forget_probes()
    idle = graph_text(mxamp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu()))
    forget_probes()
    with cpu_hog():
        loaded = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
    assert graph_text(loaded) == idle


def tanh_clip():
    data = mx.sym.var("data")
    return mx.sym.clip(mx.sym.tanh(data, name="t"), 0, 1, name="c")


LISTS = dict(target_dtype_ops=["tanh"], fp32_ops=[], conditional_fp32_ops=[])


def test_measure_kernels_times_the_kernels_here(monkeypatch):
    """clip follows tanh into bfloat16; measured 10x slower here, it stays
    float32, and the WARNING says it was timed on this machine."""
    asked = []

    def timed(op, attrs, in_types, dtype, ctx):
        asked.append(op)
        return 10.0
    monkeypatch.setattr(probe, "timed", timed)
    probe.slowdown.cache_clear()
    sym = mxamp.convert_symbol(tanh_clip(), target_dtype="bfloat16", ctx=mx.cpu(),
                               measure_kernels=True, **LISTS)
    assert asked == ["clip"]
    assert structure(sym)[1]["c"] == (("amp_cast", "float32", ("t", 0)),)


def test_shipped_speeds_decide_without_timing(no_timing, monkeypatch, caplog):
    """The shipped entry decides: clip's entry made 10x, then 1x."""
    speeds = probe.speed_data()["classes"][probe.measured_class(probe.cpu_class())]["speeds"]
    monkeypatch.setitem(speeds, "bfloat16", {**speeds["bfloat16"], "clip": 10.0})
    probe.slowdown.cache_clear()
    sym = mxamp.convert_symbol(tanh_clip(), target_dtype="bfloat16", ctx=mx.cpu(), **LISTS)
    assert structure(sym)[1]["c"] == (("amp_cast", "float32", ("t", 0)),)
    assert "as measured on" in caplog.text
    monkeypatch.setitem(speeds, "bfloat16", {**speeds["bfloat16"], "clip": 1.0})
    probe.slowdown.cache_clear()
    sym = mxamp.convert_symbol(tanh_clip(), target_dtype="bfloat16", ctx=mx.cpu(), **LISTS)
    assert structure(sym)[1]["c"] == (("t", 0),)
    probe.slowdown.cache_clear()


def test_measure_kernels_must_be_a_bool():
    with pytest.raises(TypeError, match="measure_kernels must be True or False, got 'yes'"):
        mxamp.convert_symbol(tanh_clip(), target_dtype="bfloat16", ctx=mx.cpu(),
                             measure_kernels="yes")


def test_the_speed_data_covers_every_class_and_says_how_it_was_measured():
    data = json.loads(probe.SPEEDS.read_text())
    assert "bench/kernel_speed.py" in data["about"]
    measured = {name for name, entry in data["classes"].items() if "speeds" in entry}
    assert "AVX512_CORE_BF16" in measured  # this project's bfloat16 CPUs
    for name in CLASSES:
        assert probe.measured_class(name) in measured
    for name in measured:
        how = data["classes"][name]["measured"]
        assert how["cpu"] and how["date"] and "repeated" in how["how"]
    amx = data["classes"]["AVX512_CORE_AMX"]
    assert amx["same_as"] in measured and amx["why"].startswith("not measured")
    # MobileNet v2's ReLU6: MXNet 1.9.1's bfloat16 clip converts element by element.
    assert data["classes"]["AVX512_CORE_BF16"]["speeds"]["bfloat16"]["clip"] > probe.SLOWER


def test_kernel_keys_tell_kernels_of_one_operator_apart():
    assert probe.kernel_key("Activation", (("act_type", "relu"),)) == "Activation(act_type=relu)"
    assert probe.kernel_key("clip", (("a_max", "6"), ("a_min", "0"))) == "clip"


@pytest.mark.cpu
def test_the_cpu_class_is_what_mxnet_sees():
    """Under DNNL_MAX_CPU_ISA=AVX2 (CI's rerun) the class is AVX2, which
    stands in the nearest measured class's entries."""
    mxnet = cpu.features("mxnet")
    expected = ("AVX512_CORE_AMX" if mxnet.amx else "AVX512_CORE_BF16" if mxnet.bf16
                else "AVX512_CORE" if mxnet.avx512 else "AVX2")
    assert probe.cpu_class() == expected
    source = probe.speed_source(False)
    assert source.startswith(f"as measured on {probe.measured_class(expected)} CPUs")
    if probe.measured_class(expected) != expected:
        assert f"standing in for {expected}" in source


def test_an_avx2_limit_gives_the_avx2_class_and_no_bfloat16_kernels():
    code = ("import mxnet as mx; from mxamp.convert import probe; "
            "print(probe.cpu_class(), probe.has_kernel('FullyConnected', "
            "(('num_hidden', '8'),), (-1, -1, -1), 'bfloat16', mx.cpu()))")
    env = {**os.environ, **cpu.limited("AVX2")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["AVX2", "False"]


READS_IN_A_NEW_PROCESS = """
import sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0]))
                 if event == "open" and isinstance(args[0], str) else None)
import mxnet as mx, mxamp
from mxnet.gluon import nn
net = nn.HybridSequential()
net.add(nn.Conv2D(8, 3), nn.HybridLambda(lambda F, x: F.clip(x, 0, 6)), nn.Conv2D(8, 3),
        nn.HybridLambda(lambda F, x: F.sigmoid(x)), nn.Dense(4))
net.initialize()
net.hybridize()
net(mx.nd.ones((1, 3, 8, 8)))
for _ in range(3):
    mxamp.convert_hybrid_block(net, target_dtype="bfloat16")
print(sum(p == "/proc/cpuinfo" for p in opened), sum(p.endswith("kernel_speed.json") for p in opened))
"""


@pytest.mark.cpu
def test_the_per_cpu_data_is_read_once_per_process():
    """/proc/cpuinfo and the speed data are each read once in a process,
    however many conversions and operators (clip, sigmoid) consult them:
    counted by every file Python opens. Without bfloat16 kernels nothing
    runs low, and the speed data is not read."""
    done = subprocess.run([sys.executable, "-c", READS_IN_A_NEW_PROCESS], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cpuinfo, speeds = map(int, done.stdout.split())
    assert (cpuinfo, speeds) == (1, 1 if cpu.mxnet_has_bfloat16() else 0)
