"""mxamp.optimize: every candidate measured on this CPU, the fastest within
the error budget chosen, float32 when nothing else is, clear errors."""
import json
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxamp
from mxamp import cpu

NAMES = ["float32", "float32 backend", "bfloat16", "bfloat16 backend", "int8", "int8 + bfloat16"]


def small_cnn():
    mx.random.seed(3)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1, activation="relu"), nn.Conv2D(8, 3, padding=1),
            nn.BatchNorm(), nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def batches(n=2):
    return [mx.nd.random.uniform(shape=(4, 3, 16, 16)) for _ in range(n)]


@pytest.mark.cpu
def test_candidates_are_what_this_cpu_can_run():
    net = small_cnn()
    result = mxamp.optimize(net, batches(), max_error=0.05, runs=2)
    by_name = {c.name: c for c in result.candidates}
    assert list(by_name) == NAMES
    built = {n for n, c in by_name.items() if c.block is not None}
    expected = {"float32", "float32 backend", "int8"}
    expected |= {"bfloat16"} if cpu.mxnet_has_bfloat16() else set()
    expected |= {"bfloat16 backend", "int8 + bfloat16"} if cpu.features("onednn").bf16 \
        else set()
    assert built == expected, {n: c.note for n, c in by_name.items()}
    assert by_name["float32"].error == 0 and by_name["float32 backend"].error < 1e-5
    assert all(0 < by_name[n].error < 5e-2 for n in built - {"float32", "float32 backend"})
    fits = [c for c in result.candidates if c.block is not None and c.error <= 0.05]
    assert by_name[result.name].ms == min(c.ms for c in fits)
    assert result.block is by_name[result.name].block
    x = batches(1)[0]
    assert mxamp.verify.relative_error(result.block(x), net(x)) < 5e-2
    table = result.table()
    assert all(name in table for name in NAMES) and f"* {result.name} " in table
    if not cpu.features("onednn").bf16:
        assert "no bfloat16 instructions" in by_name["int8 + bfloat16"].note


def test_a_block_that_has_not_run_gets_every_candidate():
    """A block neither hybridized nor run is traced while its candidates are
    made (each from its cached graph), and put back as it was."""
    net = small_cnn()
    net.hybridize(active=False)
    result = mxamp.optimize(net, batches(1), max_error=0.05, runs=1)
    failed = {c.name: c.note for c in result.candidates if c.note.startswith("failed")}
    assert failed == {}
    backend = next(c for c in result.candidates if c.name == "float32 backend")
    assert backend.block is not None and backend.error < 1e-5
    assert not net._active and not net._cached_graph


def test_a_zero_budget_keeps_float32():
    net = small_cnn()
    result = mxamp.optimize(net, batches(1), max_error=0, runs=1)
    exact = [c for c in result.candidates if c.block is not None and c.error == 0]
    assert "float32" in [c.name for c in exact]  # the reference always fits
    chosen = next(c for c in exact if c.name == result.name)  # the fastest exact one
    assert chosen.ms == min(c.ms for c in exact) and result.block is chosen.block


def test_eval_fn_measures_accuracy_drops():
    net, seen = small_cnn(), []

    def accuracy(block):
        seen.append(block)
        return 0.9 if block is net else 0.5  # every conversion "loses" 0.4
    result = mxamp.optimize(net, batches(1), max_error=0.3, eval_fn=accuracy, runs=1)
    assert result.name == "float32" and result.error_name == "accuracy drop"
    built = [c for c in result.candidates if c.block is not None and c.block is not net]
    assert built and all(c.error == pytest.approx(0.4) for c in built)
    assert seen[0] is net and set(map(id, seen[1:])) >= {id(c.block) for c in built}


@pytest.mark.parametrize("kwargs, error, match", [
    ({"max_error": -1}, mxamp.OptionError, "max_error must be a number >= 0, got -1"),
    ({"max_error": "1%"}, mxamp.OptionError, "max_error must be a number >= 0, got '1%'"),
    ({"eval_fn": 3}, mxamp.OptionTypeError, "eval_fn must be callable"),
    ({"runs": 0}, mxamp.OptionError, "runs must be an integer >= 1, got 0"),
    ({"calib_data": []}, mxamp.OptionError, "no calibration data"),
])
def test_bad_options_are_refused(kwargs, error, match):
    kwargs = {"calib_data": batches(1), **kwargs}
    with pytest.raises(error, match=match):
        mxamp.optimize(small_cnn(), **kwargs)


def test_the_command_line_measures_a_checkpoint(tmp_path):
    net = small_cnn()
    x = batches(1)[0]
    net(x)
    net.export(str(tmp_path / "cnn"))
    np.save(tmp_path / "calib.npy", x.asnumpy())
    run = subprocess.run([sys.executable, "-m", "mxamp", "optimize", str(tmp_path / "cnn"),
                          "--calib", str(tmp_path / "calib.npy"), "--runs", "1", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert [c["name"] for c in answer["candidates"]] == NAMES
    chosen = next(c for c in answer["candidates"] if c["name"] == answer["chosen"])
    assert chosen["error"] <= 0.05 and answer["cpu"] == cpu.describe()
    bad = subprocess.run([sys.executable, "-m", "mxamp", "optimize", str(tmp_path / "cnn"),
                          "--calib", str(tmp_path / "calib.npy"), "--max-error", "-1"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--max-error" in bad.stderr and "Traceback" not in bad.stderr
