"""mxamp convert / quantize on the files of a model that is not float32 (an
INT8 model mxamp quantize wrote, a float16 model mxamp convert wrote): one
Error line naming what to convert instead, status 1, nothing written."""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()"]
ENV = {**os.environ, "PYTHONPATH": ROOT}
SHAPE = ["--shape", "data:1,3,8,8"]


def mxamp(*args, cwd):
    return subprocess.run([*COMMAND, *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def written(tiny):
    """The directory of `tiny` with c.npy, tiny-int8 and tiny-float16 written by mxamp."""
    directory = os.path.dirname(tiny)
    np.save(os.path.join(directory, "c.npy"),
            np.random.RandomState(0).rand(8, 3, 8, 8).astype("float32"))
    for args in (["quantize", "tiny", "--calib", "c.npy"],
                 ["convert", "tiny", "--dtype", "float16", *SHAPE]):
        done = mxamp(*args, cwd=directory)
        assert done.returncode == 0, done.stderr
    return directory


CASES = {
    "convert int8": (["convert", "tiny-int8", "--dtype", "bfloat16", *SHAPE, "--out", "o"],
                     "Error: tiny-int8 is int8 on the oneDNN backend; convert the original "
                     "float32 model instead\n"),
    "quantize int8": (["quantize", "tiny-int8", "--calib", "c.npy", "--out", "o"],
                      "Error: tiny-int8 is int8 on the oneDNN backend; quantize the original "
                      "float32 model instead\n"),
    # Without --shape: the format is the error, not the missing shape
    "convert float16": (["convert", "tiny-float16", "--dtype", "bfloat16", "--out", "o"],
                        "Error: the model is already converted to float16 (its inputs carry "
                        "mxamp's __mxamp_converted__ attribute); convert the original "
                        "float32 model instead"),
    "quantize float16": (["quantize", "tiny-float16", "--calib", "c.npy", "--out", "o"],
                         "Error: the model is already converted to float16 (its inputs carry "
                         "mxamp's __mxamp_converted__ attribute); quantize the original "
                         "float32 model instead"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_model_that_is_not_float32_is_one_error(written, case):
    args, start = CASES[case]
    done = mxamp(*args, cwd=written)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(start), done.stderr
    verb = args[0]
    assert f"; {verb} the " in done.stderr
    assert not [n for n in os.listdir(written) if n.startswith("o-")]
