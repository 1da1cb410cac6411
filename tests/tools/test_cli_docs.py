"""docs/cli.md documents the program it is built from: its reference is
sphinx-click's rendering of the click group `mxamp` runs, so every command
and option there is the program's own; the commands its text explains are
the program's commands; its sample sessions print what the commands
print."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

import isa
from mxamp.tools.cli import main

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "docs", "cli.md")


def docs():
    with open(DOCS) as f:
        return f.read()


def test_the_reference_is_the_programs_own():
    """The reference renders the group the console script runs, and each
    command the text has a section for is one of the program's."""
    with open(os.path.join(os.path.dirname(os.path.dirname(DOCS)), "mxamp_cli.py")) as f:
        assert "from mxamp.tools.cli import main" in f.read()  # the console script's group
    directive = re.search(r"^\.\. click:: (\S+):(\w+)$", docs(), re.M)
    assert directive and directive.groups() == ("mxamp.tools.cli", "main")
    explained = set(re.findall(r"^## .*: `mxamp (\w+)`$", docs(), re.M))
    assert explained == set(main.commands)


def sessions():
    """The sample sessions of docs/cli.md: (command, [output lines]) for each
    indented ``$ mxamp ...`` line and the lines under it."""
    found = re.findall(r"^    \$ (mxamp .*)\n((?:    (?!\$).*\n)*)", docs(), re.M)
    return [(command, [line[4:] for line in output.splitlines()]) for command, output in found]


def shape_of(line, directory):
    """A line with its figures, paths and column padding made alike: the
    samples' numbers are one machine's, their tables padded to them."""
    line = line.replace(str(directory / "x"), "DIR").replace("/tmp/x", "DIR")
    return re.sub(r"\s+", " ", re.sub(r"\d+(\.\d+)?(e[-+]\d+)?", "#", line)).strip()


@isa.needs("bf16", "mxnet")  # the samples are an AVX512-BF16 CPU's
@pytest.mark.parametrize("command, shown", sessions(), ids=[c for c, _ in sessions()])
def test_sample_sessions_show_what_the_command_prints(command, shown, tiny, tmp_path):
    """Each sample's lines are the lines the command prints (its figures
    aside): run on the tests' tiny model (the docs' `tiny`, and as
    `digits`, with labelled calibration data in calib.npz)."""
    for name in ("tiny", "digits"):
        for end in ("-symbol.json", "-0000.params"):
            shutil.copy(tiny + end, tmp_path / (name + end))
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "calib.npz", data=rng.rand(40, 3, 8, 8).astype("float32"),
             label=rng.randint(0, 4, 40))
    args = shlex.split(command.replace("/tmp/x", str(tmp_path / "x")))[1:]
    done = subprocess.run([sys.executable, "-m", "mxamp", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    printed = [shape_of(line, tmp_path) for line in done.stdout.splitlines()]
    assert printed == [shape_of(line, tmp_path) for line in shown], done.stdout
