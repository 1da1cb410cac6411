"""AMP training with dynamic loss scaling (mxamp.init, init_trainer,
scale_loss) on scikit-learn's digits, against the same training in float32.

    python example/train_amp.py [--dtype bfloat16|float16] [--epochs 3]

The default dtype is bfloat16 where MXNet has bfloat16 kernels on this CPU,
else float16. Operators with no kernel in that dtype on this CPU (MXNet
1.9.1 has no float16 Convolution / FullyConnected on CPUs, and bfloat16 ones
only with AVX-512) run in float32, and the example says which did.
"""
import argparse

import mxnet as mx

import mxamp
import mxamp.cpu
from mxamp import dtypes

import digits


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["bfloat16", "float16"],
                        default="bfloat16" if mxamp.cpu.mxnet_has_bfloat16() else "float16")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    _, _, test_x, test_y = digits.data()

    net = digits.cnn()  # float32 first: mxamp.init changes every later forward pass
    _, seconds = digits.train(net, args.epochs)
    print(f"float32: test accuracy {digits.accuracy(net, test_x, test_y):.4f}, "
          f"{seconds / args.epochs:.2f} s per epoch")
    del net  # mxamp.init refuses to start while a block with a built graph is alive

    mxamp.init(args.dtype)
    amp_net = digits.cnn()
    trainer, seconds = digits.train(amp_net, args.epochs, amp=True)
    scaler = mxamp.get_loss_scaler(trainer)
    print(f"{args.dtype} AMP: test accuracy {digits.accuracy(amp_net, test_x, test_y):.4f}, "
          f"{seconds / args.epochs:.2f} s per epoch, loss scale now {scaler.loss_scale:g}")
    x = mx.nd.array(test_x[:2])
    for layer, out in (("Convolution", mx.nd.Convolution(x, mx.nd.ones((4, 1, 3, 3)),
                                                          kernel=(3, 3), num_filter=4,
                                                          no_bias=True)),
                       ("FullyConnected", mx.nd.FullyConnected(x, mx.nd.ones((4, 256)),
                                                               num_hidden=4, no_bias=True))):
        print(f"{layer} runs in {dtypes.dtype_name(dtypes.to_code(out.dtype))} under "
              f"mxamp.init({args.dtype!r}) on this CPU")

if __name__ == "__main__":
    main()
