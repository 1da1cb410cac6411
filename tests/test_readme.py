"""The README's code runs as written: each ```python block in a fresh
process (in an empty directory, as a user pasting it would), every
`print(...)  # expected` line printing exactly what its comment says; and
the main job's one-line command (`mxamp zoo ...`) converts its network on
this CPU."""
import os
import re
import shlex
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")

# MXNet's default logging: the command line, run in the test process by
# click's CliRunner in other tests, sets MXNET_SUBGRAPH_VERBOSE=0 there.
DEFAULT_ENV = {k: v for k, v in os.environ.items() if k != "MXNET_SUBGRAPH_VERBOSE"}

def python_blocks():
    with open(README) as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), re.S | re.M)


def expected_prints(code):
    """The comment of each print line: what it must print."""
    return [m.group(1) for m in re.finditer(r"^print\(.*\)\s+# (.*)$", code, re.M)]


def test_blocks_found():
    blocks = python_blocks()
    assert len(blocks) >= 3
    prints = [line for b in blocks for line in b.splitlines() if line.startswith("print(")]
    assert len(prints) == sum(len(expected_prints(b)) for b in blocks) >= 5, \
        "every print says in its comment what it prints"


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_block_runs(index, tmp_path):
    code = python_blocks()[index]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=DEFAULT_ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected_prints(code)
    # Quiet at MXNet's default logging: no "Subgraph backend MKLDNN is
    # activated." per kernel probe, no MXNet warning about mxamp's graphs;
    # only mxamp's own warnings (a CPU without bfloat16 kernels).
    assert [line for line in done.stderr.splitlines() if not line.startswith("mxamp ")] == []


def test_main_job_command_runs(tmp_path):
    with open(README) as f:
        line, = re.findall(r"^    (mxamp zoo .*)$", f.read(), re.M)
    done = subprocess.run(shlex.split(line), cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^1 converted, 0 failed, 0 float32 network", done.stdout, re.M)
    out = shlex.split(line)[shlex.split(line).index("--out") + 1]
    assert {"report.html", "report.json"} <= set(os.listdir(tmp_path / out))
    # No MXNet C++ log line ("[hh:mm:ss] src/...cc:NN: ...") reaches the terminal.
    assert not re.search(r"^\[\d\d:\d\d:\d\d\] ", done.stderr, re.M), done.stderr
