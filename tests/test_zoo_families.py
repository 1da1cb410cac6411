"""One small network per GluonCV family converts for the CPU and runs.

Dense outputs (segmentation maps, pose heatmaps, action logits) are compared
with float32 by relative L2 error (bfloat16 3e-2; float16 for the CPU keeps
the convolutions in float32 and must match closely). Detection outputs pass
through NMS, whose selection is discrete, so detectors are compared on the
tensors fed into NMS (mxamp.verify.pre_selection_errors), same tolerances.
"""
import mxnet as mx
import numpy as np
import pytest
from gluoncv import model_zoo

import mxamp
from mxamp.verify import pre_selection_errors

TOL = {"bfloat16": 3e-2, "float16": 1e-3}
DENSE = [("fcn_resnet50_voc", (1, 3, 128, 128)),
         ("simple_pose_resnet18_v1b", (1, 3, 128, 96)),
         ("i3d_resnet50_v1_kinetics400", (1, 3, 8, 64, 64))]
DETECTORS = [("yolo3_mobilenet1.0_voc", (1, 3, 160, 160)),
             ("ssd_300_vgg16_atrous_voc", (1, 3, 300, 300))]


def build(name, shape):
    net = model_zoo.get_model(name, pretrained=False, pretrained_base=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(shape=shape)
    return net, x


def as_list(outputs):
    return [o.asnumpy() for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]


@pytest.mark.parametrize("name, shape", DENSE, ids=[n for n, _ in DENSE])
def test_dense_outputs_match_float32(name, shape, dtype):
    net, x = build(name, shape)
    refs = as_list(net(x))
    got = as_list(mxamp.convert_hybrid_block(net, target_dtype=dtype)(x))
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
    if dtype == "bfloat16":
        assert mxamp.summarize(converted._cached_graph[1])["amp_cast:bfloat16"] > 0
