"""The layering docs/architecture.md describes: each layer imports only the
layers above it, never the package itself (its `__init__` imports them all)
nor another facade, no module imports itself back through others (the
facades and the console script's entry point, mxamp_cli.py, included),
every import is the standard library, a declared dependency or mxamp
itself, importing the package (backends included) builds and loads
nothing, and no function is over 60 lines."""
import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mxamp"
ENTRY_POINT = PACKAGE.parent / "mxamp_cli.py"  # outside the package: it runs before mxamp imports
# Top to bottom, as in docs/architecture.md.
LAYERS = ("version", "process_wide", "address_space", "errors", "cpu", "dtypes", "registry",
          "graph", "native", "policy", "backends", "convert", "gluon", "verify", "quantization",
          "training", "tools")
FACADES = ("__init__", "__main__", "amp", "build")  # re-exports and entry points


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path):
    """mxamp modules `path` imports, at any depth of its code (lazy imports
    too), and the entry point if it imports that."""
    if path == ENTRY_POINT:
        return imported_by("mxamp_cli", path.read_text())
    found = imported_by(module_name(path), path.read_text(), path.name == "__init__.py")
    return found | {"mxamp_cli"} & imported_roots(path)


def imported_by(name, source, is_package=False):
    """The mxamp modules the code `source` of module `name` imports by
    name: `from P import x` imports module P.x where that is one, else the
    package P itself (its `__init__`, and all it imports), `mxamp` too."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] == "mxamp":
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                             for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "mxamp")
    # A module's own name is no dependency (nor are the parent packages
    # Python imports first: only a name the code spells counts).
    return found - {name}


def imported_roots(path, full=False, top_only=False):
    """What `path` imports by absolute name: the top-level names (or the full
    module names), at any depth of its code unless `top_only`."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module)
    return names if full else {n.split(".")[0] for n in names}


def layer_of(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_every_module_belongs_to_a_layer():
    assert sorted({layer_of(m) for m in MODULES} - set(FACADES)) == sorted(LAYERS)


def rank(module):
    """A module's place top to bottom: its layer's; the facades, which
    re-export or run the layers, below every layer."""
    layer = layer_of(module)
    return len(LAYERS) if layer in FACADES else LAYERS.index(layer)


def imports_below(module, imported):
    """The mxamp modules of `imported` that sit below `module`."""
    return sorted(m for m in imported & MODULES.keys() if rank(m) > rank(module))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_go_up(module):
    assert imports_below(module, imported_modules(MODULES[module])) == [], \
        f"{module} imports from lower layers"


@pytest.mark.parametrize("module, code, below", [
    ("mxamp.graph", "from . import convert_model", ["mxamp"]),
    ("mxamp.graph", "def f():\n    import mxamp\n", ["mxamp"]),
    ("mxamp.tools.cli", "from .. import __version__, cpu", ["mxamp"]),
    ("mxamp.convert.api", "from mxamp.amp import lists", ["mxamp.amp.lists"]),
    ("mxamp.graph", "from .convert import api", ["mxamp.convert.api"]),
    ("mxamp.convert.api", "from .. import cpu, graph\nfrom . import probe", []),
])
def test_the_layer_check_sees_an_import_of_the_package(module, code, below):
    """Importing the package runs its `__init__`, which imports every layer."""
    assert imports_below(module, imported_by(module, code)) == below


def declared_imports():
    """The top-level names importable from the distributions pyproject.toml
    declares: the dependencies and the `zoo` extra (mxamp zoo's)."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[; ]", d)[0].lower().replace("_", "-")
                for d in [*project["dependencies"], *project["optional-dependencies"]["zoo"]]}
    return {top for top, dists in importlib.metadata.packages_distributions().items()
            if any(d.lower().replace("_", "-") in declared for d in dists)}


@pytest.mark.parametrize("path", [*sorted(MODULES.values()), ENTRY_POINT],
                         ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_every_import_is_the_standard_library_a_dependency_or_mxamp(path):
    allowed = set(sys.stdlib_module_names) | declared_imports() | {"mxamp"}
    assert sorted(imported_roots(path) - allowed) == []


def test_no_module_of_the_package_imports_the_entry_point():
    """mxamp_cli.py imports the package (after holding the signals); the
    package importing it back closed a circle through seven modules."""
    assert sorted(m for m, p in MODULES.items() if "mxamp_cli" in imported_roots(p)) == []


def test_the_entry_point_imports_only_the_standard_library_before_it_runs():
    assert sorted(imported_roots(ENTRY_POINT, top_only=True) - set(sys.stdlib_module_names)) == []


def test_no_import_cycle():
    graph = {m: {i for i in imported_modules(p) if i in MODULES or i == "mxamp_cli"}
             for m, p in MODULES.items()}
    graph["mxamp_cli"] = {i for i in imported_modules(ENTRY_POINT) if i in MODULES}
    done, active = set(), []

    def visit(module):
        if module in active:
            pytest.fail(f"import cycle: {' -> '.join(active[active.index(module):] + [module])}")
        if module in done or module not in graph:
            return
        active.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        active.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_importing_everything_builds_and_loads_nothing(tmp_path):
    code = ("import mxamp, mxamp.backends.onednn, mxamp.tools.cli, mxamp.native as n; "
            "print(sorted(n._loaded), sorted(p.name for p in n.cache_dir().glob('*')))")
    env = {"PATH": "/usr/bin:/bin", "MXAMP_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "[] []\n"


MAX_FUNCTION_LINES = 60


def _code_lines(node):
    """The lines of a function from its first decorator (a command's options
    are part of it) to its last, its docstring left out (the API's NumPy
    docstrings document, they add no code)."""
    first_line = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = node.end_lineno - first_line + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def long_functions(module, path, limit=MAX_FUNCTION_LINES):
    """{module.function: lines} of the functions of `path` longer than
    `limit` lines of code (nested ones too; docstrings not counted)."""
    return {f"{module}.{node.name}": _code_lines(node)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _code_lines(node) > limit}


def test_no_function_over_60_lines():
    """In the package, its entry point and the benchmarks."""
    found = {}
    bench = [(f"bench.{p.stem}", p) for p in sorted((PACKAGE.parent / "bench").glob("*.py"))]
    for module, path in [*MODULES.items(), ("mxamp_cli", ENTRY_POINT), *bench]:
        found.update(long_functions(module, path))
    assert found == {}


def test_the_size_check_sees_a_long_function(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(x):\n" + "    x += 1\n" * 60 + "    return x\n"
                    "def g(x):\n    \"\"\"A docstring\n" + "    of many lines\n" * 60 +
                    "    \"\"\"\n    return x\n"
                    "@option(\n" + "    1,\n" * 50 + ")\n@option\n"
                    "def h(x):\n" + "    x += 1\n" * 8 + "    return x\n")
    # g: 2 lines of code; h: 10, and 53 of decorators
    assert long_functions("m", path) == {"m.f": 62, "m.h": 63}
