"""Whether this CPU's bfloat16 dot products outrun its float32 ones
(mxamp.backends.onednn.bf16_speed): from the shipped data for a CPU it holds,
else measured once per process through the backend library."""
import json
import re

import pytest

from isa import needs
from mxamp import cpu
from mxamp.backends import onednn

OTHER_CPU = "AuthenticAMD family 25 model 17"


def features():
    return " ".join(cpu.features("onednn").names())


def test_the_shipped_data_names_cpus_with_their_features_and_slowdown():
    data = json.loads(onednn.SPEEDS.read_text())
    assert data["cpus"], "no CPU measured"
    for name, entry in data["cpus"].items():
        assert re.fullmatch(r"\S+ family \d+ model \d+", name), name  # cpu.identity()
        assert set(entry["features"].split()) <= set(cpu.FEATURES) and entry["slowdown"] > 0


@needs("bf16")
@pytest.mark.parametrize("slowdown, slower", [(0.5, False), (2.4, True)])
def test_a_cpu_in_the_data_is_not_measured(monkeypatch, slowdown, slower):
    monkeypatch.setattr(cpu, "identity", lambda: OTHER_CPU)
    monkeypatch.setattr(onednn, "speed_data", lambda: {"cpus": {OTHER_CPU: {
        "features": features(), "slowdown": slowdown}}})
    monkeypatch.setattr(onednn, "_measured", lambda: pytest.fail("measured"))
    speed = onednn.bf16_speed()
    assert speed == onednn.Bf16Speed(slowdown, f"bf16_speed.json, {OTHER_CPU}")
    assert speed.slower is slower


@needs("bf16")
def test_other_features_or_an_explicit_request_measure(monkeypatch):
    """An entry for this CPU with other oneDNN features (an ISA limit) is
    not this CPU as oneDNN runs it; measure=True measures whatever the data
    says (clearing the process's cached measurement first)."""
    monkeypatch.setattr(cpu, "identity", lambda: OTHER_CPU)
    measured = onednn.Bf16Speed(2.4, "measured here")
    cleared = []
    monkeypatch.setattr(onednn, "_measured", lambda: measured)
    monkeypatch.setattr(onednn._measured, "cache_clear", lambda: cleared.append(1),
                        raising=False)
    # the features this CPU lacks: never what oneDNN runs on it
    other = " ".join(f for f in cpu.FEATURES if f not in features().split())
    monkeypatch.setattr(onednn, "speed_data", lambda: {"cpus": {OTHER_CPU: {
        "features": other, "slowdown": 0.1}}})
    assert onednn.bf16_speed() is measured and cleared == []
    monkeypatch.setattr(onednn, "speed_data", lambda: {"cpus": {OTHER_CPU: {
        "features": features(), "slowdown": 0.1}}})
    assert onednn.bf16_speed().slowdown == 0.1
    assert onednn.bf16_speed(measure=True) is measured and cleared == [1]


@pytest.mark.cpu
def test_the_library_measures_bfloat16_against_float32():
    """The backend library's own timing: a ratio on a CPU with bfloat16 dot
    products (any ratio: this depends on the CPU; well inside 0.05-20 for
    every CPU measured), 0 (no answer) where oneDNN has none, as under
    DNNL_MAX_CPU_ISA=AVX2."""
    slowdown = onednn._library(onednn.load()).mxamp_onednn_bf16_slowdown(3)
    if cpu.features("onednn").bf16:
        assert 0.05 < slowdown < 20
        speed = onednn.bf16_speed(measure=True)
        assert speed.source == "measured here, fastest of 10 interleaved calls"
        assert 0.05 < speed.slowdown < 20
    else:
        assert slowdown == 0 and onednn.bf16_speed() is None and \
            onednn.bf16_speed(measure=True) is None


@needs("bf16")
def test_a_failed_timing_is_an_error_not_a_figure(monkeypatch):
    """The library answers -1 where oneDNN threw while timing (a C++
    exception must not cross into ctypes); that is a BackendError saying how
    to choose without timing, never a slowdown of -1 (which would read as
    'bfloat16 is faster')."""
    class Failing:
        @staticmethod
        def mxamp_onednn_bf16_slowdown(rounds):
            return -1.0
    monkeypatch.setattr(onednn, "_library", lambda lib: Failing)
    onednn._measured.cache_clear()
    try:
        with pytest.raises(onednn.BackendError, match=r"failed to time .* compute='float32'"):
            onednn.bf16_speed(measure=True)
    finally:
        onednn._measured.cache_clear()
