"""bench/serving_memory.py as it is run, in a subprocess: the BERT-base-sized
encoder at one layer, each row served once by its own child process; the JSON
it writes holds finite, positive memory for every row, and the low-precision
rows hold less than the float32 backend's; a count below 1 is refused."""
import json
import math

from bench_scripts import run_script
from mxamp import cpu
from mxamp.backends import onednn

ROWS = ("mxnet f32", "backend f32", "backend bf16", "backend int8")
MEASURES = ("params_mb", "load_mb", "peak_mb", "held_mb")


def run(*args):
    return run_script("serving_memory.py", *args, timeout=600)


def test_the_encoder_rows_are_measured_and_low_precision_holds_less(tmp_path):
    out = tmp_path / "serving.json"
    done = run("--models", "bert", "--layers", 1, "--calls", 1, "--json", out)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["run"]["script"] == "serving_memory"
    assert result["machine"]["describe"] == cpu.describe()
    rows = result["rows"]["bert"]
    assert tuple(rows) == ROWS
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        for measure in MEASURES:
            assert math.isfinite(row[measure]) and row[measure] > 0, (name, measure)
        assert row["peak_mb"] >= row["load_mb"], name
    f32 = rows["backend f32"]
    # s8 weights take a quarter of float32's bytes (the token embedding,
    # most of this encoder's parameters, stays float32)
    assert rows["backend int8"]["params_mb"] < f32["params_mb"]
    assert rows["backend int8"]["peak_mb"] < f32["peak_mb"]
    speed = onednn.bf16_speed()
    if speed is not None and not speed.slower:  # its regions then keep bfloat16 weights
        assert rows["backend bf16"]["peak_mb"] < f32["peak_mb"]
    table = [line.split() for line in done.stdout.splitlines() if line.startswith("bert ")]
    assert [line[-1] for line in table if line[1:3] == ["backend", "f32"]] == ["1.00x"]


def test_calls_below_one_is_refused():
    done = run("--models", "bert", "--calls", 0)
    assert done.returncode == 2
    assert "--layers and --calls must be at least 1, got 12 and 0" in done.stderr
