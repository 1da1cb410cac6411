"""MXNet v1.9.x's own AMP tests (tests/python/mkl/test_contrib_amp.py and
tests/python/gpu/test_contrib_amp.py) pass with mxamp wherever they pass with
mxnet.contrib.amp.

The files are read at run time from an MXNet source checkout, never kept in
this repository: $MXAMP_MXNET_SOURCE (a git directory or a work tree; default
/work/.mirror/apache+mxnet/repo) at $MXAMP_MXNET_REF (default v1.9.x). They are
written into a temporary tree with what they import (unittest/common.py,
common/models.py, train/test_bucketing.py) and upstream_conftest.py, then run
by pytest in a subprocess twice: as they are, and with only the import of
mxnet.contrib.amp switched to mxamp. GPU-only tests are skipped on a machine
without a GPU (the others of the GPU file run on the CPU), and the model they
download is a random stand-in (standins.py). Run with -s for the counts.
"""
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

SOURCE = os.environ.get("MXAMP_MXNET_SOURCE", "/work/.mirror/apache+mxnet/repo")
REF = os.environ.get("MXAMP_MXNET_REF", "v1.9.x")
TESTS = ("tests/python/mkl/test_contrib_amp.py", "tests/python/gpu/test_contrib_amp.py")
IMPORTED = ("tests/python/unittest/common.py", "tests/python/common/models.py",
            "tests/python/train/test_bucketing.py")
# The only edit: the import of the reference, in every file that has it.
SWITCH = {"import mxnet.contrib.amp as amp": "import mxamp as amp",
          "from mxnet.contrib.amp import amp": "from mxamp import amp"}
HERE = Path(__file__).resolve().parent


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


def extract(root, switched):
    """Writes the upstream files (imports switched to mxamp if `switched`),
    the conftest and the nose stand-in under `root`."""
    for path in TESTS + IMPORTED:
        text = read_upstream(path)
        if switched:
            for old, new in SWITCH.items():
                assert path not in TESTS or old in text, f"{path} no longer has {old!r}"
                text = text.replace(old, new)
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    python = root / "tests" / "python"
    (python / "conftest.py").write_text((HERE / "upstream_conftest.py").read_text())
    (python / "stubs" / "nose").mkdir(parents=True)
    (python / "stubs" / "nose" / "__init__.py").write_text("")
    sys.path.insert(0, str(HERE))
    from standins import NOSE_TOOLS
    sys.path.remove(str(HERE))
    (python / "stubs" / "nose" / "tools.py").write_text(NOSE_TOOLS)
    return python


def run(python):
    """{test id: 'passed' | 'failed' | 'skipped'} of a pytest run of the two files."""
    report = python / "report.xml"
    env = {**os.environ, "MXAMP_UPSTREAM_HELPERS": str(HERE)}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--import-mode=importlib", "-o", "addopts=", f"--junitxml={report}",
                    "--rootdir", str(python), "mkl/test_contrib_amp.py",
                    "gpu/test_contrib_amp.py"],
                   cwd=python, env=env, capture_output=True, text=True, timeout=1800)
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        folder = case.get("classname").split(".")[-2]
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else \
            "skipped" if "skipped" in kinds else "passed"
        outcomes[f"{folder}/test_contrib_amp.py::{case.get('name')}"] = outcome
    return outcomes


def counts(outcomes):
    return {kind: sum(o == kind for o in outcomes.values())
            for kind in ("passed", "failed", "skipped")}


def test_mxamp_fails_nothing_the_reference_passes(tmp_path):
    trees = [extract(tmp_path / "reference", switched=False),
             extract(tmp_path / "mxamp", switched=True)]
    with ThreadPoolExecutor(2) as pool:  # two processes: the runs take half the time
        theirs, ours = pool.map(run, trees)
    print(f"\nMXNet {REF} AMP tests: mxamp {counts(ours)}, mxnet.contrib.amp {counts(theirs)}")
    for test in sorted(ours):
        print(f"  {test}: mxamp {ours[test]}, reference {theirs[test]}")
    assert ours.keys() == theirs.keys()
    assert counts(theirs)["passed"] >= 5  # the files ran, not merely failed to import
    worse = sorted(t for t, o in ours.items() if o == "failed" and theirs[t] == "passed")
    assert worse == []
