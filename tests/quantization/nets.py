"""Random parameters for the quantization tests' small symbols."""
import mxnet as mx
import numpy as np


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
