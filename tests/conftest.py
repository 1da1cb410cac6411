import logging
import os

# pytest-xdist runs one worker process per core: one OpenMP thread each, so
# the workers do not fight over the cores (set before MXNet starts OpenMP)
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The commands run in this process (click's CliRunner) would lower its
# address-space limit to what a memory cgroup leaves, for every test after
# them; tests/tools/test_cgroup_memory.py turns it on where it tests it.
os.environ["MXAMP_CGROUP_LIMIT"] = "0"

import mxnet as mx  # noqa: E402
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
