"""INT8 post-training quantization with calibration (mxamp.quantization, a
drop-in for mxnet.contrib.quantization) of a CNN trained on scikit-learn's
digits: accuracy before and after, error against float32 and speed.

    python example/quantize_int8.py [--epochs 3] [--calib-mode naive|entropy] [--calib 128]

The quantized model runs on mxamp's oneDNN 3 backend, on any x86 CPU (with
VNNI the INT8 dot products are native instructions, without it oneDNN
computes them with AVX2 / AVX-512; the example says which this CPU has).
"""
import argparse
import os
import tempfile

import mxnet as mx
import numpy as np

import mxamp
import mxamp.cpu
import mxamp.quantization
import mxamp.verify

import digits
from timing import best_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--calib-mode", default="entropy", choices=["naive", "entropy"])
    parser.add_argument("--calib", type=int, default=128, help="calibration examples")
    args = parser.parse_args()
    train_x, _, test_x, test_y = digits.data()

    net = digits.cnn()
    digits.train(net, args.epochs)
    calib = mx.io.NDArrayIter(train_x[:args.calib], batch_size=32)
    qnet = mxamp.quantization.quantize_net_v2(net, calib_data=calib, calib_mode=args.calib_mode,
                                              num_calib_examples=args.calib)
    x = mx.nd.array(test_x)
    print(f"quantized with {args.calib_mode} calibration on {args.calib} training images")
    print(f"test accuracy ({len(test_y)} images): float32 "
          f"{digits.accuracy(net, test_x, test_y):.4f}, INT8 "
          f"{digits.accuracy(qnet, test_x, test_y):.4f}")
    print(f"relative error of the scores vs float32: "
          f"{mxamp.verify.relative_error(qnet(x), net(x)):.2e}")
    with tempfile.TemporaryDirectory() as tmp:  # one call loads it back, backend included
        qnet.export(os.path.join(tmp, "digits-int8"))
        loaded = mxamp.load(os.path.join(tmp, "digits-int8"))
        same = np.array_equal(loaded(x).asnumpy(), qnet(x).asnumpy())
    print(f"saved, and loaded by mxamp.load as {loaded.mxamp_format}: "
          f"{'the same' if same else 'different'} scores")
    fp32, int8 = (best_ms(lambda b=b: b(x).wait_to_read()) for b in (net, qnet))
    vnni = mxamp.cpu.features("onednn").vnni
    print(f"speed on the test set: float32 {fp32:.1f} ms, INT8 {int8:.1f} ms "
          f"({fp32 / int8:.2f}x; {'with' if vnni else 'without'} VNNI: "
          f"{mxamp.cpu.features('onednn')})")


if __name__ == "__main__":
    main()
