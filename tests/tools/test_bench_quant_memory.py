"""bench/quant_memory.py as it is run, in a subprocess: the BERT-base-sized
encoder at one layer, one round, one calibration batch, quantized by mxamp
and by MXNet each in its own child process; the JSON it writes holds a
finite, positive peak and time for both, and the run's command, date,
commit and CPU; a depth below 1 is refused."""
import json
import math
import re

from bench_scripts import run_script
from mxamp import cpu

MEASURES = ("quant_mb", "first_mb", "calib_s", "calib_cpu_s")


def run(*args):
    return run_script("quant_memory.py", *args, timeout=300)


def test_bert_naive_measures_both_libraries(tmp_path):
    out = tmp_path / "qmem.json"
    done = run("--models", "bert", "--layers", 1, "--rounds", 1, "--calib-batches", 1,
               "--modes", "naive", "--json", out)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["models"] == {"bert": {"title": "BERT-base-sized encoder (1 layers, seq 128)",
                                         "batch": 8}}
    assert (result["calib_batches"], result["rounds"]) == (1, 1)
    # what the results page names (bench/results_page.py): the run and the CPU
    run_record = result["run"]
    assert run_record["script"] == "quant_memory"
    assert run_record["command"].startswith("OMP_NUM_THREADS=1 ")
    assert run_record["command"].endswith(" python bench/quant_memory.py --models bert --layers 1 "
                                          f"--rounds 1 --calib-batches 1 --modes naive --json {out}")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", run_record["date"])
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?", run_record["commit"])
    assert result["machine"]["describe"] == cpu.describe()
    assert set(result["rows"]) == {"bert/naive"}
    row = result["rows"]["bert/naive"]
    assert set(row) == {"mxamp", "mxnet"}
    for tool, measured in row.items():
        assert len(measured["rounds"]) == 1 and "error" not in measured["rounds"][0], tool
        for name in MEASURES:
            assert math.isfinite(measured[name]) and measured[name] > 0, (tool, name)
        # the peak up to the first batch includes the call's
        assert measured["first_mb"] >= measured["quant_mb"], tool
    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["bert", "naive", "mxamp"] for line in lines)
    assert any(line.split()[:3] == ["bert", "naive", "mxnet"] for line in lines)
    ratio = next(line.split() for line in lines if line.split()[:1] == ["ratio"])
    assert len(ratio) == 1 + len(MEASURES) and all(c.endswith("x") for c in ratio[1:]), ratio


def test_layers_below_one_is_refused():
    done = run("--models", "bert", "--layers", 0)
    assert done.returncode == 2
    assert "--layers, --rounds and --calib-batches must be at least 1, got 0, 3 and 4" \
        in done.stderr
