"""Convert an exported checkpoint (PREFIX-symbol.json + PREFIX-0000.params)
with mxamp.convert_model, save it, reload it and check it against float32.

    python example/convert_checkpoint.py [PREFIX] [--dtype bfloat16] [--shape 1,3,224,224]

Without PREFIX a GluonCV resnet18_v1 with random weights is exported into a
temporary directory first. `--ctx cpu` converts for this CPU: operators with
no low-precision kernel here stay float32 (on a CPU without bfloat16
kernels that is every one of them, and the example says so).
"""
import argparse
import os
import tempfile

import mxnet as mx
import numpy as np

import mxamp
import mxamp.cpu
import mxamp.verify


def export_example(directory, shape):
    from gluoncv import model_zoo
    net = model_zoo.get_model("resnet18_v1", pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros(shape))
    prefix = os.path.join(directory, "resnet18_v1")
    net.export(prefix)
    return prefix


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", nargs="?")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--shape", default="1,3,224,224", help="the data input's shape")
    parser.add_argument("--ctx", default="any", choices=["any", "cpu"])
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))

    with tempfile.TemporaryDirectory() as tmp:
        prefix = args.prefix or export_example(tmp, shape)
        sym, arg_params, aux_params = mx.model.load_checkpoint(prefix, 0)
        converted = mxamp.convert_model(sym, arg_params, aux_params, target_dtype=args.dtype,
                                        cast_optional_params=True,
                                        ctx=mx.cpu() if args.ctx == "cpu" else None)
        casts = mxamp.summarize(converted[0])
        low = sum(a.dtype != np.float32 for a in converted[1].values())
        print(f"{prefix} -> {args.dtype} (for {args.ctx} device): casts {casts}, "
              f"{low} of {len(converted[1])} parameters stored in {args.dtype}")
        if not any(k.endswith(args.dtype) for k in casts):
            print(f"nothing runs in {args.dtype}: this CPU has no {args.dtype} kernels in "
                  "MXNet (mxamp.cpu.mxnet_has_bfloat16() is "
                  f"{mxamp.cpu.mxnet_has_bfloat16()}); use --ctx any for another device")

        # The converted symbol keeps its amp_cast nodes only with remove_amp_cast=False.
        out = os.path.join(tmp, f"converted-{args.dtype}")
        converted[0].save(f"{out}-symbol.json", remove_amp_cast=False)
        mx.nd.save(f"{out}-0000.params", {**{f"arg:{k}": v for k, v in converted[1].items()},
                                          **{f"aux:{k}": v for k, v in converted[2].items()}})
        reloaded = mx.model.load_checkpoint(out, 0)
        sizes = [os.path.getsize(f"{p}-0000.params") for p in (prefix, out)]
        print(f"params file: {sizes[0] / 2**20:.1f} MiB float32 -> {sizes[1] / 2**20:.1f} MiB")

    feeds = mxamp.verify.feeds_for(reloaded[0], {"data": shape})
    result = mxamp.verify.compare((sym, arg_params, aux_params), reloaded, feeds)
    how = ("natively" if result["verified"] == "native" else
           "emulated (no kernel on this CPU for " + ", ".join(result["emulated_ops"]) + ")")
    print(f"reloaded model: relative error vs float32 {result['errors'][0]:.2e}, run {how}")


if __name__ == "__main__":
    main()
