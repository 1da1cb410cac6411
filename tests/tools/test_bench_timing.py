"""bench/benchlib.py's interleaved timing with --burst: each round every
variant runs the burst back to back, the order rotating, and its time for
the round is the burst's per call; the anchors (self-timed, in their own
process) run the burst themselves through onnx_anchor.timed_call; the
scripts refuse a burst below 1; the serving child loads, runs and times
exported variants."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import benchlib
    import onnx_anchor
    return SimpleNamespace(lib=benchlib, anchor=onnx_anchor)


class FakeClock:
    """A clock that each fake call moves by `step` seconds."""

    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        return self.now

    def tick(self):
        self.now += self.step


def counting(bench, name, log, clock):
    def run():
        log.append(name)
        clock.tick()
    return bench.lib.Variant(name, run=run)


def test_burst_runs_back_to_back_and_rotates(bench, monkeypatch):
    clock, log = FakeClock(0.25), []
    monkeypatch.setitem(bench.lib.CLOCKS, "wall", clock)
    a, b = counting(bench, "a", log, clock), counting(bench, "b", log, clock)
    idle = bench.lib.Variant("failed")  # no run: left out
    bench.lib.time_interleaved([a, idle, b], warmup=1, runs=2, burst=3)
    assert log == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3 + ["a"] * 3 + ["b"] * 3
    assert a.times == b.times == [0.25, 0.25]  # the burst's 0.75 s per call
    assert idle.times == []


def test_burst_one_is_one_call_per_round(bench, monkeypatch):
    clock, log = FakeClock(0.5), []
    monkeypatch.setitem(bench.lib.CLOCKS, "cpu", clock)
    a, b = counting(bench, "a", log, clock), counting(bench, "b", log, clock)
    bench.lib.time_interleaved([a, b], warmup=0, runs=3, clock="cpu")
    assert log == ["a", "b", "b", "a", "a", "b"]
    assert a.times == b.times == [0.5, 0.5, 0.5]


def test_self_timed_variant_runs_the_burst_itself(bench):
    asked = []

    def run(calls):
        asked.append(calls)
        return {"wall": 0.02, "cpu": 0.01}

    anchor = bench.lib.Variant("anchor", run=run, self_timed=True)
    bench.lib.time_interleaved([anchor], warmup=2, runs=3, clock="cpu", burst=10)
    assert asked == [10] * 5
    assert anchor.times == [0.01] * 3


def test_a_served_variant_freed_here_is_still_timed(bench):
    asked = []
    variant = bench.lib.Variant("served", served=lambda calls: asked.append(calls) or
                                {"wall": 0.03, "cpu": 0.05})  # run None: freed in this process
    bench.lib.time_interleaved([variant], warmup=1, runs=2, burst=4)
    assert asked == [4] * 3
    assert variant.times == [0.03, 0.03]


def test_timed_call_answers_seconds_per_call(bench, monkeypatch):
    wall, cpu = FakeClock(0.3), FakeClock(0.1)
    monkeypatch.setattr(bench.anchor, "time",
                        SimpleNamespace(perf_counter=wall, process_time=cpu))
    calls = []

    def call():
        calls.append(1)
        wall.tick()
        cpu.tick()

    answer = bench.anchor.timed_call(call, 4)
    assert len(calls) == 4
    assert answer == pytest.approx({"wall": 0.3, "cpu": 0.1})


def test_timing_header_and_settings_name_the_burst(bench):
    args = SimpleNamespace(runs=7, warmup=2, clock="cpu", burst=10)
    assert "a burst of 10 calls per variant per round" in bench.lib.timing_header(args)
    assert bench.lib.timing_settings(args) == {"runs": 7, "warmup": 2, "clock": "cpu",
                                               "burst": 10}
    assert "1 call per variant per round" in \
        bench.lib.timing_header(SimpleNamespace(runs=7, warmup=2, clock="wall", burst=1))


@pytest.mark.parametrize("script", ["int8_speed.py", "bf16_speed.py"])
def test_burst_below_one_is_refused(script):
    done = subprocess.run([sys.executable, str(BENCH / script), "--burst", "0", "--no-anchor"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "--burst" in done.stderr and "must be at least 1" in done.stderr


def test_a_served_variant_is_loaded_run_and_timed_in_the_serving_child(bench, tmp_path):
    """served() exports the variant's block; the child (benchlib.py --serve)
    loads it, answers its output (the row's), and times bursts on request."""
    import mxnet as mx
    import numpy as np
    from mxnet.gluon import nn

    net = nn.HybridSequential()
    net.add(nn.Dense(4, in_units=3))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.array([[1.0, 2.0, 3.0]])
    expected = net(x).asnumpy()
    np.save(tmp_path / "input.npy", x.asnumpy())
    server = bench.lib.serving_process()
    try:
        variant = bench.lib.served(bench.lib.Variant("v", run=lambda: None, block=net,
                                                     output=expected), server, tmp_path)
        assert variant.error is None
        np.testing.assert_allclose(variant.output, expected, rtol=1e-6)
        times = variant.served(3)
        assert set(times) == {"wall", "cpu"} and times["wall"] > 0
        server.ask(cmd="keep", names=[])
        with pytest.raises(RuntimeError, match="KeyError"):
            variant.served(1)  # freed
        other = bench.lib.served(bench.lib.Variant("w", run=lambda: None, block=net,
                                                   output=2 * expected, casts="-"),
                                 server, tmp_path)  # its export computes something else
        assert other.served is None and other.run is not None
        assert other.casts == "-; timed here: its export's output is 5.0e-01 off"
    finally:
        server.close()


def variant_name(letter):
    """int8_speed's name of variant d, e, c, c2 (c'), h or i."""
    import int8_speed
    return {"d": int8_speed.NAIVE, "e": int8_speed.ENTROPY, "c": int8_speed.MXNET_INT8,
            "c2": int8_speed.MXNET_ENTROPY, "h": int8_speed.OPENVINO_INT8,
            "i": int8_speed.ANCHOR_INT8["onnxruntime-int8"]}[letter]


def peer_rows(**ms):
    """int8_speed rows: {letter: ms}."""
    return [{"variant": variant_name(k), "ms": v, "rel_err": 0.01} for k, v in ms.items()]


def shared_rounds(bench, **seconds):
    """against_peers' `shared`: {letter: seconds per round} of the rows
    timed again with OpenVINO."""
    return {variant_name(k): bench.lib.Variant(variant_name(k), times=t)
            for k, t in seconds.items()}


def test_the_comparison_takes_the_rounds_shared_with_openvino(bench):
    """Where the fastest peer and mxamp were timed again in OpenVINO's
    rounds, those times pick the fastest peer and make the ratio; each
    row's own rounds' time stays in the record."""
    import int8_speed
    rows = peer_rows(d=90.0, e=95.0, c=300.0, c2=100.0, h=120.0)
    shared = shared_rounds(bench, d=[0.110, 0.100, 0.120], e=[0.1], c=[0.3], c2=[0.13],
                           h=[0.120])
    summary = int8_speed.against_peers(rows, shared)
    assert summary["fastest_peer"] == int8_speed.OPENVINO_INT8  # c' is slower here
    assert summary["peers"][int8_speed.MXNET_ENTROPY]["ms"] == pytest.approx(130.0)
    naive = summary["mxamp"][int8_speed.NAIVE]
    assert naive["ms"] == pytest.approx(110.0) and naive["ms_own_rounds"] == 90.0
    assert naive["vs_fastest_peer"] == pytest.approx(120.0 / 110.0) and naive["same_rounds"]
    assert naive["times_ms_shared"] == pytest.approx([110.0, 100.0, 120.0])


@pytest.mark.parametrize("fastest, same_rounds", [("c", True), ("c2", False), ("i", False)])
def test_without_shared_rounds_each_row_keeps_its_own(bench, fastest, same_rounds):
    """Without OpenVINO's rounds (no anchors), or against ONNX Runtime (in
    rounds of its own), each row's own time counts: the same rounds as
    mxamp's only for MXNet INT8, timed in every one of them."""
    import int8_speed
    ms = {"d": 90.0, "c": 200.0, "c2": 200.0, "i": 200.0, fastest: 100.0}
    shared = {} if fastest != "i" else shared_rounds(bench, d=[0.08], c=[0.2], h=[0.3])
    naive = int8_speed.against_peers(peer_rows(**ms), shared)["mxamp"][int8_speed.NAIVE]
    expected = 90.0 if fastest != "i" else 80.0
    assert naive["ms"] == pytest.approx(expected)
    assert naive["vs_fastest_peer"] == pytest.approx(100.0 / expected)
    assert naive["same_rounds"] is same_rounds
