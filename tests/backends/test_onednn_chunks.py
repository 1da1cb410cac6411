"""A region running its batch in chunks of images (src/operator/onednn/chunks.cc):
where every operator keeps images apart, a region plans a chunk of a few
images (at least 512 KiB of input in float, 2 MiB in INT8) and runs the
batch chunk by chunk, spread over the threads with primitives made for one
thread. What oneDNN runs is read from its log (the problem's minibatch), in
a child Python with a set thread count, which also checks the outputs: the
same as calls of one chunk each (to 1e-5 of the largest), and MXNet's
float32 to the compute type's rounding (relative L2 error)."""
import os

import pytest

import onednn_verbose as verbose
from isa import needs, require_onednn3

require_onednn3()

# 224 x 224 RGB float32 images: 588 KiB each, so float regions run chunks of
# one image and INT8 regions chunks of four.
CHUNK = {"float32": 1, "bfloat16": 1, "int8": 4}
COMPUTES = [pytest.param("float32", marks=pytest.mark.cpu),
            pytest.param("bfloat16", marks=needs("bf16")), pytest.param("int8", marks=needs("avx2"))]

# The child: a strided stem reading the data twice (so the region has two
# inputs that are one tensor), a residual pair of convolutions (BatchNorm,
# relu), average pooling and a classifier, both outputs of the region (in
# bfloat16 its parameters are read through casts). `head` may replace the
# classifier. The backend's model (INT8: quantize_model, naive calibration)
# runs the batch once logged; then, unlogged, it must give what it gives for
# the batch cut into calls of one chunk each (|diff| <= 1e-5 max|out|), and
# match MXNet's float32 (relative L2 error under `tol`).
CHILD = """
import numpy as np, mxnet as mx
import mxamp.backends, onednn_verbose
from mxamp import quantization
def cbr(x, name, **kw):
    x = mx.sym.Convolution(x, num_filter=8, name=name, **kw)
    x = mx.sym.BatchNorm(x, fix_gamma=False, name=name + "_bn")
    return mx.sym.Activation(x, act_type="relu")
data = mx.sym.var("data")
stem = cbr(data, "stem", kernel=(4, 4), stride=(4, 4)) + mx.sym.Convolution(
    data, kernel=(4, 4), stride=(4, 4), num_filter=8, name="proj")
body = cbr(cbr(stem, "a", kernel=(3, 3), pad=(1, 1)), "b", kernel=(3, 3), pad=(1, 1))
x = mx.sym.Pooling(body + stem, kernel=(1, 1), global_pool=True, pool_type="avg")
sym = mx.sym.Group([mx.sym.FullyConnected(mx.sym.Flatten(x), num_hidden=10, name="fc"), x])
{head}
rs = np.random.RandomState(0)
arg_shapes, _, aux_shapes = sym.infer_shape(data=({batch}, 3, 224, 224))
args = {{n: mx.nd.array(rs.uniform(-0.5, 0.5, s)) for n, s in zip(sym.list_arguments(), arg_shapes)}}
aux = {{n: mx.nd.array(rs.uniform(0.5, 1.5, s)) for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}}
x = args.pop("data")
if {compute!r} == "int8":
    out, out_args, out_aux = quantization.quantize_model(
        sym, args, aux, label_names=(), calib_mode="naive",
        calib_data=mx.io.NDArrayIter(x, batch_size={batch}))
else:
    out, out_args, out_aux = mxamp.backends.get("onednn").apply_backend(
        sym, args, aux, compute={compute!r})
assert len(mxamp.backends.get("onednn").regions(out)) == 1
def run(s, a, x, log=None):
    mod = mx.mod.Module(s, data_names=["data"], label_names=None)
    mod.bind(data_shapes=[("data", x.shape)], for_training=False)
    mod.set_params(a, out_aux if s is out else aux)
    for _ in range(2):
        mod.forward(mx.io.DataBatch([x]), is_train=False)
        [o.wait_to_read() for o in mod.get_outputs()]
    if log:
        with onednn_verbose.marked(log):
            mod.forward(mx.io.DataBatch([x]), is_train=False)
            [o.wait_to_read() for o in mod.get_outputs()]
    return [o.asnumpy() for o in mod.get_outputs()]
got = run(out, out_args, x, "steady")
calls = [run(out, out_args, x[i:i + {chunk}]) for i in range(0, {batch}, {chunk})]
ref = run(sym, args, x)
for k, g in enumerate(got):
    alone = np.concatenate([c[k] for c in calls])
    assert np.abs(g - alone).max() <= 1e-5 * np.abs(alone).max(), (k, np.abs(g - alone).max())
    err = np.linalg.norm(g - ref[k]) / np.linalg.norm(ref[k])
    assert err < {tol}, (k, err)
"""
TOL = {"float32": 1e-5, "bfloat16": 3e-2, "int8": 5e-2}


def _minibatches(compute, batch, threads=2, head=""):
    """The minibatch of each convolution the backend's model runs on `batch`
    images, in a child with `threads` OpenMP threads (which checks the
    numerics)."""
    script = CHILD.format(head=head, batch=batch, compute=compute, tol=TOL[compute],
                          chunk=CHUNK[compute] if not head else batch)
    lines = verbose.run(["-c", script], env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    # the problem field: mb4_ic3oc8_ih224oh56kh4sh4...
    return sorted(int(p[9].split("_")[0][2:]) for p in lines["steady"]
                  if verbose.kind(p) == "convolution")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("compute", COMPUTES)
def test_a_batch_of_large_images_runs_in_chunks(compute, threads):
    """Eight 224 x 224 images: each of the four convolutions runs once per
    chunk (one image in float, four in INT8), on one thread or spread over
    two, giving what calls of one chunk give."""
    images = CHUNK[compute]
    assert _minibatches(compute, 8, threads) == [images] * (4 * 8 // images)


@pytest.mark.cpu
def test_a_region_that_regroups_images_runs_the_batch_whole():
    """A Reshape may move data between images, so the region holding one
    runs its batch at once."""
    head = "sym = mx.sym.FullyConnected(mx.sym.Reshape(x, shape=(0, -1)), num_hidden=10)"
    assert _minibatches("float32", 4, head=head) == [4] * 4


@pytest.mark.cpu
@needs("avx2")
def test_a_batch_of_one_int8_chunk_runs_whole():
    """Four images are one INT8 chunk (2 MiB of input): they run at once."""
    assert _minibatches("int8", 4) == [4] * 4
