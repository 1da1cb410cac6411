"""The C++ layout (src/): files and functions stay small; in the oneDNN
backend (src/operator/onednn/) operator names appear only in the operator
table, every eltwise row names a kind eltwise.cc defines, every family a
row names has its file, and the plan and the region name no family."""
import re
from pathlib import Path

import pytest

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


# A block's head (its code since the last statement or block at its level)
# names a namespace, class, struct, union, enum or an extern "C" block: it
# holds declarations, and the function bodies in it are counted one by one.
_SCOPE = re.compile(r'\b(namespace|class|struct|union|enum)\b[^()]*$|\bextern\s*""\s*$')
# How a function body's head ends: its parameters, a qualifier, a trailing
# return type, a member initializer's braces, or a lambda's captures.
_FUNCTION = re.compile(r'[)}&]\s*$|\b(const|noexcept|override|final|mutable|try)\s*$'
                       r'|->[^;{}]*$|(^|[^\w\]\s])\s*\[[^\]]*\]\s*$')


def _functions(text):
    """(first line, line count, head) of every function body of `text` that
    sits in a namespace, class or the file itself, counted from its head's
    first line (template and signature) to its closing brace. The blocks
    and lambdas inside a function count as its lines; braces that
    initialize data are no function."""
    code = re.sub(r"^[ \t]*#[^\n]*", "", _code(text), flags=re.M)
    kinds, out, head_at = [], [], 0  # kinds: the open blocks, outermost first
    for pos, ch in enumerate(code):
        if ch == ";":
            head_at = pos + 1
        elif ch == "{":
            head = code[head_at:pos]
            if kinds and kinds[-1] != "scope":
                kinds.append("inner")
            elif _SCOPE.search(head):
                kinds.append("scope")
            elif _FUNCTION.search(head.strip()):
                kinds.append((head_at + len(head) - len(head.lstrip()), head.strip()))
            else:
                kinds.append("data")
            head_at = pos + 1
        elif ch == "}":
            kind = kinds.pop()
            if isinstance(kind, tuple):
                first = code.count("\n", 0, kind[0]) + 1
                out.append((first, code.count("\n", 0, pos) + 2 - first, kind[1]))
            if kind != "data":  # `a_{x}, b_{y} {` is one constructor's head
                head_at = pos + 1
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
            for line, n, head in _functions(p.read_text()) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


LONG_BODY = "  x += 1;\n" * 70 + "  return x;\n}\n"  # 72 lines with its closing brace


@pytest.mark.parametrize("head, lines", [
    ("int f(int x) {\n", 73),
    ("int f(int x)\n{\n", 74),  # the brace on a line of its own
    ("template <class T>\nT f(T x,\n    T y) noexcept {\n", 75),
    ("int f(int x) noexcept(false) {\n", 73),
    ("auto f(int x) -> int {\n", 73),
    ("const auto f = [] {\n  int x = 0;\n", 74),
    ("const auto f = [](int x) mutable {\n", 73),
    ("namespace n {\nstruct S : Base {\n  int f(int x) const override {\n", 73),
    ('extern "C" {\nint f(int x) {\n', 73),
    ("S::S(int x) : a_{x}, b_(x) {\n", 73),
])
def test_the_checker_sees_a_long_function(head, lines):
    assert [n for _, n, _ in _functions(head + LONG_BODY)] == [lines]


def test_the_checker_counts_a_function_once_and_data_not_at_all():
    text = ("namespace {\nconst int kTable[] = {\n" + "  1,\n" * 70 + "};\n"
            "const Row kRow{\n" + "  2,\n" * 70 + "};\n"
            "int f(int x) {\n  if (x) {\n    x = [&] { return 1; }();\n  }\n  return x;\n}\n"
            "}  // namespace\n")
    assert [(line, n) for line, n, _ in _functions(text)] == [(146, 6)]


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
