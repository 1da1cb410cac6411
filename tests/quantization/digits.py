"""Small models trained on scikit-learn's digits (shipped with the package,
no download), for accuracy checks that random weights cannot give."""
import functools

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn
from sklearn.datasets import load_digits

SIDE = 16  # the 8x8 images upsampled, so a few strided layers fit


@functools.lru_cache(maxsize=None)
def data():
    """(train x, train y, test x, test y): images (N, 1, 16, 16) in [0, 1]."""
    digits = load_digits()
    x = np.repeat(np.repeat(digits.images / 16.0, 2, axis=1), 2, axis=2)[:, None]
    x, y = x.astype("float32"), digits.target.astype("float32")
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    cut = 1400
    return x[:cut], y[:cut], x[cut:], y[cut:]


class Residual(nn.HybridBlock):
    """conv-bn-relu-conv-bn, added to its input, relu."""

    def __init__(self, channels, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = nn.HybridSequential()
            self.body.add(nn.Conv2D(channels, 3, padding=1, use_bias=False), nn.BatchNorm(),
                          nn.Activation("relu"),
                          nn.Conv2D(channels, 3, padding=1, use_bias=False), nn.BatchNorm())

    def hybrid_forward(self, F, x):
        return F.relu(self.body(x) + x)


def residual_cnn():
    """10 convolutions with BatchNorm and residual adds, then a dense head."""
    net = nn.HybridSequential(prefix="rescnn_")
    with net.name_scope():
        net.add(nn.Conv2D(16, 3, padding=1, use_bias=False), nn.BatchNorm(),
                nn.Activation("relu"), Residual(16), Residual(16),
                nn.Conv2D(32, 3, strides=2, padding=1, use_bias=False), nn.BatchNorm(),
                nn.Activation("relu"), Residual(32), Residual(32),
                nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(10))
    return net


def mlp():
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Flatten(), nn.Dense(128, activation="relu"),
                nn.Dense(64, activation="relu"), nn.Dense(10))
    return net


def trained(kind):
    """A hybridized network of `kind` ('residual_cnn' or 'mlp') trained on
    the digits' training split (fixed seed), run once. Not cached here: a
    live block with a built graph makes mxamp.init refuse to start."""
    mx.random.seed(0)
    np.random.seed(0)
    net = {"residual_cnn": residual_cnn, "mlp": mlp}[kind]()
    net.initialize(mx.init.Xavier())
    x, y, _, _ = data()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 3e-3})
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    batches = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=64,
                                    shuffle=True)
    for _ in range(8):
        for xb, yb in batches:
            with autograd.record():
                out = loss(net(xb), yb)
            out.backward()
            trainer.step(xb.shape[0])
    net.hybridize()
    net(mx.nd.array(x[:8]))
    return net


def predictions(net, x):
    return net(mx.nd.array(x)).asnumpy().argmax(axis=1)
