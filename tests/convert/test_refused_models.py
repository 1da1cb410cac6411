"""Models that are not float32 (they hold oneDNN backend regions, are INT8,
or are already float16 / bfloat16) are refused by every conversion and
quantization entry point with one OptionError saying what to convert
instead. Each case runs in a subprocess: MXNet's own queries on a region
node crashed the process (a segfault in list_auxiliary_states)."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}

SETUP = """
import json, logging
import mxnet as mx, mxamp
from mxamp import quantization
from mxamp.gluon import apply_backend_block, model_of
from graphs import tiny_net
logging.disable(logging.WARNING)
net = tiny_net()
x = mx.nd.ones((1, 3, 8, 8))
batches = [[mx.nd.random.uniform(shape=(4, 3, 8, 8))]]

def ran(block):
    block(x)
    return block

def model(block):
    return model_of(ran(block), "x")[:3]

def regions():
    return apply_backend_block(net, compute="float32")

def int8():  # mxamp's own INT8: backend regions
    return quantization.quantize_net_v2(net, calib_data=batches, calib_mode="naive")

def mxnet_int8():  # MXNet's INT8 graph format
    return quantization.quantize_net_v2(net, calib_data=batches, calib_mode="none")

def float16():  # for this CPU: its kernels run (an error MXNet raises later would not)
    return mxamp.convert_hybrid_block(net, target_dtype="float16")

def cast_float16():  # float16 by Block.cast, fed float16 data
    global x, batches
    x, batches = x.astype("float16"), [[b.astype("float16") for b in batches[0]]]
    block = tiny_net()
    block.cast("float16")
    return ran(block)
"""

CALLS = {
    "convert_hybrid_block": "mxamp.convert_hybrid_block(ran({model}), target_dtype='bfloat16')",
    "convert_model": "mxamp.convert_model(*model({model}), target_dtype='bfloat16')",
    "convert_symbol": "mxamp.convert_symbol(model({model})[0], target_dtype='bfloat16')",
    "quantize_model": "quantization.quantize_model(*model({model}), data_names=['data'], "
                      "calib_mode='naive', calib_data=mx.io.NDArrayIter(batches[0][0]))",
    "quantize_net_v2": "quantization.quantize_net_v2({model}, calib_data=batches, "
                       "calib_mode='naive')",
    "tune_int8": "quantization.tune_int8({model}, batches, lambda b: 1.0, 0.1)",
}
WHY = {"regions": r"the symbol holds mxamp's oneDNN backend regions \(_mxamp_onednn_region "
                  r"nodes: .*\); {verb} the float32 model they were made from instead",
       "int8": "the symbol holds mxamp's oneDNN backend regions",
       "mxnet_int8": r"the symbol is already quantized to INT8 \(it holds .*_contrib_quantize"
                     ".*\\); {verb} the float32 model it was quantized from instead",
       "float16": "the model is already converted to float16 .*; {verb} the original "
                  "float32 model instead",
       "cast_float16": r"the model's parameters \[.*\]( \.\.\.)? are float16; {verb} the float32 "
                       "model instead"}


def _outcomes(model):
    """{entry: [error type or "ok", message]} of each entry point on `model`."""
    code = SETUP + "outcomes = {}\n" + "".join(textwrap.dedent(f"""
        try:
            {call.format(model=model + "()")}
            outcomes[{entry!r}] = ["ok", ""]
        except Exception as err:
            outcomes[{entry!r}] = [type(err).__name__, str(err)]
        """) for entry, call in CALLS.items()) + "print(json.dumps(outcomes))"
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"status {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("model", list(WHY))
def test_a_model_that_is_not_float32_is_refused(model):
    """One subprocess per model runs every entry point on it."""
    for entry, (kind, message) in _outcomes(model).items():
        verb = "quantize" if entry.startswith(("quantize", "tune")) else "convert"
        if entry.startswith("convert") and model == "cast_float16":
            continue  # conversion's own float16-input handling, not this test's
        assert kind == "OptionError", (entry, message)
        assert re.match(WHY[model].format(verb=verb), message), (entry, message)
