"""conftest.py placed beside MXNet's own tests by test_mxnet_tests.py.

On a machine without a GPU the GPU test file's tests run on the CPU
(``mx.gpu`` gives the CPU context), except those that need what only a GPU
has, which are skipped with the reason. ``download_model`` and the Gluon
model zoo's ``get_model_file`` write random stand-ins (standins.py);
``nose.tools`` is a stand-in too."""
import os
import sys

import mxnet as mx
import mxnet.gluon.model_zoo.model_store
import mxnet.test_utils
import pytest

sys.path.insert(0, os.environ["MXAMP_UPSTREAM_HELPERS"])  # tests/upstream: standins
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stubs"))  # nose
sys.path.append(os.path.join(os.path.dirname(__file__), "unittest"))  # their `common`
import standins  # noqa: E402

mxnet.test_utils.download_model = standins.download_model
mxnet.gluon.model_zoo.model_store.get_model_file = standins.get_model_file

try:
    HAS_GPU = mx.context.num_gpus() > 0
except mx.base.MXNetError:  # a CPU-only build
    HAS_GPU = False
if not HAS_GPU:
    mx.gpu = mx.context.gpu = lambda device_id=0: mx.cpu(device_id)

# "<folder>/<test>": why it needs a GPU.
GPU_ONLY = {
    "gpu/test_amp_conversion": "binds float16 models whose convolutions and fully "
                               "connected layers need float16 GEMMs, which MXNet has only "
                               "on GPUs ('FP16 gemm on cpu not implemented')",
    "gpu/test_amp_conversion_rnn": "checks cuDNN's version and runs a float16 LSTM and "
                                   "Dense (float16 GEMMs, GPU only)",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = GPU_ONLY.get(f"{os.path.basename(os.path.dirname(str(item.fspath)))}/"
                              f"{item.name}")
        if reason and not HAS_GPU:
            item.add_marker(pytest.mark.skip(reason=f"GPU only: {reason}"))
