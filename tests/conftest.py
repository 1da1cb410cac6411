import logging

import mxnet as mx
import pytest

DTYPES = ("float16", "bfloat16")


@pytest.fixture(params=DTYPES)
def dtype(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    mx.random.seed(0)
    logging.getLogger("mxamp").setLevel(logging.INFO)
