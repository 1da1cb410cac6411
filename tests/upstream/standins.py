"""What MXNet's own AMP and quantization tests need beyond the upstream
files, for running them offline under the current pytest: the conftest
placed beside them (``upstream_conftest.py``) imports this module.

- ``download_model``: a stand-in for ``mxnet.test_utils.download_model`` that
  writes a randomly initialised network in place of the model zoo's
  imagenet1k-resnet-18 checkpoint: a pre-activation ResNet-18 symbol with the
  node names the tests read (``fc1``, ``stage2_unit1_conv2``, ``data``,
  ``softmax_label``). Nothing is downloaded.
- ``get_model_file``: a stand-in for the Gluon model zoo's, which writes a
  randomly initialised network of the name asked for in place of its
  pretrained parameters. Nothing is downloaded.
- ``NOSE_TOOLS``: the two helpers the tests import from ``nose.tools`` (nose
  does not run on Python 3.11), as a module text.
"""
import os

import mxnet as mx

NOSE_TOOLS = '''"""Stand-ins for the nose.tools helpers MXNet's tests import."""
import functools
import unittest


def make_decorator(func):
    """A decorator giving the function it wraps `func`'s name and metadata."""
    return lambda wrapper: functools.wraps(func)(wrapper)


def assert_raises(expected, *args, **kwargs):
    return unittest.TestCase().assertRaises(expected, *args, **kwargs)
'''


def _batchnorm(x, name):
    return mx.sym.BatchNorm(x, fix_gamma=False, eps=2e-5, name=name)


def _conv(x, filters, kernel, stride, name):
    pad = tuple(k // 2 for k in kernel)
    return mx.sym.Convolution(x, num_filter=filters, kernel=kernel, stride=stride, pad=pad,
                              no_bias=True, name=name)


def _unit(x, filters, stride, project, name):
    """A pre-activation residual unit: BN-ReLU-conv twice, plus the input
    (through a 1x1 convolution where the shape changes)."""
    act1 = mx.sym.Activation(_batchnorm(x, f"{name}_bn1"), act_type="relu", name=f"{name}_relu1")
    conv1 = _conv(act1, filters, (3, 3), stride, f"{name}_conv1")
    act2 = mx.sym.Activation(_batchnorm(conv1, f"{name}_bn2"), act_type="relu",
                             name=f"{name}_relu2")
    conv2 = _conv(act2, filters, (3, 3), (1, 1), f"{name}_conv2")
    shortcut = _conv(act1, filters, (1, 1), stride, f"{name}_sc") if project else x
    return conv2 + shortcut


def resnet18_symbol():
    data = mx.sym.var("data")
    body = mx.sym.BatchNorm(data, fix_gamma=True, eps=2e-5, name="bn_data")
    body = _conv(body, 64, (7, 7), (2, 2), "conv0")
    body = mx.sym.Activation(_batchnorm(body, "bn0"), act_type="relu", name="relu0")
    body = mx.sym.Pooling(body, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max",
                          name="pooling0")
    for stage, filters in enumerate((64, 128, 256, 512), start=1):
        for unit in (1, 2):
            stride = (2, 2) if stage > 1 and unit == 1 else (1, 1)
            body = _unit(body, filters, stride, unit == 1, f"stage{stage}_unit{unit}")
    body = mx.sym.Activation(_batchnorm(body, "bn1"), act_type="relu", name="relu1")
    body = mx.sym.Pooling(body, kernel=(7, 7), global_pool=True, pool_type="avg", name="pool1")
    fc = mx.sym.FullyConnected(mx.sym.flatten(body, name="flatten0"), num_hidden=1000,
                               name="fc1")
    return mx.sym.SoftmaxOutput(fc, name="softmax")


def download_model(model_name, dst_dir="./", meta_info=None):
    """Writes the random stand-in checkpoint as `model_name` (epoch 0) into
    `dst_dir` once; returns (prefix, epoch) as MXNet's download_model does."""
    prefix = os.path.join(dst_dir, model_name)
    if not os.path.exists(f"{prefix}-0000.params"):
        sym = resnet18_symbol()
        mod = mx.mod.Module(sym, data_names=["data"], label_names=["softmax_label"],
                            context=mx.cpu())
        mod.bind(data_shapes=[("data", (1, 3, 224, 224))],
                 label_shapes=[("softmax_label", (1,))])
        mod.init_params(mx.init.Xavier(magnitude=2))
        mx.model.save_checkpoint(prefix, 0, sym, *mod.get_params())
    return prefix, 0


def get_model_file(name, root=None):
    """The path of a parameters file for the zoo network `name`, written
    once (into `root`, default a folder beside this run's files) from a
    random initialisation, as the pretrained network's would be."""
    root = root or os.path.join(os.getcwd(), "models")
    path = os.path.join(os.path.expanduser(root), f"{name}.params")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        net = mx.gluon.model_zoo.vision.get_model(name)
        net.initialize(mx.init.Xavier(magnitude=2))
        net(mx.nd.zeros((1, 3, 224, 224)))  # shapes settled before saving
        net.save_parameters(path)
    return path
