"""One small network per GluonCV family converts and runs, both for this CPU
(ops without a low-precision kernel here stay float32) and for any device
(the full graph, run here with such ops emulated: mxamp.verify.run_emulated).

Networks have random weights with BatchNorm statistics calibrated to keep
activations at a trained network's scale (mxamp.tools.zoo.random_network). Dense
outputs (segmentation maps, pose heatmaps, action logits) are compared with
float32 by relative L2 error (bfloat16 3e-2, float16 5e-3). Detection outputs
pass through NMS, whose selection is discrete, so detectors are compared on
the tensors fed into NMS (mxamp.verify.selection_errors), same tolerances.
"""
import mxnet as mx
import numpy as np
import pytest

import mxamp
from mxamp.gluon import model_of
from mxamp.verify import (no_graph_fusion, pre_selection_errors, run_emulated,
                          selection_errors)
from mxamp.tools.zoo import calibrate_batchnorm, random_network

TOL = {"bfloat16": 3e-2, "float16": 5e-3}
DENSE = [("fcn_resnet50_voc", (1, 3, 128, 128)),
         ("simple_pose_resnet18_v1b", (1, 3, 128, 96)),
         ("i3d_resnet50_v1_kinetics400", (1, 3, 8, 64, 64))]
DETECTORS = [("yolo3_mobilenet1.0_voc", (1, 3, 160, 160)),
             ("ssd_300_vgg16_atrous_voc", (1, 3, 300, 300))]


def test_calibrated_batchnorm_hands_on_unit_scale():
    """Each layer shrinks activations ~30x; after calibration every BatchNorm
    outputs unit root mean square, with one scale per layer and no centering."""
    net = mx.gluon.nn.HybridSequential()
    for _ in range(3):
        net.add(mx.gluon.nn.Conv2D(8, 3, padding=1, weight_initializer=mx.init.Normal(1e-2)),
                mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"))
    net.initialize()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, 16, 16))
    net(x)
    calibrate_batchnorm(net, x)
    sym, args, aux, _ = model_of(net, "testing it")
    internals = sym.get_internals()
    outputs = [n for n in internals.list_outputs() if n.endswith("_fwd_output") and "batchnorm" in n]
    with no_graph_fusion():  # a fused Convolution + BatchNorm misreports its parts
        exe = mx.sym.Group([internals[n] for n in outputs]).bind(
            mx.cpu(), {**args, "data": x}, aux_states=aux, grad_req="null")
        squares = [float((o ** 2).mean().asscalar()) for o in exe.forward(is_train=False)]
    assert len(squares) == 3 and all(abs(s - 1) < 3e-2 for s in squares), squares
    for name, value in aux.items():
        value = value.asnumpy()
        assert (value == 0).all() if "mean" in name else (value == value[0]).all(), name


def test_calibration_reads_batchnorm_defaults():
    """A BatchNorm with every attribute at its default has no attributes in
    the graph (as in GluonCV's SSD-512)."""
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="conv")
    net = mx.gluon.SymbolBlock(mx.sym.BatchNorm(conv, name="bn"), data)
    net.initialize(mx.init.Normal(0.1))
    net.collect_params()["bn_beta"].set_data(mx.nd.zeros(4))  # (gamma is fixed to 1)
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, 8, 8))
    net(x)
    calibrate_batchnorm(net, x)
    assert abs(float((net(x) ** 2).mean().asscalar()) - 1) < 2e-2


def build(name, shape):
    return random_network(name, shape), mx.nd.random.uniform(shape=shape)


def as_list(outputs):
    return [o.astype("float32").asnumpy()
            for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]


def documented(net):
    """The symbol and the network's own parameter arrays, as MXNet documents
    getting them from a network that has run (``net(mx.sym.var("data"))``,
    ``net.collect_params()``): after the forward passes before, MXNet's
    oneDNN kernels hold some weights (depthwise ones, in yolo3_mobilenet1.0)
    in blocked layouts, which convert_model reads as they are."""
    out = net(mx.sym.var("data"))
    sym = mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
    params = net.collect_params()
    return (sym, {n: params[n].data() for n in sym.list_arguments() if n in params},
            {n: params[n].data() for n in sym.list_auxiliary_states()})


def full_graph(net, x, dtype):
    """The float32 and the any-device converted model, and the feeds; called
    after the network's float32 forward and the converted block's."""
    sym, args, aux = documented(net)
    converted = mxamp.convert_model(sym, args, aux, target_dtype=dtype, data_names=["data"])
    assert mxamp.summarize(converted[0])[f"amp_cast:{dtype}"] > 0
    return (sym, args, aux), converted, {"data": x}


@pytest.mark.parametrize("name, shape", DENSE, ids=[n for n, _ in DENSE])
def test_dense_outputs_match_float32(name, shape, dtype):
    net, x = build(name, shape)
    refs = as_list(net(x))
    for_cpu = as_list(mxamp.convert_hybrid_block(net, target_dtype=dtype)(x))
    _, converted, feeds = full_graph(net, x, dtype)
    for got in (for_cpu, as_list(run_emulated(*converted, feeds))):
        for out, ref in zip(got, refs):
            assert np.isfinite(out).all()
            assert np.linalg.norm(out - ref) <= TOL[dtype] * np.linalg.norm(ref)


@pytest.mark.parametrize("name, shape", DETECTORS, ids=[n for n, _ in DETECTORS])
def test_detectors_run(name, shape, dtype):
    net, x = build(name, shape)
    refs = as_list(net(x))
    converted = mxamp.convert_hybrid_block(net, target_dtype=dtype)
    got = as_list(converted(x))
    assert [o.shape for o in got] == [r.shape for r in refs]
    assert all(np.isfinite(o).all() for o in got)
    errors = pre_selection_errors(net, converted, x)
    assert len(errors) == 1 and max(errors.values()) <= TOL[dtype], errors
    reference, full, feeds = full_graph(net, x, dtype)
    assert all(np.isfinite(o).all() for o in as_list(run_emulated(*full, feeds)))
    errors = selection_errors(reference, full, feeds)
    assert len(errors) == 1 and max(errors.values()) <= TOL[dtype], errors
