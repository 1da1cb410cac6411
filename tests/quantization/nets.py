"""The quantization tests' small symbols and their random parameters."""
import mxnet as mx
import numpy as np

from mxamp.verify import no_graph_fusion


def random_params(sym, shape, seed=0):
    """Random parameters for `sym` with data of `shape`: weights ~N(0, 0.3),
    BatchNorm variances in [0.5, 1.5], other auxiliary states ~N(0, 0.1)."""
    rng = np.random.RandomState(seed)
    args, _, aux = sym.infer_shape(data=shape)
    arg_params = {n: mx.nd.array(rng.normal(0, 0.3, s))
                  for n, s in zip(sym.list_arguments(), args) if n != "data"}
    aux_params = {n: mx.nd.array(rng.uniform(0.5, 1.5, s) if "var" in n else
                                 rng.normal(0, 0.1, s))
                  for n, s in zip(sym.list_auxiliary_states(), aux)}
    return arg_params, aux_params


def small_net():
    """conv-bn-relu, a residual conv-bn add, max pooling, dense."""
    with mx.name.NameManager():  # the add is _plus0 whatever ran before
        data = mx.sym.var("data")
        x = mx.sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=8, name="c1")
        x = mx.sym.relu(mx.sym.BatchNorm(x, name="bn1"), name="r1")
        y = mx.sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=8, name="c2")
        x = mx.sym.relu(mx.sym.BatchNorm(y, name="bn2") + x, name="r2")
        x = mx.sym.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max", name="pool")
        return mx.sym.FullyConnected(x, num_hidden=10, name="fc")


def tensors_over(sym, arg_params, aux_params, names, batch_list):
    """{name: the tensor's values over all batches, batch after batch}, each
    batch run by one plain executor whose outputs are all the tensors (what
    calibration did before it streamed)."""
    group = mx.sym.Group([sym.get_internals()[n] for n in names])
    found = {n: [] for n in names}
    for batch in batch_list:
        args = {**arg_params, "data": batch}
        with no_graph_fusion():
            exe = group.bind(mx.cpu(), {n: args[n] for n in group.list_arguments()},
                             aux_states=aux_params, grad_req="null")
        for name, out in zip(names, exe.forward(is_train=False)):
            found[name].append(out.asnumpy())
    return {n: np.concatenate(arrays) for n, arrays in found.items()}
