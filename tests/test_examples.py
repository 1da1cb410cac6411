"""Every script in example/ runs on this CPU (small inputs) and reports what
it did: casts, error against float32, speed, and whether low-precision
operators ran natively or emulated, as mxamp.cpu says they must here.
Tolerances: relative L2 error bfloat16 3e-2 (ResNet-18 on random weights
measures 6e-3), INT8 5e-2 on the trained digits CNN (measured 1.5e-2 to
2.5e-2), accuracy drop 0.02 for INT8 and 0.05 for AMP training."""
import os
import re
import subprocess
import sys

import pytest

from mxamp import cpu

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "example")
MXNET_BF16 = cpu.mxnet_has_bfloat16()
ONEDNN_BF16 = cpu.features("onednn").bf16

# MXNet's default logging: the command line, run in the test process by
# click's CliRunner in other tests, sets MXNET_SUBGRAPH_VERBOSE=0 there.
DEFAULT_ENV = {k: v for k, v in os.environ.items() if k != "MXNET_SUBGRAPH_VERBOSE"}

def run(script, *args):
    """The script's stdout; it runs with MXNet's default logging, and
    nothing but mxamp's own warnings (operators without a kernel under an
    ISA limit) reaches stderr: no MXNet log line, no MXNet warning."""
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args],
                          capture_output=True, text=True, timeout=600,
                          env=DEFAULT_ENV)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("mxamp ")] == []
    return done.stdout


def number(pattern, text):
    match = re.search(pattern, text, re.M)
    assert match, f"{pattern!r} not in:\n{text}"
    return float(match.group(1))


def test_every_example_is_tested_and_described():
    tested = {"convert_gluon.py", "convert_checkpoint.py", "zoo_batch.py", "quantize_int8.py",
              "train_amp.py", "onednn_backend.py", "foreach_rnn.py"}
    helpers = {"digits.py", "timing.py"}  # the examples import them; they print nothing
    assert set(f for f in os.listdir(EXAMPLES) if f.endswith(".py")) == tested | helpers
    with open(os.path.join(EXAMPLES, "README.md")) as f:
        readme = f.read()
    table = set(re.findall(r"^\| `(\w+\.py)` \|", readme, re.M))
    assert table == tested  # one row per example, with its command
    assert all(f"python example/{name} " in readme for name in tested)
    listed = set(re.findall(r"^- `(\w+\.py)`: ", readme, re.M))
    assert listed == helpers


@pytest.mark.cpu
def test_convert_gluon():
    out = run("convert_gluon.py", "--size", "32")
    # resnet18_v1: one cast down per Convolution / FullyConnected input chain
    # (20 convolutions, 2 shortcut inputs shared, the dense) and one back up
    assert "casts {'amp_cast:bfloat16': 23, 'amp_cast:float32': 1}" in out
    assert number(r"relative error vs float32: (\S+),", out) < 3e-2
    if MXNET_BF16:
        assert "run natively" in out
        assert re.search(r"speed: float32 [\d.]+ ms, bfloat16 [\d.]+ ms", out)
    else:
        assert "run emulated (no kernel on this CPU for " in out
        assert "speed: not measured" in out


@pytest.mark.cpu
@pytest.mark.parametrize("ctx", ["any", "cpu"])
def test_convert_checkpoint(ctx):
    out = run("convert_checkpoint.py", "--shape", "1,3,32,32", "--ctx", ctx)
    error = number(r"relative error vs float32 (\S+),", out)
    if ctx == "cpu" and not MXNET_BF16:
        assert "casts {}, 0 of 62 parameters stored in bfloat16" in out
        assert "nothing runs in bfloat16: this CPU has no bfloat16 kernels" in out
        assert error == 0
        return
    # cast_optional_params: the 21 weights and the dense bias are stored in bfloat16
    assert "22 of 62 parameters stored in bfloat16" in out
    assert number(r"float32 -> (\S+) MiB", out) < 0.6 * number(r"params file: (\S+) MiB", out)
    assert 0 < error < 3e-2
    assert ("run natively" in out) == MXNET_BF16


@pytest.mark.cpu
def test_zoo_batch(tmp_path):
    out = run("zoo_batch.py", "resnet18_v1", "resnet34_v1", "--size", "64", "--out", tmp_path)
    for name in ("resnet18_v1", "resnet34_v1"):
        for stage in ("build", "bfloat16 convert", "bfloat16 verify", "bfloat16 export"):
            assert f"  {name}: {stage}\n" in out
        written = [str(tmp_path / f"{name}-bfloat16-{f}") for f in ("symbol.json", "0000.params")]
        assert re.search(rf"^{re.escape(name)} \(bfloat16\): casts .*wrote "
                         rf"{re.escape(', '.join(written))} .* verified "
                         f"{'native' if MXNET_BF16 else 'emulated'}$", out, re.M)
        assert all(os.path.getsize(path) > 0 for path in written)
    errors = re.findall(r"^\S+ +bfloat16 +random +ok +(\S+)", out, re.M)
    assert len(errors) == 2 and all(float(e) < 3e-2 for e in errors)


@pytest.mark.cpu
def test_quantize_int8():
    out = run("quantize_int8.py", "--epochs", "3", "--calib", "64", "--calib-mode", "naive")
    fp32 = number(r"float32 ([\d.]+), INT8", out)
    int8 = number(r"INT8 ([\d.]+)\n", out)
    assert fp32 > 0.9  # a trained model, not random weights
    assert int8 > fp32 - 0.02
    assert number(r"scores vs float32: (\S+)\n", out) < 5e-2
    assert "saved, and loaded by mxamp.load as int8 on the oneDNN backend: the same scores" in out
    vnni = "with VNNI" if cpu.features("onednn").vnni else "without VNNI"
    assert re.search(rf"speed on the test set: float32 [\d.]+ ms, INT8 [\d.]+ ms \([\d.]+x; "
                     rf"{vnni}", out)


@pytest.mark.cpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_foreach_rnn(dtype):
    out = run("foreach_rnn.py", "--dtype", dtype)
    # +5 before the loop: the input sequence and both Dense layers' weight and bias
    assert f"casts before the loop: {{'amp_cast:{dtype}': 5}}" in out
    # inside: the float32 state for h2h (+1 low); the step's sum back to float32
    # for tanh (float32 where bfloat16 tanh measures slower) or tanh's result for
    # the state (+1 float32), and in float16 the state's copy, neutral there (+1)
    inside = number(r"casts inside subgraph 0 of \S+: \{'amp_cast:\w+': 1, "
                    r"'amp_cast:float32': (\d)\}", out)
    assert inside == (2 if dtype == "float16" else 1)
    assert number(r"relative error vs float32: (\S+),", out) < (3e-2 if dtype == "bfloat16"
                                                                 else 5e-3)
    if dtype == "bfloat16" and MXNET_BF16:
        assert "run natively" in out
        assert re.search(r"speed: float32 [\d.]+ ms, bfloat16 [\d.]+ ms", out)
    else:
        assert "run emulated" in out and "speed: not measured" in out


@pytest.mark.cpu
def test_train_amp():
    out = run("train_amp.py", "--epochs", "2")
    dtype = "bfloat16" if MXNET_BF16 else "float16"
    fp32 = number(r"^float32: test accuracy ([\d.]+)", out)
    amp = number(rf"^{dtype} AMP: test accuracy ([\d.]+)", out)
    assert fp32 > 0.8 and amp > fp32 - 0.05
    assert re.search(rf"{dtype} AMP: .* loss scale now \d+", out)
    # MXNet 1.9.1 has no float16 Convolution / FullyConnected on CPUs: float32 there
    for layer in ("Convolution", "FullyConnected"):
        runs_in = "bfloat16" if MXNET_BF16 else "float32"
        assert f"{layer} runs in {runs_in} under mxamp.init('{dtype}')" in out


@pytest.mark.cpu
def test_onednn_backend():
    out = run("onednn_backend.py", "--size", "32")
    compute = "bfloat16" if ONEDNN_BF16 else "float32"
    # ResNet-18: one region; bfloat16 also offloads the casts (68 operators + 24)
    assert (f"resnet18_v1 on the oneDNN backend ({compute}): 1 region(s) holding "
            f"{92 if ONEDNN_BF16 else 68} operators") in out
    assert number(r"relative error vs float32: (\S+)\n", out) < (3e-2 if ONEDNN_BF16 else 1e-4)
    assert re.search(r"speed: .*oneDNN backend [\d.]+ ms", out)
    if not ONEDNN_BF16:
        assert "this CPU has no bfloat16 instructions for oneDNN" in out
