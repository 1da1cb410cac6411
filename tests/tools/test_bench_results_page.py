"""bench/results_page.py, which writes docs/results.md from the benches'
--json files: on small runs shaped as the benches write them, the latest run
per bench, CPU class and CPU model, each table naming its CPU, date, commit
and command, the figures each cell reads, classes without a run said so;
--add files a run by class and model; and the committed page is what
docs/results/ gives."""
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import results_page  # noqa: E402

FEATURES = {"avx2": ["avx2"], "avx512": ["avx2", "avx512", "vnni"],
            "avx512-bf16": ["avx2", "avx512", "vnni", "bf16"],
            "amx": ["avx2", "avx512", "vnni", "bf16", "amx"]}


def record(script, cpu_class, date, command="python bench/x.py"):
    """The run and machine records every bench's --json starts with."""
    return {"run": {"script": script, "date": f"{date}T10:00:00+00:00", "commit": "abc123def456",
                    "command": command},
            "machine": {"cpu": "Some CPU", "identity": "GenuineIntel family 6 model 143",
                        "describe": f"Some CPU: {' '.join(FEATURES[cpu_class])}", "cpus": 2,
                        "threads": 2, "features": {"mxnet": FEATURES[cpu_class],
                                                   "onednn": FEATURES[cpu_class]},
                        "isa_limits": {"mxnet": None, "onednn": None}, "mxnet": "1.9.1",
                        "onednn_wheel": "2023.2.0", "mxamp": "0.1.0"}}


def timing():
    return {"runs": 7, "warmup": 2, "clock": "wall", "burst": 10}


def row(variant, ms, rel_err):
    return {"variant": variant, "ms": ms, "rel_err": rel_err}


def int8_run(cpu_class="avx512", date="2026-12-01", naive_ms=40.0):
    peers = {"fastest_peer": "c mxnet int8", "fastest_peer_ms": 46.0,
             "fastest_peer_rel_err": 2.5e-2,
             "mxamp": {"d mxamp int8 naive": {"ms": naive_ms, "rel_err": 1.6e-2,
                                              "vs_fastest_peer": 46.0 / naive_ms},
                       "e mxamp int8 entropy": {"ms": 41.0, "rel_err": 1.5e-2,
                                                "vs_fastest_peer": 46.0 / 41.0}}}
    rows = [row("a mxnet fp32", 160.0, 0.0), row("b mxnet fp32 fused", 150.0, 1e-7),
            row("c mxnet int8", 47.0, 2.5e-2), row("d mxamp int8 naive", 43.0, 1.6e-2),
            row("e mxamp int8 entropy", 41.5, 1.5e-2), row("f mxamp fp32", 120.0, 7e-7),
            {"variant": "h openvino int8", "error": "not run (--no-anchor)"}]
    return {**record("int8_speed", cpu_class, date), **timing(),
            "mobilenetv2 b32": {"model": "MobileNet v2 (mobilenetv2_1.0)", "batch": 32,
                                "rows": rows, "peers": peers},
            "resnet50 b1": {"error": "MXNetError: out of memory"}, "int8_peak": None,
            "digits": {}}


def bf16_run(cpu_class="avx512-bf16", date="2026-12-01"):
    rows = [row("a fp32", 60.0, 0.0), row("b fp32+mkldnn", 50.0, 1e-7),
            row("d mxamp bf16", 80.0, 7e-3),
            {**row("e mxamp+onednn", 25.0, 6.9e-3), "peak_fraction": 0.981},
            row("h onednn3 fp32", 45.0, 7e-7), row("i onednn3 bf16", 25.5, 6.9e-3),
            {**row("f openvino bf16", 30.0, 7.1e-3), "peak_fraction": 0.817}]
    return {**record("bf16_speed", cpu_class, date), **timing(),
            "fp32_peak": {"gmacs": 60.0, "cases": {}},
            "resnet50": {"model": "ResNet-50 v1", "batch": 16, "rows": rows, "breakdown": {}}}


def memory_run(cpu_class="avx2", date="2026-12-01"):
    def rounds(*values):
        return [{"quant_mb": v, "first_mb": v + 10, "calib_s": v / 100} for v in values]
    return {**record("quant_memory", cpu_class, date), "calib_batches": 4, "rounds": 3,
            "models": {"resnet50": {"title": "ResNet-50 v1", "batch": 16}},
            "rows": {"resnet50/naive": {
                "mxamp": {"quant_mb": 450.0, "first_mb": 460.0, "calib_s": 4.5,
                          "rounds": rounds(440, 450, 460)},
                "mxnet": {"quant_mb": 880.0, "first_mb": 890.0, "calib_s": 8.8,
                          "rounds": rounds(880, 880, 440)}}}}


def section(page, title):
    """The text under one '### TITLE' heading, its CPU models' tables included."""
    return re.search(rf"^### {re.escape(title)}\n(.*?)(?=^##?#? |\Z)", page,
                     re.S | re.M).group(1)


def table_rows(text):
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_no_runs_every_class_says_so():
    page = results_page.render([])
    assert page.count("No measured result yet.") == 3 * len(results_page.CLASSES)
    for _, name, _ in results_page.CLASSES:
        assert f"### INT8 inference: {name}\n\nNo measured result yet." in page


def test_a_table_names_cpu_date_commit_and_command():
    run = int8_run()
    run["run"]["command"] = "OMP_NUM_THREADS=1 python bench/int8_speed.py --models mobilenetv2"
    text = section(results_page.render([run]), "INT8 inference: AVX-512 without bfloat16")
    assert "- CPU: Some CPU: avx2 avx512 vnni (GenuineIntel family 6 model 143, 2 CPUs)" in text
    assert "- measured 2026-12-01 at commit `abc123def456` (mxamp 0.1.0, MXNet 1.9.1" in text
    assert ("2 threads, wall-clock, the median of 7 rounds after 2 warm-up, bursts of 10 "
            "calls") in text
    assert "- command: `OMP_NUM_THREADS=1 python bench/int8_speed.py --models mobilenetv2`" \
        in text


def test_int8_cells():
    text = section(results_page.render([int8_run()]), "INT8 inference: AVX-512 without bfloat16")
    assert table_rows(text) == [
        ["MobileNet v2 (mobilenetv2_1.0), batch 32", "40.0 (1.6e-02)", "41.0 (1.5e-02)",
         "mxnet int8: 46.0 (2.5e-02)", "1.15x / 1.12x", "120.0 (mxamp fp32)"],
        ["resnet50 b1", "failed: MXNetError: out of memory", "", "", "", ""]]


def test_bf16_cells():
    text = section(results_page.render([bf16_run()]),
                   "bfloat16 inference: AVX-512 with bfloat16, no AMX")
    assert table_rows(text) == [["ResNet-50 v1, batch 16", "50.0", "25.0 (6.9e-03)",
                                 "45.0 (7.0e-07)", "25.5 (6.9e-03)", "80.0 (7.0e-03)",
                                 "30.0 (7.1e-03)", "2.00x", "1.20x", "98% / 82%"]]
    without = bf16_run()
    without["resnet50"]["rows"].pop()  # OpenVINO not run: its cells say so
    assert table_rows(section(results_page.render([without]), "bfloat16 inference: AVX-512 "
                              "with bfloat16, no AMX"))[0][-4:] == ["-", "2.00x", "-", "98% / -"]


def test_memory_ratios_are_medians_of_each_rounds_ratio():
    text = section(results_page.render([memory_run()]), "What quantizing costs: AVX2 only")
    # per round quant_mb 440/880, 450/880, 460/440 -> median 0.51x; first_mb 450/890,
    # 460/890, 470/450 -> 0.52x; calib_s 0.5, 0.51, 1.05 -> 0.51x
    assert table_rows(text) == [["ResNet-50 v1, batch 16, naive", "450.0 / 460.0",
                                 "880.0 / 890.0", "0.51x / 0.52x", "4.5", "8.8", "0.51x"]]


def test_the_latest_run_per_bench_class_and_cpu_model():
    old, new = int8_run(date="2026-11-01", naive_ms=50.0), int8_run(date="2026-12-01")
    amx = int8_run("amx", date="2026-10-01", naive_ms=20.0)
    other = int8_run(date="2026-10-01", naive_ms=30.0)
    other["machine"].update(cpu="Other CPU", identity="AuthenticAMD family 25 model 17")
    page = results_page.render([new, amx, old, other])
    assert "2026-11-01" not in page
    text = section(page, "INT8 inference: AVX-512 without bfloat16")
    # Both models of the class, each under its own heading, in the models' order.
    assert re.findall(r"^#### (.*)$", text, re.M) == [
        "Other CPU (AuthenticAMD family 25 model 17)", "Some CPU (GenuineIntel family 6 model 143)"]
    assert text.index("30.0 (1.6e-02)") < text.index("GenuineIntel") < text.index("40.0 (1.6e-02)")
    assert "20.0 (1.6e-02)" in section(page, "INT8 inference: AMX")
    assert section(page, "INT8 inference: AVX2 only").strip() == "No measured result yet."


def test_an_isa_limit_makes_the_class_and_is_named():
    run = int8_run("avx512-bf16")
    run["machine"]["features"]["onednn"] = FEATURES["avx2"]
    run["machine"]["isa_limits"] = {"mxnet": "DNNL_MAX_CPU_ISA=AVX2",
                                    "onednn": "ONEDNN_MAX_CPU_ISA=AVX2"}
    text = section(results_page.render([run]), "INT8 inference: AVX2 only")
    assert "; ISA limit DNNL_MAX_CPU_ISA=AVX2, ONEDNN_MAX_CPU_ISA=AVX2)" in text


def test_add_files_a_run_by_bench_class_and_cpu_model(tmp_path):
    def write(name, run):
        path = tmp_path / name
        path.write_text(json.dumps(run))
        return path
    results = tmp_path / "results"
    assert results_page.add(write("a.json", int8_run()), results) == \
        results / "int8_speed-avx512-genuineintel-family-6-model-143.json"
    assert results_page.add(write("b.json", int8_run(date="2026-11-01")), results) is None
    assert json.loads((results / "int8_speed-avx512-genuineintel-family-6-model-143.json")
                      .read_text())["run"]["date"].startswith("2026-12-01")
    assert results_page.add(write("c.json", memory_run()), results) == \
        results / "quant_memory-avx2-genuineintel-family-6-model-143.json"
    for name, bad in (("d.json", {"rows": {}}),
                      ("e.json", {"run": int8_run()["run"], "machine": {"cpu": "Some CPU"}})):
        with pytest.raises(SystemExit, match="not a bench's --json"):
            results_page.add(write(name, bad), results)


def test_every_row_it_reads_is_a_variant_of_its_bench():
    for script, names in results_page.VARIANTS.items():
        source = (BENCH / f"{script}.py").read_text()
        for name in names:
            assert f'"{name}"' in source, (script, name)


def test_a_run_keeps_its_figures():
    """Rendering reads the runs and changes none of them."""
    runs = [int8_run(), bf16_run(), memory_run()]
    before = copy.deepcopy(runs)
    results_page.render(runs)
    assert runs == before


def test_the_committed_page_is_what_the_files_give():
    done = subprocess.run([sys.executable, str(BENCH / "results_page.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
