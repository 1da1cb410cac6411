"""Batches of any size through every kind of region: float32, bfloat16 and
INT8, run whole or in chunks of images (src/operator/onednn/chunks.cc).

A region is planned for the batch of its first call and planned again for
another. Each takes batches of 0 (an empty result, in MXNet's NumPy shape
semantics, where 0 is a size and not "unknown"), of 1, of a prime number of
images and of more than it was planned for, through the block users run
(hybridized with static allocation, which keeps the regions' plans from call
to call). Every image of a batch gets what it gets alone (to 1e-5 of the
largest output), and MXNet's float32 to the compute type's rounding.

A property test draws the region graphs (convolutions with BatchNorm and
activations, residual adds, pooling, dense heads, softmax), the image size
(large enough for float regions to run in chunks, or not) and the sequence
of batch sizes.
"""
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mxamp.backends
import mxamp.gluon
from isa import needs, require_onednn3
from mxamp import quantization

require_onednn3()

COMPUTES = [pytest.param("float32", marks=pytest.mark.cpu),
            pytest.param("bfloat16", marks=needs("bf16")), pytest.param("int8", marks=needs("avx2"))]
# Against MXNet's float32: max |got - ref| <= TOL * max |ref| for float
# regions (summation order and BatchNorm folding; bfloat16's 8 significant
# bits over a few layers); relative L2 error for INT8 (the calibration
# covers every batch, so the error is rounding alone).
TOL = {"float32": 1e-4, "bfloat16": 6e-2, "int8": 6e-2}
EXAMPLES = int(os.environ.get("MXAMP_FUZZ_EXAMPLES", "6"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def _net(layers, head):
    """A symbol of `layers` (each ("conv", filters, kernel, bn, act),
    ("residual", act), ("pool", kind)) and `head` ("none", "dense",
    "softmax")."""
    x = mx.sym.var("data")
    with mx.name.NameManager():
        for layer in layers:
            if layer[0] == "conv":
                _, filters, kernel, bn, act = layer
                x = mx.sym.Convolution(x, num_filter=filters, kernel=(kernel, kernel),
                                       pad=(kernel // 2, kernel // 2))
                x = mx.sym.BatchNorm(x, fix_gamma=False) if bn else x
                x = mx.sym.Activation(x, act_type=act) if act else x
            elif layer[0] == "residual":
                y = mx.sym.Convolution(x, num_filter=layer[2], kernel=(3, 3), pad=(1, 1))
                x = mx.sym.Activation(x + y, act_type=layer[1]) if layer[1] else x + y
            else:
                x = mx.sym.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type=layer[1])
        if head == "none":
            return x
        x = mx.sym.FullyConnected(mx.sym.Flatten(x), num_hidden=5)
        return mx.sym.softmax(x) if head == "softmax" else x


def _params(sym, shape, seed=0):
    """Weights uniform with unit variance over each output's inputs (so that
    the logits of a wide dense head stay of order 1), biases in +-0.5,
    BatchNorm variances in [0.5, 1.5]."""
    rs = np.random.RandomState(seed)
    arg_shapes, _, aux_shapes = sym.infer_shape(data=shape)
    args = {n: mx.nd.array(rs.uniform(-1, 1, s) * (3 / np.prod(s[1:])) ** 0.5
                           if n.endswith("weight") else rs.uniform(-0.5, 0.5, s))
            for n, s in zip(sym.list_arguments(), arg_shapes) if n != "data"}
    aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux


def _backend_model(sym, args, aux, compute, calib):
    """The backend's model as users make it: quantize_model (naive
    calibration on `calib`) for INT8, else apply_backend."""
    if compute == "int8":
        return quantization.quantize_model(
            sym, args, aux, label_names=(), calib_mode="naive",
            calib_data=mx.io.NDArrayIter(calib, batch_size=len(calib)))
    return mxamp.backends.get("onednn").apply_backend(sym, args, aux, compute=compute)


def _block(sym, args, aux):
    block = mxamp.gluon.symbol_block(sym, [mx.sym.var("data")], args, aux, mx.cpu())
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def _reference(sym, args, aux, x):
    """MXNet's float32 output on a non-empty batch x. Fresh copies of the
    parameters: MXNet's own oneDNN kernels leave parameters they read for a
    batch of 0 unusable (a later call fails in NDArray::SetMKLMem)."""
    ex = sym.bind(mx.cpu(), {**{k: v.copy() for k, v in args.items()}, "data": x},
                  aux_states={k: v.copy() for k, v in aux.items()}, grad_req="null")
    return ex.forward(is_train=False)[0].asnumpy()


def _check_batches(sym, image, batches, compute, seed=0):
    """The backend's block of sym, planned on the first of `batches`, runs
    each of them, batch n being the first n images of one set: right shapes,
    MXNet's float32 within TOL, and each image the same whatever the batch
    (to 1e-5 of the largest output)."""
    args, aux = _params(sym, (1,) + image, seed)
    images = np.random.RandomState(seed + 1).uniform(-1, 1, (max(batches),) + image)
    images = images.astype(np.float32)
    refs = {n: _reference(sym, args, aux, mx.nd.array(images[:n])) for n in set(batches) if n}
    out, out_args, out_aux = _backend_model(sym, args, aux, compute, mx.nd.array(images))
    assert mxamp.backends.get("onednn").regions(out), "nothing ran on the backend"
    block = _block(out, out_args, out_aux)
    with mx.util.np_shape(True):
        got = [block(mx.nd.array(images[:n])).asnumpy() for n in batches]
    widest = got[int(np.argmax(batches))]
    for n, out in zip(batches, got):
        assert out.dtype == np.float32 and out.shape == (n,) + widest.shape[1:]
        if n:
            _close(out, refs[n], compute)
            assert np.abs(out - widest[:n]).max() <= 1e-5 * np.abs(widest).max()


def _close(got, ref, compute):
    if compute == "int8":
        error = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    else:
        error = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-6)
    assert error <= TOL[compute], f"{compute}: error {error} against MXNet's float32"


# The first batch plans the region; then 0, 1, a prime, more than planned.
SEQUENCE = [4, 0, 1, 7, 9, 0, 4]
# 3 x 128 x 128 float32: 192 KiB an image, so float regions run 4 images in
# chunks of 2 or 4 (512 KiB at least), INT8 ones whole (2 MiB).
LARGE = (3, 128, 128)


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("image", [(6, 10, 7), LARGE])
def test_batches_of_every_size(compute, image):
    sym = _net([("conv", 8, 3, True, "relu"), ("residual", "relu", 8), ("pool", "max"),
                ("conv", 4, 1, False, None)], "dense")
    _check_batches(sym, image, SEQUENCE, compute)


ZERO_CHILD = """
import mxnet as mx, mxamp.backends
from mxamp import quantization
data = mx.sym.var("data")
x = mx.sym.Activation(mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="c"), act_type="relu")
sym = mx.sym.FullyConnected(x, num_hidden=3, name="fc")
shapes = dict(zip(sym.list_arguments(), sym.infer_shape(data=(2, 6, 10, 7))[0]))
args = {{n: mx.nd.ones(s) * 0.1 for n, s in shapes.items() if n != "data"}}
if {compute!r} == "int8":
    out, args, aux = quantization.quantize_model(
        sym, args, {{}}, label_names=(), calib_mode="naive",
        calib_data=mx.io.NDArrayIter(mx.nd.ones((2, 6, 10, 7)), batch_size=2))
else:
    out, args, aux = mxamp.backends.get("onednn").apply_backend(sym, args, {{}}, compute={compute!r})
assert mxamp.backends.get("onednn").regions(out)
with mx.util.np_shape(True):
    ex = out.bind(mx.cpu(), {{**args, "data": mx.nd.zeros((0, 6, 10, 7))}}, aux_states=aux)
    print(ex.forward()[0].asnumpy().shape)
"""


@pytest.mark.parametrize("compute", COMPUTES)
def test_a_batch_of_zero_through_a_region_is_empty(compute):
    """The first call a batch of 0 (a chunk's size once divided by it: the
    process died of SIGFPE), in a child so that a signal fails the test."""
    done = subprocess.run([sys.executable, "-c", ZERO_CHILD.format(compute=compute)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["(0,", "3)"]


LAYERS = st.one_of(
    st.tuples(st.just("conv"), st.integers(2, 8), st.sampled_from([1, 3]), st.booleans(),
              st.sampled_from([None, "relu", "sigmoid", "tanh"])),
    st.tuples(st.just("residual"), st.sampled_from([None, "relu"])),
    st.tuples(st.just("pool"), st.sampled_from(["max", "avg"])))


@st.composite
def _graphs(draw):
    """(layers, head, image): a residual reads what the layer before wrote,
    so it takes that layer's channels."""
    image = draw(st.sampled_from([(3, 9, 11), (2, 16, 16), LARGE]))
    layers, channels = [], image[0]
    for layer in draw(st.lists(LAYERS, min_size=1, max_size=4)):
        if layer[0] == "pool" and image[1] // 2 ** (1 + sum(p[0] == "pool" for p in layers)) < 1:
            continue
        channels = layer[1] if layer[0] == "conv" else channels
        layers.append(layer + (channels,) if layer[0] == "residual" else layer)
    return layers, draw(st.sampled_from(["none", "dense", "softmax"])), image


BATCHES = st.lists(st.sampled_from([0, 1, 2, 3, 5, 7, 8, 11]), min_size=2, max_size=5)


@pytest.mark.parametrize("compute", COMPUTES)
@PROPERTY
@given(graph=_graphs(), batches=BATCHES)
def test_random_regions_take_random_batches(compute, graph, batches):
    layers, head, image = graph
    _check_batches(_net(layers, head), image, [max(batches[0], 1)] + batches[1:], compute)
