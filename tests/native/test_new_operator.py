"""docs/architecture.md walks adding an operator to the oneDNN backend: a new
eltwise operator, and a new family. Each step names the file it edits first;
the places it names exist, and following the steps on a toy operator in a
scratch copy of the sources gives code that compiles and passes every check
the tests run on the table, its kinds, its cases and its docs. Leaving out
any step fails one of those checks."""
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxamp import native
from mxamp.native import inputs
from test_operator_table import documented_ops
from test_sources import names_outside_table, table_ops, undefined_families, undefined_kinds

ROOT = Path(__file__).resolve().parents[2]
ONEDNN = "src/operator/onednn"
CASES_FILE = "tests/backends/test_onednn_table.py"
DOCS = "docs/onednn.md"  # its table of the operators a region runs
ELTWISE, FAMILY = "A new eltwise operator", "A new family"


def walk(title):
    """The steps of walk `title` in docs/architecture.md, each as one line."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    bullet = text.split("- **A new oneDNN operator**", 1)[1].split("\n- **", 1)[0]
    steps = []
    for line in bullet.split(f"\n  {title}", 1)[1].splitlines()[1:]:
        if m := re.match(r"  \d+\. (.*)", line):
            steps.append(m.group(1))
        elif line.startswith("     ") and steps:
            steps[-1] += " " + line.strip()
        else:
            break
    return steps


def place(step):
    """The file a step edits: the first one it names."""
    return re.search(r"`([^`]+)`", step).group(1)


def _after(marker, line, last=False):
    """An edit inserting `line` after the (first or last) line holding `marker`."""
    def edit(text):
        lines = text.split("\n")
        at = [i for i, x in enumerate(lines) if marker in x][-1 if last else 0]
        return "\n".join(lines[:at + 1] + [line] + lines[at + 1:])
    return edit


TOY_FAMILY = """// A toy family: each node is its input's value.
#include "plan.h"
#include "table.h"

namespace mxamp_onednn {
namespace {

bool supported(const Node*, int) { return true; }

void add(Plan* plan, const Node* n, int) {
  plan->bind({n, 0}, plan->value_of(input(n, 0)));
  plan->consume(input(n, 0));
}

}  // namespace

const Family kToy = {supported, add, nullptr};
const FamilyName kToyName("toy", kToy);

}  // namespace mxamp_onednn
"""

# Each walk's steps on a toy operator: per place, the edit that follows it.
TOYS = {
    ELTWISE: ("exp", {
        f"{ONEDNN}/table.cc": _after(
            '"eltwise",', '      row("exp", "eltwise", "exponent", kFloats, kF, kApart, kPostOp),',
            last=True),
        f"{ONEDNN}/eltwise.cc": _after(
            "const Kind kKinds[] = {", '    {"exponent", fixed<dnnl::algorithm::eltwise_exp>},'),
        CASES_FILE: _after("CASES = {", '    "exp": (mx.sym.exp(_fc(D)), TOKENS),'),
        DOCS: lambda text: text.replace("| `Activation`, ", "| `Activation`, `exp`, ", 1),
    }),
    FAMILY: ("toy_op", {
        f"{ONEDNN}/<family>.cc": lambda text: TOY_FAMILY,
        f"{ONEDNN}/table.cc": _after(
            '      row("', '      row("toy_op", "toy", 0, kAll, kN, kApart, kView),', last=True),
        CASES_FILE: _after("CASES = {", '    "toy_op": (_fc(D), TOKENS),'),
        DOCS: _after("| `Flatten`", "| `toy_op` | its input (a toy family) | |"),
    }),
}


def scratch(tmp_path, edits):
    """A copy of the backend's sources, the table's cases and the docs, with
    `edits` applied (`<family>` names the toy family's file)."""
    shutil.copytree(ROOT / ONEDNN, tmp_path / ONEDNN)
    for name in (CASES_FILE, DOCS, "mxamp/native/inputs.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    for name, edit in edits.items():
        path = tmp_path / name.replace("<family>", "toy")
        path.write_text(edit(path.read_text() if path.exists() else ""))
    return tmp_path


def cases(path):
    """The keys of the CASES dict of the test module at `path`."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["CASES"]:
            return {k.value for k in node.value.keys}
    raise AssertionError(f"no CASES in {path}")


def problems(root):
    """What the tests would find wrong with the sources, cases and docs
    under `root`: operator names outside the table, eltwise kinds or
    families no file defines, table rows without a case or docs entry (and
    the reverse)."""
    onednn, ops = root / ONEDNN, set(table_ops(root / ONEDNN))
    found = {"names outside the table": names_outside_table(onednn),
             "undefined kinds": undefined_kinds(onednn),
             "undefined families": undefined_families(onednn),
             "cases": cases(root / CASES_FILE) ^ ops,
             "docs": documented_ops((root / DOCS).read_text()) ^ ops}
    return {what: x for what, x in found.items() if x}


def compile_only(*sources):
    header, _ = inputs.lib_api()
    include = native.onednn_prefix() / "include"
    done = subprocess.run(["g++", *inputs.COMPILE_FLAGS, *inputs.ONEDNN_FLAGS, "-fsyntax-only",
                           f"-I{header.parents[1]}", f"-I{include}", *map(str, sources)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("title", [ELTWISE, FAMILY])
def test_each_step_names_places_that_exist(title):
    """The file a step edits and every file it names exist; the code it
    names (`kKinds`, `table()`) is in the file it edits (for a new family's
    file: in plan.h and table.h, which it builds on); its quoted section
    titles are in that file."""
    steps = walk(title)
    assert [place(s) for s in steps] == list(TOYS[title][1])
    for step in steps:
        edited = ROOT / place(step)
        builds_on = [ROOT / ONEDNN / "plan.h", ROOT / ONEDNN / "table.h"]
        text = "\n".join(p.read_text() for p in (builds_on if "<family>" in edited.name
                                                 else [edited]))
        for token in re.findall(r"`([^`]+)`", step):
            if "/" in token:
                assert (ROOT / token).parent.is_dir() and (
                    "<family>" in token or (ROOT / token).is_file()), token
            elif re.fullmatch(r"\w+(::\w+)?(\(\))?", token):
                assert re.search(rf"\b{re.escape(token.split('::')[-1])}", text), (token, edited)
        for quoted in re.findall(r'"([^"]+)"', step):
            assert quoted in text, (quoted, edited)


def test_a_toy_eltwise_operator_follows_the_walk(tmp_path):
    op, edits = TOYS[ELTWISE]
    root = scratch(tmp_path, edits)
    assert op in table_ops(root / ONEDNN) and problems(root) == {}
    compile_only(root / ONEDNN / "table.cc", root / ONEDNN / "eltwise.cc")


def test_a_toy_family_follows_the_walk(tmp_path):
    """Its file is compiled without naming it anywhere: the build's list
    is every .cc of the directory (what CMake reads, inputs.py)."""
    op, edits = TOYS[FAMILY]
    root = scratch(tmp_path, edits)
    assert op in table_ops(root / ONEDNN) and problems(root) == {}
    compile_only(root / ONEDNN / "toy.cc", root / ONEDNN / "table.cc")
    done = subprocess.run([sys.executable, str(root / "mxamp/native/inputs.py"),
                           str(tmp_path / "inputs.cmake")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert '"src/operator/onednn/toy.cc"' in (tmp_path / "inputs.cmake").read_text()


@pytest.mark.parametrize("title, step", [(t, s) for t in TOYS for s in TOYS[t][1]])
def test_leaving_out_a_step_is_found(tmp_path, title, step):
    """Every step is needed: without it, a check finds the toy incomplete."""
    edits = {place: edit for place, edit in TOYS[title][1].items() if place != step}
    assert problems(scratch(tmp_path, edits)) != {}
