"""The oneDNN backend's C++ layout (src/operator/onednn/): every source is
compiled, files and functions stay small, and operator names appear only in
the operator table, so adding an operator is one row plus one family file."""
import re
from pathlib import Path

from mxamp.native import inputs

SOURCES = Path(__file__).resolve().parents[2] / "src" / "operator"
ONEDNN = SOURCES / "onednn"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 450, 60


def _code(text):
    """C++ text without comments and with string and char literals emptied
    (kept as "" so that they still count as literals)."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)
    return re.sub(r"'(?:[^'\\\n]|\\.)*'", "''", text)


def _blocks(text):
    """(first line, line count, head) of every brace block of `text` that
    is a function body: not a namespace, class, struct, enum, extern block or
    initializer list."""
    lines, stack, out = _code(text).split("\n"), [], []
    for i, line in enumerate(lines):
        for ch in line:
            if ch == "{":
                stack.append(i)
            elif ch == "}":
                start = stack.pop()
                head = lines[start]
                if not re.search(r"\b(namespace|class|struct|enum|extern)\b|=\s*\{|^\s*\{", head) \
                        and re.search(r"\)\s*(const\s*)?(override\s*)?(->[^{]*)?\{", head):
                    out.append((start + 1, i - start + 1, head.strip()))
    return out


def test_every_backend_source_is_compiled():
    listed = {s for s in inputs.ONEDNN.sources}
    assert listed == {f"onednn/{p.name}" for p in ONEDNN.glob("*.cc")}


def test_files_and_functions_stay_small():
    files = sorted(ONEDNN.iterdir())
    assert len(files) >= 10
    long_files = {p.name: n for p in files if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long_files, f"files over {MAX_FILE_LINES} lines: {long_files}"
    long = [(p.name, line, n, head) for p in files for line, n, head in _blocks(p.read_text())
            if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_checker_sees_a_long_function():
    body = "int f(int x) {\n" + "  x += 1;\n" * 70 + "  return x;\n}\n"
    assert [n for _, n, _ in _blocks(body)] == [73]


def test_operator_names_appear_only_in_the_table():
    table = (ONEDNN / "table.cc").read_text()
    ops = re.findall(r'row\("([^"]+)"', table)
    assert {"Convolution", "FullyConnected", "BatchNorm", "clip", "amp_cast"} <= set(ops)
    found = {}
    for path in ONEDNN.iterdir():
        if path.name == "table.cc":
            continue
        # Activation's act_type values share names with operators (relu,
        # sigmoid, tanh): as attribute values they may appear.
        literals = set(re.findall(r'"([^"\\\n]*)"', re.sub(r"//[^\n]*", "", path.read_text())))
        named = literals & set(ops) - ({"relu", "sigmoid", "tanh"} if path.name == "eltwise.cc"
                                       else set())
        if named:
            found[path.name] = sorted(named)
    assert not found, f"operator names outside table.cc: {found}"
