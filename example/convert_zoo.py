"""Convert a GluonCV zoo network to mixed precision, two ways, and show what changed.

    python example/convert_zoo.py resnet50_v1 --dtype bfloat16

1. convert_hybrid_block on the live Gluon network;
2. convert_model on the network exported as -symbol.json / .params.
Weights are randomly initialised (no download), so compare outputs, not accuracy.
"""
import argparse
import logging
import tempfile

import mxnet as mx
import numpy as np
from gluoncv import model_zoo

import mxamp


def rel_err(out, ref):
    out, ref = out.astype("float32").asnumpy(), ref.asnumpy()
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="resnet18_v1")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    net = model_zoo.get_model(args.model, pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, args.size, args.size))
    ref = net(x)

    block = mxamp.convert_hybrid_block(net, target_dtype=args.dtype, cast_optional_params=True)
    err = rel_err(block(x), ref)
    print(f"convert_hybrid_block: casts {mxamp.summarize(block._cached_graph[1])}, "
          f"relative error vs float32 {err:.2e}")

    with tempfile.TemporaryDirectory() as tmp:
        net.export(f"{tmp}/net")
        sym, arg_params, aux_params = mx.model.load_checkpoint(f"{tmp}/net", 0)
    sym, arg_params, aux_params = mxamp.convert_model(sym, arg_params, aux_params,
                                                      target_dtype=args.dtype,
                                                      cast_optional_params=True)
    exe = sym.bind(mx.cpu(), {**arg_params, "data": x}, aux_states=aux_params, grad_req="null")
    out = exe.forward()[0]
    low = sum(v.dtype != np.float32 for v in arg_params.values())
    print(f"convert_model: {low}/{len(arg_params)} params stored in {args.dtype}, "
          f"relative error vs float32 {rel_err(out, ref):.2e}")


if __name__ == "__main__":
    main()
