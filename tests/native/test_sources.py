"""The C++ layout (src/): files and functions stay small; in the oneDNN
backend (src/operator/onednn/) operator names appear only in the operator
table, every eltwise row names a kind eltwise.cc defines, every family a
row names has its file, and the plan and the region name no family."""
import re
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[2] / "src"
ONEDNN = SOURCES / "operator" / "onednn"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 450, 60
# What the plan and the region are made of: no family's name may appear in them.
PLANNING = ("plan.h", "plan.cc", "parameters.cc", "region.h", "region.cc")


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


def table_ops(onednn=ONEDNN):
    """The operators of the table's rows (table.cc)."""
    return re.findall(r'row\("([^"]+)"', (onednn / "table.cc").read_text())


def names_outside_table(onednn=ONEDNN):
    """Per file of the backend other than table.cc, the operator names its
    string literals hold."""
    ops, found = set(table_ops(onednn)), {}
    for path in onednn.iterdir():
        if path.name == "table.cc":
            continue
        # Activation's act_type values share names with operators (relu,
        # sigmoid, tanh): as attribute values (and kinds) they may appear.
        literals = set(re.findall(r'"([^"\\\n]*)"', re.sub(r"//[^\n]*", "", path.read_text())))
        named = literals & ops - ({"relu", "sigmoid", "tanh"} if path.name == "eltwise.cc"
                                  else set())
        if named:
            found[path.name] = sorted(named)
    return found


def undefined_kinds(onednn=ONEDNN):
    """The kinds eltwise rows of the table name that eltwise.cc's kKinds
    does not define (the library would refuse its table when loaded)."""
    named = re.findall(r'row\("[^"]+", "eltwise", "([^"]+)"', (onednn / "table.cc").read_text())
    kinds = (onednn / "eltwise.cc").read_text().split("const Kind kKinds[] = {", 1)[1]
    defined = re.findall(r'^\s*\{"([^"]+)", ', kinds.split("\n};", 1)[0], flags=re.M)
    return sorted(set(named) - set(defined))


def family_objects(onednn=ONEDNN):
    """{family name: its Family object}, as the backend's files name them
    (FamilyName, table.h)."""
    return dict(re.findall(r'^const FamilyName \w+\("([^"]+)", (k\w+)\);',
                           "\n".join(p.read_text() for p in onednn.glob("*.cc")), flags=re.M))


def undefined_families(onednn=ONEDNN):
    """The families the table's rows name that no file of the backend
    defines (the library would refuse its table when loaded)."""
    named = re.findall(r'row\("[^"]+", "([^"]+)"', (onednn / "table.cc").read_text())
    return sorted(set(named) - set(family_objects(onednn)))


def test_files_and_functions_stay_small():
    files = sorted(p for p in SOURCES.rglob("*") if p.is_file())
    assert len(files) >= 30 and SOURCES / "operator" / "amp_pass.cc" in files
    long_files = {str(p.relative_to(SOURCES)): n for p in files
                  if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long_files, f"files over {MAX_FILE_LINES} lines: {long_files}"
    long = [(str(p.relative_to(SOURCES)), line, n, head) for p in files
            for line, n, head in _blocks(p.read_text()) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_checker_sees_a_long_function():
    body = "int f(int x) {\n" + "  x += 1;\n" * 70 + "  return x;\n}\n"
    assert [n for _, n, _ in _blocks(body)] == [73]


def test_operator_names_appear_only_in_the_table():
    assert {"Convolution", "FullyConnected", "BatchNorm", "clip", "amp_cast"} <= set(table_ops())
    found = names_outside_table()
    assert not found, f"operator names outside table.cc: {found}"


def test_every_eltwise_row_names_a_kind_eltwise_defines():
    assert undefined_kinds() == []


def test_every_family_a_row_names_is_defined():
    assert undefined_families() == []


def test_the_kind_check_finds_an_undefined_kind(tmp_path):
    for name in ("table.cc", "eltwise.cc"):
        (tmp_path / name).write_text((ONEDNN / name).read_text())
    table = tmp_path / "table.cc"
    table.write_text(table.read_text().replace('"eltwise", "tanh"', '"eltwise", "hyperbolic"'))
    assert undefined_kinds(tmp_path) == ["hyperbolic"]


def test_planning_names_no_family():
    """The plan and the region ask families through their Family's fields
    and hooks (table.h): they name no family object and include no
    family's header."""
    families = set(family_objects().values())
    assert {"kCasts", "kLinear", "kEltwise"} <= families
    family_headers = {"fusion.h", "linear.h", "weights.h", "depthwise.h", "lookup.h"}
    found = {}
    for name in PLANNING:
        text = (ONEDNN / name).read_text()
        named = set(re.findall(r"\b\w+\b", _code(text))) & families
        named |= set(re.findall(r'#include "([^"]+)"', text)) & family_headers
        if named:
            found[name] = sorted(named)
    assert found == {}
