"""What the oneDNN backend supports is written once, in its operator table
(src/operator/, read by mxamp.backends.onednn.operator_table()): Python
modules and docs/onednn.md take it from there instead of keeping copies."""
import ast
import re
from pathlib import Path

import pytest

from mxamp.backends import onednn
from mxamp.graph import CAST_OPS

ROOT = Path(__file__).resolve().parent.parent
# The precision lists name operators by what mxamp decides about precision,
# not by what the backend runs.
PRECISION_LISTS = ROOT / "mxamp" / "policy" / "lists"


@pytest.fixture(scope="module")
def table_ops():
    """The table's operators, without MXNet's casts (every graph rewrite
    knows those; they are no fact about the backend)."""
    return set(onednn.operator_table()) - set(CAST_OPS)


def literal_op_sets(path, ops):
    """(line, names) of each literal list / tuple / set / dict of strings in
    the module at `path` that names two or more operators of `ops`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.keys if isinstance(node, ast.Dict) else \
            node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else []
        names = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if len(names & ops) >= 2:
            found.append((node.lineno, sorted(names & ops)))
    return found


def test_no_module_keeps_a_copy_of_the_backends_operators(table_ops):
    copies = [f"{path.relative_to(ROOT)}:{line}: {names}"
              for path in sorted((ROOT / "mxamp").rglob("*.py"))
              if PRECISION_LISTS not in path.parents
              for line, names in literal_op_sets(path, table_ops)]
    assert copies == [], "read mxamp.backends.onednn.operator_table() instead"


def test_the_check_finds_a_copy(tmp_path, table_ops):
    """The check above can fail: a module with the INT8 list tune.py kept."""
    module = tmp_path / "copy.py"
    module.write_text('INT8_OPS = ("Convolution", "FullyConnected", "batch_dot")\n')
    assert literal_op_sets(module, table_ops) == [
        (1, ["Convolution", "FullyConnected", "batch_dot"])]


def _string(node):
    """The text of a string constant, or of a concatenation of them (`+`),
    else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left), _string(node.right)
        return None if left is None or right is None else left + right
    return None


def _affixes(node):
    """What a `startswith` / `endswith` call tests for: (the method, its
    strings), else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith") and node.args):
        return None
    arg = node.args[0]
    items = arg.elts if isinstance(arg, ast.Tuple) else [arg]
    return node.func.attr, [t for t in map(_string, items) if t]


def op_names_in_code(path, ops):
    """(line, name) of each operator of `ops` the code of the module at
    `path` names: as a word of a string (a message, a space-separated
    list, a concatenation of strings), or as the start or end of one that
    a `startswith` / `endswith` call tests for. A string standing as a
    statement (a docstring) is prose, not code, and is skipped."""
    tree = ast.parse(path.read_text(), str(path))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = set()
    for node in ast.walk(tree):
        text = None if id(node) in prose else _string(node)
        if text is not None:
            found.update((node.lineno, word) for word in re.findall(r"\w+", text) if word in ops)
        if (affixes := _affixes(node)) is not None:
            method, strings = affixes
            found.update((node.lineno, op) for op in ops for s in strings
                         if getattr(op, method)(s))
    return sorted(found)


def test_no_backend_module_names_an_operator_of_the_table():
    """What the backend does with an operator is its table's and its C++'s
    to say (int8_layers.cc answers the INT8 layers' questions): no module
    under mxamp/backends names one of the table's operators, casts
    included. The ops the INT8 weights' writer creates (Cast, broadcast_mul,
    _split_v2) are no rows of the table."""
    modules = sorted((ROOT / "mxamp" / "backends").rglob("*.py"))
    assert len(modules) >= 3
    named = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in modules
             for line, name in op_names_in_code(path, set(onednn.operator_table()))]
    assert named == [], "ask mxamp.backends.onednn (its table or the library) instead"


@pytest.mark.parametrize("code, named", [
    ('return node["op"] == "BatchNorm"', [(4, "BatchNorm")]),
    ('return f"{node} BatchNorm folded"', [(4, "BatchNorm")]),
    ('return node["op"] in "Pooling clip".split()', [(4, "Pooling"), (4, "clip")]),
    ('return node["op"].startswith("Conv")', [(4, "Convolution")]),
    ('return node["op"].endswith(("_scalar", "xyz"))', [(4, "_div_scalar"), (4, "_mul_scalar")]),
    ('return node["op"] == "Batch" + "Norm"', [(4, "BatchNorm")]),
    ('return node["op"] == "BatchNormalisation"  # not a BatchNorm', []),
])
def test_the_check_finds_one_operator_named(tmp_path, table_ops, code, named):
    """The check above can fail: one name in code is enough, in whatever
    string; the same name in a docstring or a comment is not."""
    module = tmp_path / "one.py"
    module.write_text('"""Folds a BatchNorm."""\n'
                      'def folds(node):\n'
                      '    """Whether a BatchNorm follows."""\n'
                      f'    {code}\n')
    assert op_names_in_code(module, table_ops) == named


def documented_ops(text):
    """The operators the first column of "What a region does" names in
    docs/onednn.md's `text`."""
    section = text.split("## What a region does", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`([^`]+)`", cell)}


def test_docs_list_exactly_the_tables_operators():
    """docs/onednn.md's "What a region does" names each operator of the
    table, and no other."""
    assert documented_ops((ROOT / "docs" / "onednn.md").read_text()) == set(
        onednn.operator_table())


def test_tune_int8_candidates_come_from_the_table():
    """The layers INT8 starts at (tune_int8's candidates) are the table's
    rows that quantize their inputs: batch_dot runs in INT8 too, a transpose
    passes INT8 on and softmax computes in float."""
    from mxamp.quantization.api import int8_layers
    table = onednn.operator_table()
    assert (table["batch_dot"].int8, table["transpose"].int8, table["softmax"].int8) == (
        "quantizes", "none", "float")
    assert int8_layers() == {"Convolution", "FullyConnected", "batch_dot"}
