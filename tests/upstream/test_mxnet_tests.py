"""MXNet v1.9.x's own AMP tests (tests/python/mkl/test_contrib_amp.py and
tests/python/gpu/test_contrib_amp.py) and quantization tests
(tests/python/mkl/test_quantization_mkldnn.py, which runs
tests/python/quantization/test_quantization.py, and
tests/python/mkl/test_subgraph.py) pass with mxamp wherever they pass with
the reference, but for the tests named in FORMAT_CHECKS.

The files are read at run time from an MXNet source checkout, never kept in
this repository: $MXAMP_MXNET_SOURCE (a git directory or a work tree; default
/work/.mirror/apache+mxnet/repo) at $MXAMP_MXNET_REF (default v1.9.x). They are
written into a temporary tree with what they import and upstream_conftest.py,
then run by pytest in a subprocess twice: as they are, and with only the
reference switched to mxamp (SWITCH). GPU-only tests are skipped on a machine
without a GPU (the others of the GPU file run on the CPU), and the models
they download are random stand-ins (standins.py). Run with -s for the counts.
"""
import dataclasses
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

SOURCE = os.environ.get("MXAMP_MXNET_SOURCE", "/work/.mirror/apache+mxnet/repo")
REF = os.environ.get("MXAMP_MXNET_REF", "v1.9.x")
HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Suite:
    run: tuple  # the test files pytest runs, under tests/python
    imported: tuple  # what they import, under tests/python
    switch: dict  # {file: {reference text: mxamp text}}: the only edits


SUITES = {
    "amp": Suite(
        run=("mkl/test_contrib_amp.py", "gpu/test_contrib_amp.py"),
        imported=("unittest/common.py", "common/models.py", "train/test_bucketing.py"),
        switch={path: {"import mxnet.contrib.amp as amp": "import mxamp as amp",
                       "from mxnet.contrib.amp import amp": "from mxamp import amp"}
                for path in ("mkl/test_contrib_amp.py", "gpu/test_contrib_amp.py")}),
    "quantization": Suite(
        run=("mkl/test_quantization_mkldnn.py", "mkl/test_subgraph.py"),
        imported=("quantization/test_quantization.py", "unittest/common.py", "common/models.py"),
        # They reach the reference as an attribute of mxnet.
        switch={path: {"import mxnet as mx\n": "import mxnet as mx\nimport mxamp.quantization\n",
                       "mx.contrib.quant.": "mxamp.quantization."}
                for path in ("quantization/test_quantization.py", "mkl/test_subgraph.py")}),
}

# Tests that check MXNet's own INT8 format, which mxamp's calibrated
# quantization replaces by design (docs/quantization.md): they expect
# quantize_model's arg_params to be _quantize_params of the graph and the
# float32 arg_params alone, and its aux_params to be the caller's. The
# backend's s8 weight packs also hold folded BatchNorm statistics (aux_params,
# which leave the model) and biases corrected by calibration's channel means.
FORMAT_CHECKS = {
    "mkl/test_quantization_mkldnn.py::test_quantize_model",
    "mkl/test_quantization_mkldnn.py::test_quantize_model_with_forward",
}


def read_upstream(path):
    """The text of `path` in the MXNet checkout; skips the test when there is none."""
    tree = Path(SOURCE) / path
    if tree.is_file():
        return tree.read_text()
    try:
        return subprocess.run(["git", "--git-dir", SOURCE, "show", f"{REF}:{path}"],
                              check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        pytest.skip(f"no MXNet source at MXAMP_MXNET_SOURCE={SOURCE} (ref {REF}) to read "
                    f"{path} from: {str(detail).strip()}")


def extract(root, suite, switched):
    """Writes the suite's upstream files (switched to mxamp if `switched`),
    the conftest and the nose stand-in under `root`."""
    python = root / "tests" / "python"
    for path in suite.run + suite.imported:
        text = read_upstream(f"tests/python/{path}")
        for old, new in suite.switch.get(path, {}).items() if switched else ():
            assert old in text, f"{path} no longer has {old!r}"
            text = text.replace(old, new)
        target = python / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (python / "conftest.py").write_text((HERE / "upstream_conftest.py").read_text())
    (python / "stubs" / "nose").mkdir(parents=True)
    (python / "stubs" / "nose" / "__init__.py").write_text("")
    sys.path.insert(0, str(HERE))
    from standins import NOSE_TOOLS
    sys.path.remove(str(HERE))
    (python / "stubs" / "nose" / "tools.py").write_text(NOSE_TOOLS)
    return python


def run(python, suite):
    """{test id: 'passed' | 'failed' | 'skipped'} of a pytest run of the suite."""
    report = python / "report.xml"
    env = {**os.environ, "MXAMP_UPSTREAM_HELPERS": str(HERE)}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--import-mode=importlib", "-o", "addopts=", f"--junitxml={report}",
                    "--rootdir", str(python), *suite.run],
                   cwd=python, env=env, capture_output=True, text=True, timeout=1800)
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        folder, module = case.get("classname").split(".")[-2:]
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else \
            "skipped" if "skipped" in kinds else "passed"
        outcomes[f"{folder}/{module}.py::{case.get('name')}"] = outcome
    return outcomes


def counts(outcomes):
    return {kind: sum(o == kind for o in outcomes.values())
            for kind in ("passed", "failed", "skipped")}


@pytest.mark.parametrize("name", SUITES)
def test_mxamp_fails_nothing_the_reference_passes(tmp_path, name):
    suite = SUITES[name]
    trees = [extract(tmp_path / "reference", suite, switched=False),
             extract(tmp_path / "mxamp", suite, switched=True)]
    with ThreadPoolExecutor(2) as pool:  # two processes: the runs take half the time
        theirs, ours = pool.map(run, trees, [suite] * 2)
    print(f"\nMXNet {REF} {name} tests: mxamp {counts(ours)}, reference {counts(theirs)}")
    for test in sorted(ours):
        print(f"  {test}: mxamp {ours[test]}, reference {theirs[test]}")
    assert ours.keys() == theirs.keys()
    assert counts(theirs)["passed"] >= 5  # the files ran, not merely failed to import
    worse = sorted(t for t, o in ours.items() if o == "failed" and theirs[t] == "passed")
    assert worse == sorted(FORMAT_CHECKS & set(worse))
