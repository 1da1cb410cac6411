"""Convolutions that compute only the rows and columns their readers read:
ResNet v1's last block of a stage, whose output only the next stage's
stride-2 1x1 convolutions read, computes every other row and column (its
3x3 convolution strides by 2, its residual operand is subsampled by a 1x1
pooling, the readers stride by 1). Float regions only; INT8 regions plan as
before (tests/backends/test_onednn_int8.py).

Outputs are compared with MXNet's float32 as in test_onednn_backend.py:
|got - ref| <= tol * max|ref|, tol 1e-4 computing in float32 (summation
order and BatchNorm folding only), 6e-2 in bfloat16 (8 significant bits,
rounding accumulated over a network).
"""
import re

import numpy as np
import pytest

import mxnet as mx

import mxamp.backends
import onednn_verbose as verbose
from isa import needs
from mxamp import native as _lib

try:
    _lib.onednn_prefix()
except RuntimeError:
    pytest.skip("oneDNN 3 packages not installed", allow_module_level=True)

NET_RTOL = {"bfloat16": 6e-2, "float32": 1e-4}

# A stem and two ResNet v1 bottleneck blocks: an identity block (s1), whose
# output only the transition block's (s2) stride-2 1x1 convolutions read,
# on a 9x9 input (odd: the subsampled rows are ceil(9 / 2) = 5). With
# `ALSO_OUTPUT`, s1's output is the network's second output too.
NET = """
def conv(x, name, kernel, filters, stride=1):
    x = mx.sym.Convolution(x, kernel=(kernel, kernel), stride=(stride, stride),
                           pad=((kernel - 1) // 2,) * 2, num_filter=filters, name=name)
    return mx.sym.BatchNorm(x, fix_gamma=False, name=name + "_bn")
relu = lambda x: mx.sym.Activation(x, act_type="relu")
def block(x, name, filters, stride=1, downsample=False):
    y = relu(conv(x, name + "a", 1, filters // 4, stride))
    y = relu(conv(y, name + "b", 3, filters // 4))
    y = conv(y, name + "c", 1, filters)
    return relu(y + (conv(x, name + "d", 1, filters, stride) if downsample else x))
s1 = block(relu(conv(mx.sym.var("data"), "stem", 3, 16)), "s1", 16)
net = mx.sym.FullyConnected(mx.sym.Flatten(mx.sym.Pooling(
    block(s1, "s2", 32, 2, True), kernel=(1, 1), global_pool=True, pool_type="avg")),
    num_hidden=10, name="fc")
if ALSO_OUTPUT:
    net = mx.sym.Group([net, s1])
rs = np.random.RandomState(0)
shapes = {"data": (2, 8, 9, 9)}
arg_shapes, _, aux_shapes = net.infer_shape(**shapes)
args = {n: mx.nd.array(rs.uniform(-0.5, 0.5, s))
        for n, s in zip(net.list_arguments(), arg_shapes)}
aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s))
       for n, s in zip(net.list_auxiliary_states(), aux_shapes)}
"""


@pytest.fixture(scope="module")
def onednn():
    return mxamp.backends.get("onednn")


@pytest.fixture(params=["float32", pytest.param("bfloat16", marks=needs("bf16"))])
def compute(request):
    return request.param


def _network(also_output):
    space = {"mx": mx, "np": np, "ALSO_OUTPUT": also_output}
    exec(NET, space)
    return space["net"], space["args"], space["aux"]


def _run(sym, args, aux):
    ex = sym.bind(mx.cpu(), args, aux_states={k: v.copy() for k, v in aux.items()},
                  grad_req="null")
    return [o.asnumpy() for o in ex.forward(is_train=False)]


def _close(got, ref, rtol):
    scale = max(float(np.abs(ref).max()), 1e-6)
    err = float(np.abs(got.astype(np.float32) - ref).max())
    assert err <= rtol * scale, f"max error {err} > {rtol} * {scale}"


@pytest.mark.parametrize("also_output", [False, True])
def test_stage_transition_matches_float32(also_output, compute, onednn):
    net, args, aux = _network(also_output)
    refs = _run(net, args, aux)
    out, out_args, out_aux = onednn.apply_backend(net, args, aux, compute=compute)
    assert len(onednn.regions(out)) == 1
    gots = _run(out, out_args, out_aux)
    assert [g.shape for g in gots] == [r.shape for r in refs]
    for got, ref in zip(gots, refs):
        _close(got, ref, NET_RTOL[compute])


def test_resnet50_matches_float32(compute, onednn):
    """Three stage transitions, at 72x72 (stages of 18, 9, 5 and 3 rows)."""
    from gluoncv.model_zoo import get_model
    net = get_model("resnet50_v1", pretrained=False)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3, 72, 72))
    ref = net(x).asnumpy()
    block = mxamp.gluon.apply_backend_block(net, compute=compute)
    assert len(onednn.regions(block._cached_graph[1])) == 1
    got = block(x).asnumpy()
    _close(got, ref, NET_RTOL[compute])
    assert (got.argmax(1) == ref.argmax(1)).all()


def _sizes(problem):
    return {name: int(n) for name, n in re.findall(r"([a-z]+)(\d+)", problem)}


def _convolutions_and_poolings(compute, also_output):
    """(ic, oc, ih, oh, kh, sh) of each convolution, (ih, oh, kh, sh) of
    each pooling, of a call of the network (the third: the first plans)."""
    script = ("import numpy as np, mxnet as mx, mxamp.backends, onednn_verbose\n"
              f"ALSO_OUTPUT = {also_output}\n" + NET +
              "onednn = mxamp.backends.get('onednn')\n"
              f"out, out_args, out_aux = onednn.apply_backend(net, args, aux, compute={compute!r})\n"
              "ex = out.bind(mx.cpu(), out_args, aux_states=out_aux, grad_req='null')\n"
              "onednn_verbose.call(ex, 3, 'call')\n")
    found = {"convolution": [], "pooling": []}
    for fields in verbose.run(["-c", script])["call"]:
        kind = verbose.kind(fields)
        if kind in found:
            s = _sizes(fields[-2])
            names = ("ic", "oc", "ih", "oh", "kh", "sh") if kind == "convolution" else \
                ("ih", "oh", "kh", "sh")
            found[kind].append(tuple(s[n] for n in names))
    return found


@pytest.mark.cpu
@pytest.mark.parametrize("compute", ["float32", pytest.param("bfloat16", marks=needs("bf16"))])
def test_last_block_of_a_stage_computes_what_the_next_stage_reads(compute):
    """s1's 3x3 convolution strides by 2 (9 -> 5 rows) and its 1x1 one
    runs on 5 rows; the stem's output, s1's residual operand, is pooled
    1x1 by 2 once; s2's 1x1 convolutions stride by 1 on 5 rows."""
    found = _convolutions_and_poolings(compute, also_output=False)
    assert sorted(found["convolution"]) == sorted([
        (8, 16, 9, 9, 3, 1),                                           # stem
        (16, 4, 9, 9, 1, 1), (4, 4, 9, 5, 3, 2), (4, 16, 5, 5, 1, 1),  # s1 a, b, c
        (16, 8, 5, 5, 1, 1), (8, 8, 5, 5, 3, 1), (8, 32, 5, 5, 1, 1),  # s2 a, b, c
        (16, 32, 5, 5, 1, 1)])                                         # s2 d
    assert sorted(found["pooling"]) == [(5, 1, 5, 1), (9, 5, 1, 2)]


@pytest.mark.cpu
def test_a_block_output_read_in_full_is_computed_in_full():
    """With s1's output a network output too, s1 computes every row and
    s2's 1x1 convolutions stride by 2 themselves; no subsampling pooling."""
    found = _convolutions_and_poolings("float32", also_output=True)
    assert sorted(found["convolution"]) == sorted([
        (8, 16, 9, 9, 3, 1),
        (16, 4, 9, 9, 1, 1), (4, 4, 9, 9, 3, 1), (4, 16, 9, 9, 1, 1),
        (16, 8, 9, 5, 1, 2), (8, 8, 5, 5, 3, 1), (8, 32, 5, 5, 1, 1),
        (16, 32, 9, 5, 1, 2)])
    assert found["pooling"] == [(5, 1, 5, 1)]
