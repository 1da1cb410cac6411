"""Convert a Gluon recurrent model written with foreach to bfloat16 (or float16).

    python example/foreach_rnn.py [--dtype bfloat16] [--hidden 256] [--steps 16] [--batch 8]

The model runs an Elman cell, h = tanh(i2h(x_t) + h2h(h)), over the steps
of its input with F.contrib.foreach. mxamp converts the loop's body by the
same lists as the rest of the graph: both Dense layers run in low
precision inside the loop, the state h stays float32 from one step to the
next, and the weights and the input sequence are cast once, before the loop.
The example prints the casts outside and inside the loop, the error against
float32 (natively where MXNet has bfloat16 kernels on this CPU, else with
the low-precision operators emulated) and the speed against float32.
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet.gluon import nn

import mxamp
import mxamp.cpu
from mxamp.gluon import model_of
from mxamp.graph import body_summaries
from mxamp.verify import run_emulated

from timing import print_speed


class ForeachRNN(nn.HybridBlock):
    """An Elman RNN over axis 0 of x (steps, batch, features) from state h0."""

    def __init__(self, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.i2h = nn.Dense(hidden, flatten=False)
            self.h2h = nn.Dense(hidden, flatten=False)

    def hybrid_forward(self, F, x, h0):
        def step(data, states):
            h = F.tanh(self.i2h(data) + self.h2h(states[0]))
            return h, [h]
        outs, _ = F.contrib.foreach(step, x, [h0])
        return outs


def build(hidden, steps, batch, seed=0):
    """The initialized, hybridized model and its inputs (x, h0)."""
    mx.random.seed(seed)
    net = ForeachRNN(hidden)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.uniform(-1, 1, (steps, batch, hidden))
    h0 = mx.nd.random.uniform(-1, 1, (batch, hidden))
    return net, (x, h0)


def relative_error(out, ref):
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    net, inputs = build(args.hidden, args.steps, args.batch)
    ref = net(*inputs).asnumpy()
    # For this CPU where MXNet runs the dtype here (operators whose kernel
    # measures slower stay float32), else the full graph, for any device.
    native = args.dtype == "bfloat16" and mxamp.cpu.mxnet_has_bfloat16()
    amp_net = mxamp.convert_hybrid_block(net, target_dtype=args.dtype,
                                         target_device=mx.cpu() if native else "any")
    sym, arg_params, aux_params, names = model_of(amp_net, "printing its casts")
    print(f"foreach RNN (hidden {args.hidden}, {args.steps} steps) -> {args.dtype}")
    print(f"casts before the loop: {mxamp.summarize(sym)}")
    for body, counts in body_summaries(sym).items():
        print(f"casts inside {body}: {counts}")

    if native:
        out = amp_net(*inputs).asnumpy()
    else:
        out = mx.nd.amp_cast(run_emulated(sym, arg_params, aux_params, dict(zip(names, inputs)))[0],
                             dtype="float32").asnumpy()
    how = "natively" if native else "emulated (MXNet has no such kernels on this CPU)"
    print(f"relative error vs float32: {relative_error(out, ref):.2e}, run {how}")
    print_speed(args.dtype, native, lambda: net(*inputs).wait_to_read(),
                lambda: amp_net(*inputs).wait_to_read())


if __name__ == "__main__":
    main()
