"""The documentation's results page, docs/results.md, from the JSON the
benches write (`--json`): bench/int8_speed.py, bench/bf16_speed.py and
bench/quant_memory.py. It holds the latest run of each bench per CPU class
(AVX2, AVX-512 without bfloat16, AVX-512 with bfloat16, AMX) and CPU model
within it (one class holds CPUs that differ: AVX512-BF16's dot products
outrun float32 on some and trail it on others), each table naming the CPU,
its flags, the date, the commit and the command; a class without a run says
so.

    python bench/results_page.py [--add RUN.json ...] [--check]

--add copies each run into docs/results/ as SCRIPT-CLASS-CPU.json (replacing
that bench's file for the class and CPU model, unless it holds a later run), then the
page is written again from every file there. --check writes nothing and
fails when docs/results.md is not what the files give. Standard library
only: it imports neither MXNet nor mxamp.
"""
import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "results.md"

# CPU classes by what oneDNN 3 uses of the CPU (mxamp.cpu.features("onednn")
# in the run's "machine"), best first: (key, title, the features it needs).
CLASSES = (("amx", "AMX", "amx"),
           ("avx512-bf16", "AVX-512 with bfloat16, no AMX", "bf16"),
           ("avx512", "AVX-512 without bfloat16", "avx512"),
           ("avx2", "AVX2 only", "avx2"))

# The rows each table reads, by the benches' variant names.
INT8_NAIVE, INT8_ENTROPY = "d mxamp int8 naive", "e mxamp int8 entropy"
INT8_FLOAT32 = ("a mxnet fp32", "b mxnet fp32 fused", "f mxamp fp32")
BF16_FLOAT32 = ("a fp32", "b fp32+mkldnn")
BF16_COLUMNS = (("e mxamp+onednn", "mxamp default path (e)"),
                ("h onednn3 fp32", "float32 backend (h)"),
                ("i onednn3 bf16", "bfloat16 backend (i)"),
                ("d mxamp bf16", "MXNet's bfloat16 kernels (d)"),
                ("f openvino bf16", "OpenVINO bfloat16 (f)"))
BF16_OPENVINO = BF16_COLUMNS[-1][0]
VARIANTS = {"int8_speed": (INT8_NAIVE, INT8_ENTROPY, *INT8_FLOAT32),
            "bf16_speed": (*BF16_FLOAT32, *(name for name, _ in BF16_COLUMNS))}
# Keys of a run that are not a network's table.
NOT_TABLES = {"run", "machine", "digits", "int8_peak", "fp32_peak"}


def cpu_class(run):
    """The key of the CPU class a run measured (its ISA limit included)."""
    have = set(run["machine"]["features"]["onednn"])
    return next((key for key, _, needs in CLASSES if needs in have), "avx2")


def cpu_model(run):
    """The CPU model a run measured, as a file name part:
    "genuineintel-family-6-model-207"."""
    return run["machine"]["identity"].lower().replace(" ", "-")


def latest(runs):
    """{(script, class, CPU model): the latest run} of `runs`."""
    found = {}
    for run in runs:
        key = (run["run"]["script"], cpu_class(run), cpu_model(run))
        if key not in found or run["run"]["date"] > found[key]["run"]["date"]:
            found[key] = run
    return found


def ms(value):
    return "-" if value is None else f"{value:.3g}" if value < 10 else f"{value:.1f}" \
        if value < 1000 else f"{value:.0f}"


def err(value):
    return "-" if value is None else f"{value:.1e}"


def ratio(value):
    return "-" if value is None else f"{value:.2f}x"


def share(row):
    """A row's share of its dtype's ISA peak ("of peak" of the benches)."""
    fraction = (row or {}).get("peak_fraction")
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def settings(run):
    """How a run timed or measured, in words."""
    threads = run["machine"]["threads"]
    words = [f"{threads} thread" + "s" * (threads != 1)]
    if "clock" in run:
        words += ["wall-clock" if run["clock"] == "wall" else "CPU time of the process",
                  f"the median of {run['runs']} rounds after {run['warmup']} warm-up",
                  f"bursts of {run['burst']} calls"]
    if "rounds" in run:
        words += [f"{run['calib_batches']} calibration batch" + "es" * (run["calib_batches"] > 1),
                  f"the median of {run['rounds']} round" + "s" * (run["rounds"] > 1)]
    return ", ".join(words)


def provenance(run):
    """The lines that say where a table's figures come from."""
    machine, record = run["machine"], run["run"]
    limits = sorted({v for v in machine["isa_limits"].values() if v})
    return [f"- CPU: {machine['describe']} ({machine['identity']}, {machine['cpus']} CPUs"
            + (f"; ISA limit {', '.join(limits)}" if limits else "") + ")",
            f"- measured {record['date'][:10]} at commit `{record['commit']}` (mxamp "
            f"{machine['mxamp']}, MXNet {machine['mxnet']}, oneDNN wheel "
            f"{machine.get('onednn_wheel')}): {settings(run)}",
            f"- command: `{record['command']}`", ""]


def networks(run):
    """(label, table) of each network and batch a speed run timed, in its
    order; the label as "MobileNet v2 (mobilenetv2_1.0), batch 32"."""
    return [(f"{entry['model']}, batch {entry['batch']}" if "model" in entry else key, entry)
            for key, entry in run.items() if isinstance(entry, dict) and key not in NOT_TABLES]


def rows_by_name(entry):
    return {row["variant"]: row for row in entry.get("rows", []) if "ms" in row}


def best_float32(rows, names):
    timed = [rows[n] for n in names if n in rows]
    return min(timed, key=lambda row: row["ms"]) if timed else None


def int8_table(run):
    header = ["network, batch", "mxamp INT8 naive, ms (error)", "mxamp INT8 entropy",
              "fastest peer", "mxamp against it", "best float32, ms"]
    rows = []
    for label, entry in networks(run):
        if "error" in entry:
            rows.append([label, f"failed: {entry['error']}", "", "", "", ""])
            continue
        timed, peers = rows_by_name(entry), entry.get("peers") or {}
        ours = peers.get("mxamp", {})

        def cell(name):
            found = ours.get(name) or timed.get(name)
            return "-" if found is None else f"{ms(found['ms'])} ({err(found['rel_err'])})"
        fastest = peers.get("fastest_peer")
        peer = "-" if fastest is None else \
            f"{fastest.split(' ', 1)[1]}: {ms(peers['fastest_peer_ms'])} " \
            f"({err(peers['fastest_peer_rel_err'])})"
        against = " / ".join(ratio(ours[n]["vs_fastest_peer"])
                             for n in (INT8_NAIVE, INT8_ENTROPY) if n in ours) or "-"
        best = best_float32(timed, INT8_FLOAT32)
        rows.append([label, cell(INT8_NAIVE), cell(INT8_ENTROPY), peer, against,
                     "-" if best is None else
                     f"{ms(best['ms'])} ({best['variant'].split(' ', 1)[1]})"])
    return table(header, rows)


def bf16_table(run):
    header = ["network, batch", "best MXNet float32, ms"] + \
        [title for _, title in BF16_COLUMNS] + \
        ["default path against the best float32", "default path against OpenVINO bfloat16",
         "share of the ISA's peak: default path / OpenVINO"]
    rows = []
    for label, entry in networks(run):
        timed = rows_by_name(entry)
        best = best_float32(timed, BF16_FLOAT32)
        default = timed.get(BF16_COLUMNS[0][0])
        cells = [f"{ms(timed[n]['ms'])} ({err(timed[n]['rel_err'])})" if n in timed else "-"
                 for n, _ in BF16_COLUMNS]
        rivals = [best, timed.get(BF16_OPENVINO)]
        against = [ratio(r["ms"] / default["ms"]) if r and default else "-" for r in rivals]
        peaks = f"{share(default)} / {share(timed.get(BF16_OPENVINO))}"
        rows.append([label, "-" if best is None else ms(best["ms"])] + cells + against + [peaks])
    return table(header, rows)


def median_ratio(ours, theirs, measure):
    """The median over rounds of mxamp / MXNet (each round's pair ran back
    to back), as quant_memory.py prints it."""
    pairs = [(a[measure], b[measure]) for a, b in zip(ours, theirs)
             if "error" not in a and "error" not in b and b[measure]]
    return statistics.median(a / b for a, b in pairs) if pairs else None


def memory_table(run):
    header = ["network, mode", "mxamp MB (call / +1st batch)", "MXNet MB", "memory ratios",
              "mxamp s", "MXNet s", "time ratio"]
    rows = []
    for label, row in run["rows"].items():
        model, mode = label.split("/")
        ours, theirs = row["mxamp"], row["mxnet"]
        title = f"{run['models'][model]['title']}, batch {run['models'][model]['batch']}, {mode}"

        def both(tool):
            return f"{ms(tool['quant_mb'])} / {ms(tool['first_mb'])}"
        memory = " / ".join(ratio(median_ratio(ours["rounds"], theirs["rounds"], measure))
                            for measure in ("quant_mb", "first_mb"))
        rows.append([title, both(ours), both(theirs), memory, ms(ours["calib_s"]),
                     ms(theirs["calib_s"]),
                     ratio(median_ratio(ours["rounds"], theirs["rounds"], "calib_s"))])
    return table(header, rows)


SECTIONS = (
    ("int8_speed", "INT8 inference", int8_table, """\
`bench/int8_speed.py`: mxamp's INT8 (naive and entropy calibration) against
its peers (MXNet's own INT8, OpenVINO with NNCF, ONNX Runtime), each network
at its batch, served from an exported model, interleaved round by round.
Milliseconds per batch (the median of the rounds) and the relative L2 error
of the output against float32; "mxamp against it" is the fastest peer's
time over mxamp's (above 1: mxamp is faster), naive / entropy."""),
    ("bf16_speed", "bfloat16 inference", bf16_table, """\
`bench/bf16_speed.py`: the documented default path (`convert_hybrid_block`
to bfloat16, then `apply_backend_block`: bfloat16 regions where this CPU's
bfloat16 dot products outrun float32, else float32 ones) against MXNet's
float32 and the other ways to run bfloat16. Milliseconds per batch (the
median of the rounds) and the relative L2 error against float32."""),
    ("quant_memory", "What quantizing costs", memory_table, """\
`bench/quant_memory.py`: one quantization call (`quantize_net_v2`, both
calibration modes) by mxamp and by MXNet, each in a fresh process: the
resident memory it gained (during the call, then up to the end of the
first batch), its time, and mxamp over MXNet (below 1: mxamp takes less),
the median over the rounds."""),
)

INTRO = """\
# Results

Measured by the benches in `bench/` (see `bench/README.md`), with random
weights on the networks the benches build (ResNet-50 v1, MobileNet v2, a
BERT-base-sized encoder). This page holds the latest run of each bench on
each class and model of CPU, never a history: `python bench/results_page.py`
writes it from `docs/results/*.json`, what the benches write with `--json`,
and `python bench/results_page.py --add RUN.json` files a new run first. Do not
edit it by hand. On a machine other jobs share, times move: each table says
how it was measured.
"""


def render(runs):
    """The page's Markdown for a list of runs."""
    found = latest(runs)
    lines = [INTRO]
    for script, title, make, about in SECTIONS:
        lines += [f"## {title}", "", about, ""]
        for key, name, _ in CLASSES:
            lines += [f"### {title}: {name}", ""]
            measured = [run for (bench, cls, _), run in sorted(found.items())
                        if (bench, cls) == (script, key)]
            if not measured:
                lines += ["No measured result yet.", ""]
            for run in measured:
                machine = run["machine"]
                lines += [f"#### {machine['cpu']} ({machine['identity']})", ""]
                lines += provenance(run) + make(run) + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def read_runs(directory=RESULTS):
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def add(path, directory=RESULTS):
    """Files the run at `path` as SCRIPT-CLASS-CPU.json, unless the one there
    is later. Returns where it went (None when kept out)."""
    run = json.loads(Path(path).read_text())
    if not isinstance(run.get("run"), dict) or "identity" not in run.get("machine", {}):
        raise SystemExit(f"{path}: no 'run' record, or no 'machine' record with the CPU's "
                         "identity: not a bench's --json (bench/int8_speed.py, bf16_speed.py, "
                         "quant_memory.py)")
    target = directory / f"{run['run']['script']}-{cpu_class(run)}-{cpu_model(run)}.json"
    if target.exists() and json.loads(target.read_text())["run"]["date"] > run["run"]["date"]:
        print(f"{path}: kept out, {target.name} holds a later run")
        return None
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add", nargs="+", default=[], metavar="RUN.json",
                        help="bench --json files to file into docs/results/ first")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail when docs/results.md is not what the "
                             "files give")
    args = parser.parse_args(argv)
    for path in args.add:
        target = add(path)
        if target:
            print(f"{path} -> {target.relative_to(ROOT)}")
    text = render(read_runs())
    if args.check:
        if PAGE.read_text() != text:
            sys.exit(f"{PAGE.relative_to(ROOT)} is stale: run python bench/results_page.py")
        return
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
