"""bench/benchlib.py's share of the ISA's peak: each row's FLOPs per second
against the float32 multiply-add rate measured here times the row's ISA
multiple, the multiple of the default path's row taken from what the
backend computes in on this CPU, the network's FLOPs counted on its graph."""
import math
from pathlib import Path

import mxnet as mx
import pytest
from mxnet.gluon import nn

from mxamp import cpu
from mxamp.backends import onednn

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import benchlib
    return benchlib


def test_the_multiple_follows_the_dtype_a_row_computes_in(bench):
    have = cpu.features("onednn")
    bf16 = 16.0 if have.amx else 2.0 if have.bf16 else 1.0
    int8 = 32.0 if have.amx else 4.0 if have.vnni else 4 / 3
    assert bench.peak_ratio("h onednn3 fp32") == 1.0
    assert bench.peak_ratio("i onednn3 bf16") == bf16
    assert bench.peak_ratio("d mxamp int8 naive") == int8
    # the name says bf16, the backend computed float32 (or the other way)
    assert bench.peak_ratio("g mxamp bf16", "fp32") == 1.0
    assert bench.peak_ratio("e mxamp+onednn", "bf16") == bf16


@pytest.mark.parametrize("speed, computes", [(None, "fp32"), (onednn.Bf16Speed(2.2, "t"), "fp32"),
                                             (onednn.Bf16Speed(0.5, "t"), "bf16")])
def test_the_default_path_computes_what_the_backend_chooses(bench, monkeypatch, speed, computes):
    monkeypatch.setattr(onednn, "bf16_speed", lambda measure=False: speed)
    assert bench.backend_computes() == computes


def test_the_share_is_flops_per_second_over_the_scaled_float32_rate(bench):
    # 2 GFLOP in a second is 1 GMAC/s: all of a 1 GMAC/s float32 peak, half of
    # a dtype's at twice that
    assert bench.peak_fraction(2e9, 1.0, 1.0, 1.0) == pytest.approx(1.0)
    assert bench.peak_fraction(2e9, 1.0, 2.0, 1.0) == pytest.approx(0.5)
    assert bench.peak_fraction(2e9, 0.5, 4.0, 10.0) == pytest.approx(0.05)
    assert bench.peak_fraction(None, 1.0, 1.0, 1.0) is None
    assert bench.peak_fraction(2e9, 1.0, 1.0, None) is None
    assert bench.percent(0.125) == "   12.5%" and bench.percent(None) == "       -"


def test_a_networks_flops_are_counted_on_its_export(bench, tmp_path):
    net = nn.HybridSequential()
    net.add(nn.Dense(3, in_units=4))
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((2, 4)))
    net.export(str(tmp_path / "dense"))
    # 2 x 3 outputs of 4 multiply-adds each
    assert bench.network_flops(str(tmp_path / "dense"), (2, 4)) == 2 * (2 * 3 * 4)


def test_the_float32_peak_is_measured_on_both_layers(bench):
    peak = bench.fp32_peak()
    assert set(peak["cases"]) == {"FullyConnected 2048x2048 b128",
                                  "Convolution 3x3 256x256 28x28"}
    assert all(math.isfinite(r) and r > 0 for r in peak["cases"].values())
    assert peak["gmacs"] == max(peak["cases"].values())
