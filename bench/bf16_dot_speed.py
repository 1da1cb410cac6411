"""Whether this CPU's bfloat16 dot products outrun its float32 ones, as oneDNN 3
runs them: measures this CPU and writes it into the package's data,
mxamp/backends/bf16_speed.json (read by mxamp.backends.onednn.bf16_speed,
which decides whether regions planned in bfloat16 compute in float32).

    python bench/bf16_dot_speed.py [--repeats N] [--out PATH]

The key is mxamp.cpu.identity() (vendor, family, model): the ISA class does
not decide it (AVX512-BF16 is 2x slower than float32 on an Intel Xeon
without AMX, 2x faster on an AMD Zen 4). The entry also records the oneDNN
features in use, so an ISA limit that changes them is not read as this CPU.
Entries of other CPUs in the file are kept.

What is timed: the backend library's own measurement (a 512 x 512 by
512 x 512 inner product in float32 and in bfloat16, interleaved, the fastest
of each; mxamp_onednn_bf16_slowdown in src/operator/onednn/speed.cc),
repeated --repeats times; the file keeps the median.
"""
import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from mxamp import cpu  # noqa: E402
from mxamp.backends import onednn  # noqa: E402
from mxamp.tools.report import write_text  # noqa: E402

ABOUT = ("How many times longer oneDNN 3.2's bfloat16 inner product takes than its float32 one "
         "(slowdown), per CPU as mxamp.cpu.identity() names it, with the oneDNN features in use "
         "(written by bench/bf16_dot_speed.py; see its docstring for how). Where slowdown "
         "exceeds mxamp.backends.onednn.BF16_SLOWER, regions planned in bfloat16 compute in "
         "float32. A CPU not here, or whose features differ (an ISA limit), is measured once "
         "per process.")


def write(path, speeds, repeats):
    """Merges this CPU's measurement into the data file at `path` (whole or
    not at all)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    cpus = dict(data.get("cpus", {}))
    cpus[cpu.identity()] = {
        "features": " ".join(cpu.features("onednn").names()),
        "slowdown": round(statistics.median(speeds), 2),
        "measured": {"cpu": cpu.describe(), "date": datetime.date.today().isoformat(),
                     "runs": [round(s, 2) for s in speeds],
                     "how": f"median of {repeats} measurements (one thread each), on a "
                            f"machine shared with other jobs"}}
    out = {"about": ABOUT, "cpus": dict(sorted(cpus.items()))}
    write_text(path, json.dumps(out, indent=1) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, default=onednn.SPEEDS)
    args = parser.parse_args()
    if cpu.identity() is None or onednn.bf16_speed() is None:
        sys.exit(f"nothing to measure: {cpu.describe()} (needs bfloat16 in oneDNN 3 and "
                 f"/proc/cpuinfo's vendor, family and model)")
    print(f"measuring {cpu.identity()}: {cpu.describe()}", file=sys.stderr)
    speeds = [onednn.bf16_speed(measure=True).slowdown for _ in range(args.repeats)]
    write(args.out, speeds, args.repeats)
    print(f"wrote {args.out}: slowdown {statistics.median(speeds):.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
