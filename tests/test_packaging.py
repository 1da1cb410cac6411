"""The distribution: an sdist, a wheel built from it (its C++ libraries
compiled by CMake at wheel-build time), installed in a fresh venv outside
the checkout, converts, quantizes and runs the oneDNN backend with the
libraries it ships, never building any."""
import ast
import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ["mxamp/native/libmxamp.so", "mxamp/native/libmxamp_onednn.so"]

# Run by the venv's Python in an empty directory: a small Gluon network
# converted to bfloat16 for any device (run natively where this CPU has the
# kernels, else emulated), quantized to INT8, and run in float32 on the oneDNN backend.
USE = """
import json, sys
import mxnet as mx
from mxnet import gluon
import mxamp, mxamp.quantization as q
from mxamp import native, verify
from mxamp.gluon import apply_backend_block, model_of

mx.random.seed(0)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(8, 3, padding=1, in_channels=3), gluon.nn.BatchNorm(in_channels=8),
        gluon.nn.Activation("relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10, in_units=8))
net.initialize(mx.init.Xavier())
net.hybridize()
x = mx.nd.random.uniform(shape=(4, 3, 16, 16))
y = net(x)

bf16 = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", target_device="any")
compared = verify.compare(model_of(net, "")[:3], model_of(bf16, "")[:3], {"data": x})
qnet = q.quantize_net_v2(net, calib_data=mx.io.NDArrayIter(x, batch_size=2), calib_mode="naive")
on_backend = apply_backend_block(net, compute="float32")
print(json.dumps({
    "mxamp": mxamp.__file__, "loaded": sorted(map(str, native._loaded.values())),
    "casts": mxamp.summarize(model_of(bf16, "")[0]), "bf16": compared["errors"],
    "verified": compared["verified"],
    "int8": verify.relative_error(qnet(x), y), "int8_shape": qnet(x).shape,
    "backend": verify.relative_error(on_backend(x), y),
    "purelib": __import__("sysconfig").get_paths()["purelib"]}))
"""


def run(*cmd, **kwargs):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, (cmd, done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built by pip from an sdist of the checkout, as `python -m
    build` does (so the sdist must hold everything the build needs)."""
    out = tmp_path_factory.mktemp("dist")
    code = f"import scikit_build_core.build as b; print(b.build_sdist({str(out)!r}))"
    sdist = out / run(sys.executable, "-c", code, cwd=ROOT).splitlines()[-1]
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(sdist))
    return sdist, next(out.glob("mxamp-*.whl"))


def test_sdist_holds_the_sources_and_not_the_checks(wheel):
    sdist, _ = wheel
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames()}
    assert {"pyproject.toml", "CMakeLists.txt", "README.md", "mxamp_cli.py",
            "src/operator/amp_pass.cc", "src/operator/onednn/library.cc",
            "src/operator/onednn/table.cc", "src/operator/onednn/table.h",
            "mxamp/native/inputs.py"} <= names
    assert not {n for n in names if n.startswith(("tests/", "bench/")) or n.endswith(".so")}
    assert not {n for n in names if n.endswith("lib_api.cc")}  # compiled from the mxnet wheel


def test_wheel_ships_the_built_libraries(wheel):
    _, whl = wheel
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        metadata = z.read("mxamp-0.1.0.dist-info/METADATA").decode()
    assert set(LIBRARIES) <= names and "mxamp_cli.py" in names
    assert not {n for n in names if n.startswith("src/") or n.endswith(".cc")}
    assert whl.name == "mxamp-0.1.0-py3-none-linux_x86_64.whl"  # MXNet's C ABI, not Python's
    for line in ("License: Apache-2.0", "Requires-Python: <3.12,>=3.11",
                 "Provides-Extra: zoo", "Requires-Dist: mxnet==1.9.1",
                 "Requires-Dist: onednn-cpu-gomp==2023.2.0", "# mxamp"):
        assert line in metadata
    assert "graphviz" not in metadata


def test_installed_wheel_converts_quantizes_and_runs_the_backend(wheel, tmp_path):
    _, whl = wheel
    venv = tmp_path / "venv"
    # The venv sees the global MXNet, numpy and oneDNN (no download) through
    # a path line, not as a site directory: a site directory's .pth files
    # would bring in the editable install of the checkout (its import hook
    # comes before any path), and the wheel's mxamp must be what runs.
    run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    python = str(venv / "bin" / "python")
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(site.strip()) / "global-site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(python, "-m", "pip", "install", "-q", "--no-deps", str(whl))
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CXX")}
    # No compiler and an empty cache: the libraries can only be the wheel's.
    env.update(CXX="/nonexistent", MXAMP_CACHE=str(tmp_path / "cache"))
    got = json.loads(run(python, "-c", USE, cwd=work, env=env).splitlines()[-1])

    package = Path(got["purelib"]) / "mxamp"
    assert Path(got["mxamp"]) == package / "__init__.py"
    assert str(venv) in got["purelib"] and not got["mxamp"].startswith(str(ROOT))
    assert got["loaded"] == sorted(str(Path(got["purelib"]) / lib) for lib in LIBRARIES)
    assert not (tmp_path / "cache").exists()
    # bfloat16: data, conv weight and bias, dense weight and bias; float32: the output
    assert got["casts"] == {"amp_cast:bfloat16": 5, "amp_cast:float32": 1}, got
    assert got["verified"] in ("native", "emulated")
    assert max(got["bf16"]) < 3e-2, got  # bfloat16 keeps 8 significant bits
    assert got["int8_shape"] == [4, 10] and got["int8"] < 3e-2, got  # 8 bits, ranges from this data
    assert got["backend"] < 1e-5, got  # float32 regions: only summation order differs

    # `mxamp` command and `python -m mxamp.build` of the installed package
    assert "Usage: mxamp" in run(str(venv / "bin" / "mxamp"), "--help", cwd=work, env=env)
    assert run(python, "-m", "mxamp.build", cwd=work, env=env).split() == [
        str(Path(got["purelib"]) / lib) for lib in LIBRARIES]


def test_zoo_without_gluoncv_names_the_extra(tmp_path):
    """GluonCV is optional (mxamp[zoo]): without it `mxamp zoo` says so in
    one line instead of a ModuleNotFoundError traceback."""
    code = ("import sys; sys.modules['gluoncv'] = None; import mxamp_cli; "
            "sys.argv = ['mxamp', 'zoo', 'resnet18_v1', '--out', 'out']; mxamp_cli.main()")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("Error: the zoo networks need GluonCV (")
    assert done.stderr.endswith("): install mxamp[zoo]\n") and done.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def _imports(path):
    """The top-level names of the modules a script imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _needed(name, extras=(), seen=None):
    """The distributions `name` (with `extras`) pulls in, itself included,
    by normalized name (those of one not installed here: its own only)."""
    seen = set() if seen is None else seen
    key = canonicalize_name(name)
    if key in seen:
        return seen
    seen.add(key)
    try:
        lines = importlib.metadata.requires(name) or ()
    except importlib.metadata.PackageNotFoundError:
        return seen
    for line in lines:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (*extras, "")):
            _needed(req.name, tuple(req.extras), seen)
    return seen


def test_bench_imports_are_what_mxamp_bench_installs():
    """Every module bench/ imports comes with `pip install mxamp[bench]`
    (packages already on a machine must not hide a missing one), but the
    anchor engines of bench/requirements-anchor.txt, which run in their own
    venv, and the scripts' own modules (bench/, example/). A module not
    installed here (the test extra lacks onnx) is taken to be its
    distribution's name."""
    anchors = {Requirement(line).name for line in
               (ROOT / "bench" / "requirements-anchor.txt").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    local = {p.stem for folder in ("bench", "example") for p in (ROOT / folder).glob("*.py")}
    providers = importlib.metadata.packages_distributions()
    declared = _needed("mxamp", ("bench",))
    missing = {}
    for script in sorted((ROOT / "bench").glob("*.py")):
        for module in _imports(script) - set(sys.stdlib_module_names) - local - {"mxamp"}:
            if module in anchors and script.name == "onnx_anchor.py":
                continue
            if not {canonicalize_name(d) for d in providers.get(module, [module])} & declared:
                missing.setdefault(module, []).append(script.name)
    assert not missing, f"imported by bench/ but not installed by mxamp[bench]: {missing}"
