"""INT8 quantization under an address-space limit (RLIMIT_AS, as a
container's memory limit sets it), a little above the process's size: each
call completes or raises one clear out-of-memory error saying what it was
doing; never a signal. In a child process per limit."""
import subprocess
import sys

from isa import needs, require_onednn3

require_onednn3()

# The child: a block quantized with quantize_net_v2 (naive calibration),
# then run, with the address space capped MARGIN MiB above its size once
# the block has run and the backend is loaded (as a long-lived server's).
CHILD = """
import os, resource, sys
import numpy as np, mxnet as mx
from mxnet.gluon import nn
import mxamp.backends
from mxamp import quantization
net = nn.HybridSequential()
for _ in range(3):
    net.add(nn.Conv2D(64, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"))
net.add(nn.GlobalAvgPool2D(), nn.Dense(10))
net.initialize()
net.hybridize()
x = mx.nd.array(np.random.RandomState(0).rand(8, 3, 112, 112))
net(x).wait_to_read()
mxamp.backends.get("onednn")
pages = int(open("/proc/self/statm").read().split()[0])
limit = pages * os.sysconf("SC_PAGE_SIZE") + ({margin} << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
try:
    q = quantization.quantize_net_v2(net, calib_data=[x] * 2, calib_mode="naive")
    q(x).wait_to_read()
    print("done")
except MemoryError as err:
    print(type(err).__name__, err)
except mx.base.MXNetError as err:
    print("MXNetError", mxamp.errors.mxnet_message(err))
"""


@needs("avx2")
def test_quantization_under_an_address_space_limit_fails_clearly():
    ends = []
    for margin in (4, 12, 25, 40, 400):
        done = subprocess.run([sys.executable, "-c", CHILD.format(margin=margin)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (margin, done.returncode, done.stderr[-2000:])
        ends.append(done.stdout.strip().splitlines()[-1])
    for end in ends:  # the INT8 block's own call: its region's message
        assert end == "done" or end.startswith("OutOfMemory out of memory while ") or \
            end.startswith("MXNetError mxamp_onednn region failed in oneDNN: out of memory"), end
    assert ends[-1] == "done"
    assert any(end.startswith("OutOfMemory out of memory while calibrating") for end in ends)
