"""docs/cli.md lists what the program has: its table of commands is
`mxamp --help`'s list, and each command's synopsis (the indented
``mxamp COMMAND ...`` lines under its heading) names exactly the options
``mxamp COMMAND --help`` shows (-h/--help, -v/--verbose and -q/--quiet, which
every command takes, are described once at the top); its sample sessions
print what the commands print."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import isa
from mxamp.tools.cli import main

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "docs", "cli.md")
OPTION = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
EVERY_COMMAND = {"--help", "--verbose", "--quiet"}


def docs():
    with open(DOCS) as f:
        return f.read()


def help_text(*command):
    """`mxamp COMMAND --help`'s text, from click's CliRunner: only the text
    matters, and a process per command (mostly importing MXNet) took longer
    than the checks. 78 columns: what click gives a process with no terminal,
    so the text is the command's own, byte for byte."""
    done = CliRunner().invoke(main, [*command, "--help"], prog_name="mxamp", terminal_width=78)
    assert done.exit_code == 0, done.output
    return done.stdout


def listed_commands(text):
    """The commands of `text`'s "Commands:" section (click's help layout)."""
    section = text.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0] for line in section.splitlines() if line.startswith("  ")}


def help_options(text):
    """The options of a command's help: the lines of its "Options:" section
    that start with an option (not the wrapped help text)."""
    section = text.split("Options:\n", 1)[1]
    starts = [line for line in section.splitlines() if re.match(r"^  +-", line)]
    return {o for line in starts for o in OPTION.findall(line.strip().split("  ")[0])}


def synopsis(command):
    """The options named in the synopsis block under ``## `mxamp COMMAND```."""
    text = docs()
    section = re.search(rf"^## `mxamp {command}`\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    block = re.search(r"^\n((?:    .*\n)+)", section, re.M).group(1)
    assert block.lstrip().startswith(f"mxamp {command} ")
    return set(OPTION.findall(block))


def test_the_command_table_lists_every_command():
    table = set(re.findall(r"^\| `mxamp (\w+)[^`]*` \|", docs(), re.M))
    assert table == listed_commands(help_text())
    count = re.search(r"is the same program\. (\w+) commands:", docs()).group(1)
    assert count.lower() == ["one", "two", "three", "four", "five", "six", "seven"][
        len(table) - 1]


@pytest.mark.parametrize("command", sorted(listed_commands(help_text())))
def test_synopsis_names_every_option(command):
    assert synopsis(command) == help_options(help_text(command)) - EVERY_COMMAND


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
