"""docs/cli.md lists what the program has: its table of commands is
`mxamp --help`'s list, and each command's synopsis (the indented
``mxamp COMMAND ...`` lines under its heading) names exactly the options
``mxamp COMMAND --help`` shows (-h/--help, -v/--verbose and -q/--quiet, which
every command takes, are described once at the top)."""
import os
import re
import subprocess
import sys

import pytest

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "docs", "cli.md")
OPTION = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
EVERY_COMMAND = {"--help", "--verbose", "--quiet"}


def docs():
    with open(DOCS) as f:
        return f.read()


def help_text(*command):
    done = subprocess.run([sys.executable, "-m", "mxamp", *command, "--help"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
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
