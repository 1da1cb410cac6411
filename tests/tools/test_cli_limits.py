"""The command line's edges, run as a user runs it (a subprocess): numeric
options out of range and output prefixes that name a directory."""
import os
import subprocess
import sys

import pytest
from published import listing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()"]


def mxamp(*args, cwd=None):
    return subprocess.run([*COMMAND, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--out", "z", "--workers",
      "3000000000"], "Invalid value for '--workers': 3000000000 is not in the range 1<=x<=1024"),
    (["convert", "m", "--dtype", "bfloat16", "--epoch", "100000"],
     "Invalid value for '--epoch': 100000 is not in the range 0<=x<=9999"),
])
def test_numeric_options_out_of_range_get_one_line(tmp_path, args, message):
    """--workers 3000000000 ended in an OverflowError traceback from multiprocessing."""
    done = mxamp(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr
    assert os.listdir(tmp_path) == []


def test_out_naming_a_directory_writes_into_it(tiny, tmp_path):
    """--out 'outdir/' wrote the hidden-looking '-symbol.json' and '-0000.params'."""
    (tmp_path / "outdir").mkdir()
    for out in ("outdir/", "outdir"):
        done = mxamp("convert", tiny, "--dtype", "bfloat16", "--shape", "data:1,3,8,8",
                     "--out", out, "--overwrite", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert listing(tmp_path / "outdir") == [".tiny-bfloat16.mxamp", "tiny-bfloat16-0000.params",
                                            "tiny-bfloat16-symbol.json"]
    done = mxamp("convert", tiny, "--dtype", "bfloat16", "--shape", "data:1,3,8,8", "--out",
                 "missing/", cwd=tmp_path)  # made, as zoo makes its --out
    assert done.returncode == 0, done.stderr
    assert listing(tmp_path / "missing") == [".tiny-bfloat16.mxamp", "tiny-bfloat16-0000.params",
                                             "tiny-bfloat16-symbol.json"]


def test_a_shape_that_does_not_fit_is_one_line_without_mxnets_source_location(tiny, tmp_path):
    """MXNet's check put its time and C++ file in the middle of the line:
    '... conv0: [21:57:16] ../src/operator/nn/convolution.cc:151: Check failed: ...'."""
    done = mxamp("convert", tiny, "--dtype", "bfloat16", "--shape", "data:1,3,8", "--out",
                 "o", cwd=tmp_path)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("Error: the shapes of ['data'] do not fit the graph: Error in "
                                  "operator "), done.stderr
    assert "Check failed: dshp.ndim() == 4U (3 vs. 4) : Input data should be 4D" in done.stderr
    assert ".cc:" not in done.stderr and os.listdir(tmp_path) == []
