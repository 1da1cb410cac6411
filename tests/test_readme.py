"""The README's and the guide's code runs as written.

The README: each ```python block in a fresh process (in an empty directory,
as a user pasting it would), every `print(...)  # expected` line printing
exactly what its comment says, and the main job's one-line command
(`mxamp zoo ...`) converting its network on this CPU.

The guide (docs/, the pages of docs/index.md's Guide, and the command-line
page's code): each page's ```python blocks in order in one fresh process,
as a reader following the page runs them, with every `$ mxamp ...` line of
its ```console blocks run where it stands; the same expected prints. What
a page prints must hold on any CPU, and its only output on stderr is
mxamp's own log records (warnings that say what this CPU lacks). The other
commands of the guide (installing, testing, building the docs) are the
ones .ci/run runs, word for word."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# docs/index.md's Guide, in its order; then the reference pages with code.
GUIDE = ("install", "convert", "onednn", "quantization", "training", "policies", "cpus",
         "reliability")
PAGES_WITH_CODE = GUIDE + ("cli",)

# MXNet's default logging: the command line, run in the test process by
# click's CliRunner in other tests, sets MXNET_SUBGRAPH_VERBOSE=0 there.
DEFAULT_ENV = {k: v for k, v in os.environ.items() if k != "MXNET_SUBGRAPH_VERBOSE"}

# Put before a page's code: each log record on one stderr line, named, so
# that mxamp's warnings can be told from anything else on stderr.
ONE_LINE_RECORDS = '''\
import logging as _logging
class _OneLine(_logging.Formatter):
    def format(self, record):
        return f"LOG {record.name}: " + super().format(record).replace("\\n", " | ")
_handler = _logging.StreamHandler()
_handler.setFormatter(_OneLine("%(message)s"))
_logging.getLogger().addHandler(_handler)
'''

# A `$ mxamp ...` line of a page, run where it stands; its output is its own.
COMMAND = '''\
import subprocess as _subprocess, sys as _sys
_done = _subprocess.run([_sys.executable, "-m", "mxamp", *{args!r}], capture_output=True, text=True)
if _done.returncode:
    _sys.exit(f"$ mxamp {line} failed with status {{_done.returncode}}:\\n{{_done.stderr}}")
'''


def python_blocks(text):
    return re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)


def console_lines(text):
    """The `$ ` lines of the ```console blocks of `text`."""
    blocks = re.findall(r"^```console\n(.*?)^```$", text, re.S | re.M)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def expected_prints(code):
    """The comment of each print line: what it must print."""
    return [m.group(1) for m in re.finditer(r"^print\(.*\)\s+# (.*)$", code, re.M)]


def page_script(text):
    """A page's python blocks and its `$ mxamp` lines, in their order, as
    one script."""
    parts = [ONE_LINE_RECORDS]
    for m in re.finditer(r"^```(python|console)\n(.*?)^```$", text, re.S | re.M):
        if m.group(1) == "python":
            parts.append(m.group(2))
            continue
        for line in (line[2:] for line in m.group(2).splitlines() if line.startswith("$ ")):
            if line.startswith("mxamp "):
                parts.append(COMMAND.format(args=shlex.split(line)[1:], line=line[6:]))
    return "\n".join(parts)


def readme():
    return README.read_text()


def page(name):
    return (DOCS / f"{name}.md").read_text()


def run_python(code, cwd):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=1200, env=DEFAULT_ENV)


def test_blocks_found():
    blocks = python_blocks(readme())
    assert len(blocks) >= 3
    prints = [line for b in blocks for line in b.splitlines() if line.startswith("print(")]
    assert len(prints) == sum(len(expected_prints(b)) for b in blocks) >= 5, \
        "every print says in its comment what it prints"


@pytest.mark.parametrize("index", range(len(python_blocks(README.read_text()))))
def test_python_block_runs(index, tmp_path):
    code = python_blocks(readme())[index]
    done = run_python(ONE_LINE_RECORDS + code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected_prints(code)
    # Quiet at MXNet's default logging: no "Subgraph backend MKLDNN is
    # activated." per kernel probe, no MXNet warning about mxamp's graphs;
    # only mxamp's own warnings (what this CPU lacks).
    assert [line for line in done.stderr.splitlines() if not line.startswith("LOG mxamp")] \
        == [], done.stderr


def test_main_job_command_runs(tmp_path):
    line, = re.findall(r"^    (mxamp zoo .*)$", readme(), re.M)
    done = subprocess.run(shlex.split(line), cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^1 converted, 0 failed, 0 float32 network", done.stdout, re.M)
    out = shlex.split(line)[shlex.split(line).index("--out") + 1]
    assert {"report.html", "report.json"} <= set(os.listdir(tmp_path / out))
    # No MXNet C++ log line ("[hh:mm:ss] src/...cc:NN: ...") reaches the terminal.
    assert not re.search(r"^\[\d\d:\d\d:\d\d\] ", done.stderr, re.M), done.stderr


def test_the_guide_is_the_index_in_its_order():
    toctree = re.search(r":caption: Guide\n\n(.*?)```", page("index"), re.S).group(1)
    assert tuple(toctree.split()) == GUIDE


def test_every_print_of_the_guide_says_what_it_prints():
    for name in PAGES_WITH_CODE:
        blocks = python_blocks(page(name))
        prints = [line for b in blocks for line in b.splitlines() if line.startswith("print(")]
        assert len(prints) == sum(len(expected_prints(b)) for b in blocks), name


@pytest.mark.parametrize("name", [n for n in PAGES_WITH_CODE if python_blocks(page(n))])
def test_guide_page_runs(name, tmp_path):
    text = page(name)
    done = run_python(page_script(text), tmp_path)
    assert done.returncode == 0, done.stderr[-5000:]
    assert done.stdout.splitlines() == [p for b in python_blocks(text)
                                        for p in expected_prints(b)]
    assert [line for line in done.stderr.splitlines() if not line.startswith("LOG mxamp")] \
        == [], done.stderr[-5000:]


def test_the_guide_runs_no_command_ci_does_not():
    """Every command of the guide that is not `mxamp ...` (installing,
    testing, building the docs) is a line .ci/run runs, word for word."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for name in PAGES_WITH_CODE for line in console_lines(page(name))
                if not line.startswith("mxamp ")]
    assert commands, "the install page shows the install command"
    assert [c for c in commands if c not in ci] == []
