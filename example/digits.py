"""scikit-learn's handwritten digits (shipped with scikit-learn, nothing is
downloaded) and a small CNN trained on them, for the INT8 and training
examples: accuracy needs a trained model, which random weights are not."""
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn
from sklearn.datasets import load_digits

import mxamp


def data():
    """(train x, train y, test x, test y); images (N, 1, 16, 16) in [0, 1],
    the 8x8 digits upsampled so a few strided layers fit."""
    digits = load_digits()
    x = np.repeat(np.repeat(digits.images / 16.0, 2, axis=1), 2, axis=2)[:, None]
    x, y = x.astype("float32"), digits.target.astype("float32")
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def cnn():
    net = nn.HybridSequential(prefix="digits_")
    with net.name_scope():
        net.add(nn.Conv2D(16, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
                nn.Conv2D(32, 3, strides=2, padding=1), nn.BatchNorm(), nn.Activation("relu"),
                nn.MaxPool2D(), nn.Flatten(), nn.Dense(64, activation="relu"), nn.Dense(10))
    return net


def train(net, epochs, amp=False):
    """Trains `net` (initialized here) with Adam; with `amp`, the loss is
    scaled (mxamp.init_trainer, mxamp.scale_loss; after mxamp.init).
    Returns (trainer, seconds)."""
    mx.random.seed(0)
    np.random.seed(0)  # the DataLoader's shuffling
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x, y, _, _ = data()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-2})
    if amp:
        mxamp.init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    batches = gluon.data.DataLoader(gluon.data.ArrayDataset(x, y), batch_size=64, shuffle=True)
    start = time.perf_counter()
    for _ in range(epochs):
        for xb, yb in batches:
            with autograd.record():
                loss = loss_fn(net(xb), yb)
                if amp:
                    with mxamp.scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
            if not amp:
                loss.backward()
            trainer.step(xb.shape[0])
    return trainer, time.perf_counter() - start


def accuracy(predict, x, y):
    """Top-1 accuracy of `predict(NDArray batch) -> scores`."""
    scores = predict(mx.nd.array(x))
    return float(np.mean(scores.astype("float32").asnumpy().argmax(axis=1) == y))
