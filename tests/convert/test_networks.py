"""Gluon networks beyond plain CNNs: RNN layers, control flow, custom operators,
shared parameters, several inputs and outputs, integer inputs.

Each converts with convert_hybrid_block for the CPU in both dtypes, runs, and
matches float32 within the per-dtype tolerance of test_api (relative L2 error;
bfloat16 3e-2, float16 5e-3)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn, rnn

import mxamp

TOL = {"bfloat16": 3e-2, "float16": 5e-3}


def outputs(result):
    return [o.asnumpy() for o in (result if isinstance(result, (list, tuple)) else [result])]


def check(net, dtype, *inputs):
    net.initialize(mx.init.Xavier())
    net.hybridize()
    refs = outputs(net(*inputs))
    converted = mxamp.convert_hybrid_block(net, target_dtype=dtype)
    got = outputs(converted(*inputs))
    assert len(got) == len(refs)
    for out, ref in zip(got, refs):
        assert out.dtype == ref.dtype and np.isfinite(out).all()
        assert np.linalg.norm(out - ref) <= TOL[dtype] * np.linalg.norm(ref)
    return converted


class WithStates(nn.HybridBlock):
    """An RNN layer called with explicit begin states, as a SymbolBlock needs."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.dense = nn.Dense(3)

    def hybrid_forward(self, F, x, *states):
        out, _ = self.layer(x, list(states))
        return self.dense(out)


@pytest.mark.parametrize("layer, n_states", [
    (lambda: rnn.LSTM(8, num_layers=2, bidirectional=True), 2),
    (lambda: rnn.GRU(8), 1)], ids=["lstm_bi_2layer", "gru"])
def test_rnn_layers(layer, n_states, dtype):
    net = WithStates(layer())
    x = mx.nd.random.uniform(shape=(5, 2, 4))
    layers = 4 if n_states == 2 else 1
    states = [mx.nd.zeros((layers, 2, 8)) for _ in range(n_states)]
    check(net, dtype, x, *states)


def test_rnn_with_implicit_begin_state(dtype):
    """Without begin states Gluon builds zero states inside the graph; they convert too."""
    net = nn.HybridSequential()
    net.add(rnn.LSTM(8, num_layers=2, bidirectional=True), nn.Dense(3))
    check(net, dtype, mx.nd.random.uniform(shape=(5, 2, 4)))


class Foreach(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, x):
        def step(data, states):
            out = self.dense(data) + states[0]
            return out, [out]
        outs, _ = F.contrib.foreach(step, x, [F.zeros((2, 4))])
        return outs


class Cond(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        y = self.dense(x)
        return F.contrib.cond(F.sum(y) > 0, lambda: y * 2, lambda: y - 1)


class WhileLoop(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x):
        y = self.dense(x)
        _, (out, _) = F.contrib.while_loop(lambda v, i: i < 3, lambda v, i: ([], [v * 0.5, i + 1]),
                                           [y, F.zeros((1,))], max_iterations=5)
        return out


@pytest.mark.parametrize("block, shape", [(Foreach, (3, 2, 4)), (Cond, (2, 4)),
                                          (WhileLoop, (2, 4))],
                         ids=["foreach", "cond", "while_loop"])
def test_control_flow(block, shape, dtype):
    check(block(), dtype, mx.nd.random.uniform(shape=shape))


class Twice(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        assert in_data[0].dtype == np.float32  # kept in float32 by the lists
        self.assign(out_data[0], req[0], in_data[0] * 2)


@mx.operator.register("mxamp_test_twice")
class TwiceProp(mx.operator.CustomOpProp):
    def list_arguments(self):
        return ["data"]

    def infer_shape(self, in_shape):
        return in_shape, in_shape, []

    def create_operator(self, ctx, shapes, dtypes):
        return Twice()


class WithCustom(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Dense(4), nn.Dense(3)

    def hybrid_forward(self, F, x):
        return self.second(F.Custom(self.first(x), op_type="mxamp_test_twice"))


def test_custom_operator_runs_in_float32(dtype):
    check(WithCustom(), dtype, mx.nd.random.uniform(shape=(2, 5)))


class SharedMultiIO(nn.HybridBlock):
    """One Dense used three times; two inputs; two outputs."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, in_units=4)

    def hybrid_forward(self, F, x, y):
        return self.dense(self.dense(x)), F.relu(self.dense(y))


def test_shared_parameters_and_several_inputs_and_outputs(dtype):
    check(SharedMultiIO(), dtype, mx.nd.random.uniform(shape=(2, 4)),
          mx.nd.random.uniform(shape=(2, 4)))


class Embed(nn.HybridBlock):
    def __init__(self):
        super().__init__()
        self.embed, self.dense = nn.Embedding(10, 8), nn.Dense(4)

    def hybrid_forward(self, F, idx):
        return self.dense(self.embed(idx))


def test_embedding_indices(dtype):
    check(Embed(), dtype, mx.nd.array([[1, 2], [3, 9]]))
