"""The layering docs/architecture.md describes: each layer imports only the
layers above it, no module imports itself back through others, and importing
the package (backends included) builds and loads nothing."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mxamp"
# Top to bottom, as in docs/architecture.md.
LAYERS = ("errors", "cpu", "dtypes", "registry", "graph", "native", "policy", "backends",
          "convert", "gluon", "verify", "quantization", "training", "tools")
FACADES = ("__init__", "__main__", "amp", "build")  # re-exports and entry points


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path):
    """mxamp modules `path` imports, at any depth of its code (lazy imports too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] == "mxamp":
                # `from . import probe` imports a module; its package is only its parent
                modules = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
                found.update(modules or {base})
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "mxamp")
    # Python imports every parent package first; that is no dependency.
    return found - {name, "mxamp"}


def layer_of(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_every_module_belongs_to_a_layer():
    assert sorted({layer_of(m) for m in MODULES} - set(FACADES)) == sorted(LAYERS)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) not in FACADES))
def test_imports_only_go_up(module):
    own = LAYERS.index(layer_of(module))
    below = sorted(m for m in imported_modules(MODULES[module])
                   if layer_of(m) in FACADES or LAYERS.index(layer_of(m)) > own)
    assert below == [], f"{module} imports from lower layers"


def test_no_import_cycle():
    graph = {m: {i for i in imported_modules(p) if i in MODULES} for m, p in MODULES.items()}
    graph = {m: deps for m, deps in graph.items() if layer_of(m) not in FACADES}
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
