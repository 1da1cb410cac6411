"""Commands under an address-space limit (``ulimit -v``, RLIMIT_AS): each
completes, or ends with one line saying that memory ran out and what the
limit is; never a signal, a traceback or a hang. MXNet died inside its
engine under limits a little above its own size (SIGABRT starting its
threads, SIGSEGV making a primitive), and a traceback came out of its
import under lower ones."""
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from mxamp import address_space

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The size of a command's process once MXNet is loaded, as a command checks it.
SIZE = ("import mxamp.tools.cli, mxamp.address_space as a; "
        "print(a._used_kib())")


def limited(limit_kib, args, cwd):
    """A child under the limit: the console script, or Python code."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit_kib * 1024, resource.RLIM_INFINITY))
    command = [sys.executable, "-c", args] if isinstance(args, str) else \
        [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                          preexec_fn=cap, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from graphs import tiny_net
    where = tmp_path_factory.mktemp("limited")
    tiny_net().export(str(where / "tiny"))
    rng = np.random.RandomState(0)
    np.savez(where / "calib.npz", data=rng.rand(8, 3, 8, 8).astype(np.float32))
    return where


def test_commands_under_an_address_space_limit_complete_or_say_so(model):
    # Measured under a limit (glibc then keeps to one malloc arena), far above it.
    loaded = int(limited(64 << 20, SIZE, model).stdout.split()[-1])
    needed = address_space.needed_kib()
    commands = {"convert": ["convert", "tiny", "--dtype", "bfloat16", "--shape",
                            "data:1,3,8,8", "--out", "c", "--overwrite"],
                "quantize": ["quantize", "tiny", "--calib", "calib.npz", "--out", "q",
                             "--overwrite"]}
    for extra in (-200_000, 30_000, needed - 20_000, needed + 120_000):
        limit = loaded + extra
        for name, args in commands.items():
            done = limited(limit, args, model)
            lines = [line for line in done.stderr.splitlines() if not line.startswith("[")]
            assert done.returncode in (0, 1), (name, extra, done.returncode, done.stderr[-3000:])
            if extra > needed:
                assert done.returncode == 0, (name, done.stderr[-3000:])
                continue
            assert done.returncode == 1, (name, extra)
            assert len(lines) == 1 and "Traceback" not in done.stderr, (name, extra, lines)
            assert lines[0].startswith(("Error: out of memory", "Error: mxamp and MXNet could not be loaded")), \
                lines
            assert f"limited to {limit:,} KiB by ulimit -v" in lines[0], lines


def test_the_shortfall_names_the_limit_and_what_is_left(monkeypatch):
    monkeypatch.setattr(address_space, "limit_kib", lambda: 1_000_000)
    monkeypatch.setattr(address_space, "_used_kib", lambda: 950_000)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stack_kib = 8192 if stack == resource.RLIM_INFINITY else stack // 1024
    needed = address_space.WORK_KIB + 2 * (stack_kib + address_space.THREAD_EXTRA_KIB)
    assert address_space.needed_kib() == needed
    assert address_space.shortfall() == (
        "out of memory: the address space is limited to 1,000,000 KiB by ulimit -v, and 50,000 "
        f"KiB of it are left once MXNet is loaded; a command needs {needed:,} KiB more to "
        "start its threads: raise the limit")
    monkeypatch.setattr(address_space, "_used_kib", lambda: 1_000_000 - needed)
    assert address_space.shortfall() is None
    monkeypatch.setattr(address_space, "limit_kib", lambda: None)
    monkeypatch.setattr(address_space, "_used_kib", lambda: 10 ** 9)
    assert address_space.shortfall() is None and address_space.note() == ""


# A command whose conversion meets MXNet's own out-of-memory error.
FAILING = """
import sys, threading
import mxnet as mx
import mxamp.tools.cli as cli
def convert_model_with(*args, **kwargs):
    mx.nd.ones(1).wait_to_read()
    raise mx.base.MXNetError("Check failed: ret == 0 (12 vs. 0) : Allocation failed")
cli.convert_model_with = convert_model_with
import mxamp_cli
sys.argv = ["mxamp", "convert", "tiny", "--dtype", "bfloat16", "--shape", "data:1,3,8,8"]
mxamp_cli.main()
"""


def test_mxnets_out_of_memory_error_is_one_line_naming_the_command(model):
    done = subprocess.run([sys.executable, "-c", FAILING], cwd=model, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        "Error: out of memory in 'mxamp convert': Check failed: ret == 0 (12 vs. 0) : "
        "Allocation failed"]
    assert not [n for n in os.listdir(model) if "bfloat16" in n]


def test_a_lock_taken_without_waiting_is_no_memory_error():
    from mxnet.base import MXNetError

    from mxamp.errors import is_out_of_memory
    assert not is_out_of_memory(BlockingIOError(11, "Resource temporarily unavailable"))
    assert is_out_of_memory(MXNetError("Resource temporarily unavailable"))



# The start of a child that converts a Dense(5000) layer (a 100 MB
# weight): the block `net`, its symbol `sym`, its `params`, and the caller's
# `weight` with its bytes `before`.
BIG_DENSE = """
import resource, sys
import mxnet as mx
import mxamp
net = mx.gluon.nn.Dense(5000, in_units=5000, prefix="fc_")
net.initialize(mx.init.Uniform(1.0))
net.hybridize()
net(mx.nd.ones((1, 5000)))
weight = net.weight.data()
before = weight.asnumpy().tobytes()
sym = net(mx.sym.var("data"))
params = {"fc_weight": weight, "fc_bias": net.bias.data()}
"""
# BIG_DENSE converted by `how` once the address space left is `extra` KiB:
# it prints the outcome and whether the caller's weight is still float32
# and unchanged.
CONVERT_UNDER_LIMIT = BIG_DENSE + """
extra, how = int(sys.argv[1]), sys.argv[2]
used = next(int(line.split()[1]) for line in open("/proc/self/status")
            if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, ((used + extra) * 1024, resource.RLIM_INFINITY))
try:
    if how == "block":
        out = mxamp.convert_hybrid_block(net, target_dtype="float16", target_device="any",
                                         cast_optional_params=True)
        print("converted", out.collect_params()["fc_weight"].dtype.__name__)
    else:
        _, out, _ = mxamp.convert_model(sym, params, {}, target_dtype="float16",
                                         cast_optional_params=True)
        print("converted", out["fc_weight"].dtype.__name__)
except MemoryError as err:
    print(type(err).__name__, err)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(weight.dtype.__name__, weight.asnumpy().tobytes() == before)
"""


@pytest.mark.parametrize("how", ["model", "block"])
def test_a_conversion_that_runs_out_of_memory_says_what_it_was_doing(tmp_path, how):
    outcomes = {}
    for extra in (40_000, 1_500_000):  # under the cast's 50 MB; far above the model
        done = subprocess.run([sys.executable, "-c", CONVERT_UNDER_LIMIT, str(extra), how],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": ROOT})
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        first, caller = done.stdout.splitlines()[-2:]
        assert caller == "float32 True"  # the caller's weight is untouched either way
        outcomes[extra] = first
    assert outcomes[1_500_000] == "converted float16"
    assert outcomes[40_000].startswith("OutOfMemory out of memory while "), outcomes
    assert "by ulimit -v" in outcomes[40_000], outcomes


def test_zoo_under_an_address_space_limit_completes_or_says_so(model):
    """zoo builds and runs a GluonCV network before converting it: it asks
    for more (MXNet died building one with a few hundred MiB left)."""
    loaded = int(limited(64 << 20, SIZE, model).stdout.split()[-1])
    needed = address_space.needed_kib("zoo")
    assert needed > address_space.needed_kib()
    args = ["zoo", "resnet18_v1", "--dtype", "float16", "--shape", "1,3,32,32", "--out", "z",
            "--overwrite", "-q"]
    short = limited(loaded + needed - 60_000, args, model)
    assert short.returncode == 1 and "Traceback" not in short.stderr, short.stderr[-3000:]
    lines = [line for line in short.stderr.splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith(
        "Error: out of memory: the address space is limited to"), lines
    assert f"a command needs {needed:,} KiB more" in lines[0]
    done = limited(loaded + needed + 150_000, args, model)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_zoo_network_that_runs_out_of_memory_stops_the_batch(monkeypatch):
    """Not recorded as the network's failure ("not runnable here"), as
    other errors are: the batch stops with the error naming the network."""
    from mxnet.base import MXNetError
    from mxamp.errors import OutOfMemory
    from mxamp.tools import zoo

    def build(name, shape):
        raise MXNetError("Failed to allocate CPU Memory")
    monkeypatch.setattr(zoo, "build", build)
    with pytest.raises(OutOfMemory, match=r"^out of memory while building resnet18_v1"):
        zoo.run_model("resnet18_v1", ["float16"], shape=(1, 3, 32, 32))
    monkeypatch.setattr(zoo, "build", lambda name, shape: (_ for _ in ()).throw(
        ValueError("no such layer")))
    (failed,) = zoo.run_model("resnet18_v1", ["float16"], shape=(1, 3, 32, 32))
    assert failed["failed_in"] == "float32" and "no such layer" in failed["error"]

