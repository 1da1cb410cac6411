"""Random graphs for property tests: DAGs of 1-60 nodes over (2, 8) float
tensors built from shape-preserving ops of every list category (see
tests/convert/test_fuzz.py), as a hypothesis strategy."""
import mxnet as mx
from hypothesis import strategies as st

from graphs import nodes_of

SHAPE = (2, 8)
# One variable node each: parameters shared by every layer that uses them, and
# integer indices (values 0 and 1) for the index ops.
SHARED_W, SHARED_B = mx.sym.var("shared_w"), mx.sym.var("shared_b")
IDX = mx.sym.var("idx", dtype="int32")
IMAGE = (2, 8, 1, 1)  # the (2, 8) tensors as NCHW images for conv and pooling


def as_image(op):
    return lambda x, n: mx.sym.reshape(op(mx.sym.reshape(x, IMAGE)), SHAPE, name=n)


def foreach_cell(x, n):
    """An RNN cell over x's two rows: the shared dense as closures, the
    first row as the state."""
    def step(data, states):
        fc = mx.sym.FullyConnected(data, weight=SHARED_W, bias=SHARED_B, num_hidden=8,
                                   flatten=False)
        out = mx.sym.tanh(fc + states[0])
        return out, [out]
    outs, _ = mx.sym.contrib.foreach(step, mx.sym.reshape(x, (2, 1, 8)),
                                     [mx.sym.slice_axis(x, axis=0, begin=0, end=1)])
    return mx.sym.reshape(outs, SHAPE, name=n)


def loop_in_loop(x, n):
    """A foreach over x's rows whose body runs a foreach over the row."""
    def outer(row, states):
        def inner(col, s):
            out = mx.sym.FullyConnected(col, weight=SHARED_W, bias=SHARED_B, num_hidden=8,
                                        flatten=False) + s[0]
            return out, [out]
        outs, last = mx.sym.contrib.foreach(inner, row, [states[0]])
        return outs, [last[0]]
    outs, _ = mx.sym.contrib.foreach(outer, mx.sym.reshape(x, (2, 1, 1, 8)),
                                     [mx.sym.slice_axis(x, axis=0, begin=0, end=1)])
    return mx.sym.reshape(outs, SHAPE, name=n)


UNARY = {
    "relu": lambda x, n: mx.sym.relu(x, name=n),
    "sigmoid": lambda x, n: mx.sym.sigmoid(x, name=n),
    "tanh": lambda x, n: mx.sym.tanh(x, name=n),
    "softrelu": lambda x, n: mx.sym.Activation(x, act_type="softrelu", name=n),
    "act_relu": lambda x, n: mx.sym.Activation(x, act_type="relu", name=n),
    "leaky": lambda x, n: mx.sym.LeakyReLU(x, act_type="leaky", name=n),
    "square": lambda x, n: mx.sym.square(x, name=n),
    "abs": lambda x, n: mx.sym.abs(x, name=n),
    "exp_tanh": lambda x, n: mx.sym.exp(mx.sym.tanh(x), name=n),
    "softmax": lambda x, n: mx.sym.softmax(x, axis=-1, name=n),
    "log_softmax": lambda x, n: mx.sym.log_softmax(x, axis=-1, name=n),
    "dense": lambda x, n: mx.sym.FullyConnected(x, num_hidden=8, flatten=False, name=n),
    "shared_dense": lambda x, n: mx.sym.FullyConnected(
        x, weight=SHARED_W, bias=SHARED_B, num_hidden=8, flatten=False, name=n),
    "reshape": lambda x, n: mx.sym.reshape(mx.sym.reshape(x, (-1,)), SHAPE, name=n),
    "transpose": lambda x, n: mx.sym.transpose(mx.sym.transpose(x), name=n),
    "clip": lambda x, n: mx.sym.clip(x, -2, 2, name=n),
    "mean_bc": lambda x, n: mx.sym.broadcast_sub(x, mx.sym.mean(x, axis=-1, keepdims=True),
                                                 name=n),
    "norm_bc": lambda x, n: mx.sym.broadcast_div(
        x, mx.sym.norm(x, axis=-1, keepdims=True) + 1, name=n),
    "slice_concat": lambda x, n: mx.sym.concat(mx.sym.slice_axis(x, axis=1, begin=0, end=4),
                                               mx.sym.slice_axis(x, axis=1, begin=4, end=8),
                                               dim=1, name=n),
    "split_add": lambda x, n: mx.sym.elemwise_add(
        *mx.sym.split(mx.sym.concat(x, x, dim=1), num_outputs=2, axis=1), name=n),
    "layernorm": lambda x, n: mx.sym.LayerNorm(x, name=n),
    "log1p_abs": lambda x, n: mx.sym.log1p(mx.sym.abs(x), name=n),
    "sqrt_abs": lambda x, n: mx.sym.sqrt(mx.sym.abs(x), name=n),
    "sin": lambda x, n: mx.sym.sin(x, name=n),
    "negative": lambda x, n: mx.sym.negative(x, name=n),
    "flip": lambda x, n: mx.sym.flip(x, axis=1, name=n),
    "expand_squeeze": lambda x, n: mx.sym.squeeze(mx.sym.expand_dims(x, axis=0), axis=0, name=n),
    "max_bc": lambda x, n: mx.sym.broadcast_sub(x, mx.sym.max(x, axis=-1, keepdims=True),
                                                name=n),
    "sum_bc": lambda x, n: mx.sym.broadcast_mul(x, mx.sym.sum(x, axis=-1, keepdims=True),
                                                name=n),
    "take_rows": lambda x, n: mx.sym.take(x, IDX, name=n),
    "embedding": lambda x, n: mx.sym.elemwise_add(
        x, mx.sym.Embedding(IDX, input_dim=2, output_dim=8), name=n),
    "cos": lambda x, n: mx.sym.cos(x, name=n),
    "batchnorm": lambda x, n: mx.sym.BatchNorm(x, fix_gamma=False, name=n),
    "conv1x1": as_image(lambda x: mx.sym.Convolution(x, kernel=(1, 1), num_filter=8)),
    "pool": as_image(lambda x: mx.sym.Pooling(x, kernel=(1, 1), pool_type="avg")),
    "foreach_cell": foreach_cell,
    "loop_in_loop": loop_in_loop,
}
BINARY = {
    "add": lambda a, b, n: mx.sym.elemwise_add(a, b, name=n),
    "sub": lambda a, b, n: mx.sym.elemwise_sub(a, b, name=n),
    "mul": lambda a, b, n: mx.sym.elemwise_mul(a, b, name=n),
    "badd": lambda a, b, n: mx.sym.broadcast_add(a, b, name=n),
    "bmul": lambda a, b, n: mx.sym.broadcast_mul(a, b, name=n),
    "max": lambda a, b, n: mx.sym.broadcast_maximum(a, b, name=n),
    "add_n": lambda a, b, n: mx.sym.add_n(a, b, a, name=n),
    "stack_sum": lambda a, b, n: mx.sym.sum(mx.sym.stack(a, b, axis=0), axis=0, name=n),
    "where": lambda a, b, n: mx.sym.where(a > b, a, b, name=n),
    "div": lambda a, b, n: mx.sym.elemwise_div(a, mx.sym.abs(b) + 1, name=n),
    "bsub": lambda a, b, n: mx.sym.broadcast_sub(a, b, name=n),
    "min": lambda a, b, n: mx.sym.broadcast_minimum(a, b, name=n),
}


@st.composite
def graphs(draw):
    entries = [mx.sym.var("x0"), mx.sym.var("x1")]
    names = []
    for i in range(draw(st.integers(1, 60))):
        name = f"n{i}"
        if draw(st.booleans()):
            op = draw(st.sampled_from(sorted(UNARY)))
            entries.append(UNARY[op](draw(st.sampled_from(entries)), name))
        else:
            op = draw(st.sampled_from(sorted(BINARY)))
            a, b = draw(st.sampled_from(entries)), draw(st.sampled_from(entries))
            entries.append(BINARY[op](a, b, name))
        names.append(name)
    extra = draw(st.lists(st.sampled_from(entries[2:]), max_size=2))
    sym = mx.sym.Group([entries[-1]] + extra) if extra else entries[-1]
    in_graph = sorted(set(names) & {n["name"] for n in nodes_of(sym)["nodes"]})
    excluded = draw(st.lists(st.sampled_from(in_graph), max_size=3, unique=True))
    return sym, sorted(excluded)
