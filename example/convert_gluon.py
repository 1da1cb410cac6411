"""Convert a live Gluon network to bfloat16 (or float16) and check it.

    python example/convert_gluon.py [--model resnet18_v1] [--dtype bfloat16] [--size 224]

The network comes from the GluonCV zoo with random weights (nothing is
downloaded). It is converted for any device (the full low-precision graph),
compared with float32 natively where this CPU has every kernel, else with
the low-precision operators emulated in float32, and timed against float32
when it runs natively.
"""
import argparse

import mxnet as mx
from gluoncv import model_zoo

import mxamp
import mxamp.verify
from mxamp.gluon import model_of

from timing import print_speed


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18_v1")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    args = parser.parse_args()

    net = model_zoo.get_model(args.model, pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, args.size, args.size))
    net(x)  # records the graph

    amp_net = mxamp.convert_hybrid_block(net, target_dtype=args.dtype, target_device="any")
    sym, arg_params, aux_params, _ = model_of(amp_net, "checking it")
    print(f"{args.model} -> {args.dtype}: casts {mxamp.summarize(sym)}")

    result = mxamp.verify.compare(model_of(net, "checking it")[:3],
                                  (sym, arg_params, aux_params), {"data": x})
    how = ("natively" if result["verified"] == "native" else
           "emulated (no kernel on this CPU for " + ", ".join(result["emulated_ops"]) + ")")
    print(f"relative error vs float32: {result['errors'][0]:.2e}, run {how}")
    print_speed(args.dtype, result["verified"] == "native", lambda: net(x).wait_to_read(),
                lambda: amp_net(x).wait_to_read())


if __name__ == "__main__":
    main()
