"""Every operator name mxamp takes, from the API or the command line, is
checked against MXNet's registry, with the registered names it is closest
to: 'convolution' was silently ignored by --exclude-op and the layer ran
INT8."""
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import mxamp
from mxamp import quantization, training
from graphs import tiny_net

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HINT = r"'convolution' \(did you mean 'Convolution'\?\)"


@pytest.fixture(scope="module")
def model():
    return mxamp.gluon.model_of(tiny_net(), "x")[:3]


CALLS = {
    "fp32_ops": lambda m: mxamp.convert_model(*m, target_dtype="bfloat16",
                                              fp32_ops=["convolution"]),
    "target_dtype_ops": lambda m: mxamp.convert_model(*m, target_dtype="bfloat16",
                                                      target_dtype_ops=["convolution"]),
    "conditional_fp32_ops": lambda m: mxamp.convert_symbol(
        m[0], target_dtype="bfloat16", conditional_fp32_ops=[("convolution", "a", ["b"])]),
    "widest_dtype_ops": lambda m: mxamp.convert_symbol(m[0], widest_dtype_ops=["convolution"]),
    "follow_ops": lambda m: mxamp.convert_symbol(m[0], follow_ops=["convolution"]),
    "rules": lambda m: mxamp.convert_symbol(m[0], rules=[mxamp.Rule("convolution", print)]),
    "excluded_op_names": lambda m: quantization.quantize_model(
        *m, data_names=["data"], calib_mode="naive", excluded_op_names=["convolution"],
        calib_data=mx.io.NDArrayIter(mx.nd.ones((2, 3, 8, 8)))),
    "exclude_operators": lambda m: quantization.quantize_net_v2(
        tiny_net(), calib_data=[[mx.nd.ones((2, 3, 8, 8))]], calib_mode="naive",
        exclude_operators=["convolution"]),
    "init fp32_ops": lambda m: training.init("bfloat16", fp32_ops=["convolution"]),
}


@pytest.mark.parametrize("option", list(CALLS))
def test_an_unknown_operator_name_is_refused_with_the_registered_one(model, option):
    with pytest.raises(mxamp.OptionError, match=f"names operators MXNet does not know: {HINT}"):
        CALLS[option](model)


def mxamp_cli(directory, *args):
    return subprocess.run([sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()", *args],
                          cwd=directory, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args", [["quantize", "tiny", "--calib", "c.npy", "--exclude-op"],
                                  ["convert", "tiny", "--dtype", "bfloat16", "--shape",
                                   "data:1,3,8,8", "--fp32-op"],
                                  ["inspect", "tiny", "--fp32-op"]],
                         ids=["quantize", "convert", "inspect"])
def test_the_command_line_refuses_it_before_any_work(tmp_path, args):
    tiny_net().export(str(tmp_path / "tiny"))

    np.save(tmp_path / "c.npy", np.ones((2, 3, 8, 8), "float32"))
    before = sorted(os.listdir(tmp_path))
    done = mxamp_cli(tmp_path, *args, "convolution", "--out", "o")
    option = args[-1]
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"Error: {option} names operators MXNet does not know: 'convolution' "
                           "(did you mean 'Convolution'?); see "
                           "mxnet.operator.get_all_registered_operators() (see "
                           f"'mxamp {args[0]} --help')\n")
    assert sorted(os.listdir(tmp_path)) == before
