"""mxamp's oneDNN 3 backend: a converted network offloaded to oneDNN
regions, compared with float32 and timed against MXNet's own kernels.

    python example/onednn_backend.py [--model resnet18_v1] [--size 224] [--compute bfloat16]

With --compute bfloat16 (the default where oneDNN has bfloat16 instructions
on this CPU) the network is converted to bfloat16 and its bfloat16 nodes run
in the backend; on a CPU without them the backend runs the float32 network
(--compute float32), and the example says so.
"""
import argparse

import mxnet as mx
from gluoncv import model_zoo

import mxamp
import mxamp.cpu
import mxamp.gluon
import mxamp.verify

from timing import best_ms


def main():
    bf16 = mxamp.cpu.features("onednn").bf16
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18_v1")
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    parser.add_argument("--compute", choices=["bfloat16", "float32"],
                        default="bfloat16" if bf16 else "float32")
    args = parser.parse_args()
    if args.compute == "bfloat16" and not bf16:
        parser.error(f"oneDNN has no bfloat16 instructions on this CPU "
                     f"({mxamp.cpu.features('onednn')}): use --compute float32")
    if not bf16:
        print(f"this CPU has no bfloat16 instructions for oneDNN "
              f"({mxamp.cpu.features('onednn')}): running the float32 network in the backend")

    mxamp.backends.get("onednn")  # builds and loads the backend library
    net = model_zoo.get_model(args.model, pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, args.size, args.size))
    ref = net(x)
    # The full bfloat16 graph: what MXNet itself has no kernel for, oneDNN may.
    block = (mxamp.convert_hybrid_block(net, target_dtype="bfloat16", target_device="any")
             if args.compute == "bfloat16" else net)
    fast = mxamp.gluon.apply_backend_block(block, compute=args.compute)
    regions = mxamp.backends.get("onednn").regions(fast._cached_graph[1])
    print(f"{args.model} on the oneDNN backend ({args.compute}): {len(regions)} region(s) "
          f"holding {sum(map(len, regions))} operators")
    print(f"relative error vs float32: {mxamp.verify.relative_error(fast(x), ref):.2e}")
    backend_ms = best_ms(lambda: fast(x).wait_to_read())
    if args.compute == "bfloat16" and not mxamp.cpu.mxnet_has_bfloat16():
        print(f"speed: oneDNN backend {backend_ms:.1f} ms; MXNet has no bfloat16 kernels on "
              f"this CPU to compare with ({mxamp.cpu.describe()})")
        return
    mxnet_ms = best_ms(lambda: block(x).wait_to_read())
    print(f"speed: MXNet {args.compute} {mxnet_ms:.1f} ms, oneDNN backend {backend_ms:.1f} ms "
          f"({mxnet_ms / backend_ms:.2f}x) on {mxamp.cpu.describe()}")


if __name__ == "__main__":
    main()
