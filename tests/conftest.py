import logging

import mxnet as mx
import pytest

DTYPES = ("float16", "bfloat16")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu: what the test expects depends on the CPU's instruction sets "
        "(mxamp.cpu.features); .ci/run reruns these under ISA limits")


@pytest.fixture(params=DTYPES)
def dtype(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    mx.random.seed(0)
    logging.getLogger("mxamp").setLevel(logging.INFO)
