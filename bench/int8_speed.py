"""INT8 inference speed on ResNet-50 v1: MXNet float32, MXNet's own INT8 and
mxamp's oneDNN 3 backend computing in INT8.

    python bench/int8_speed.py [--runs N] [--warmup N] [--batch N] [--calib-batches N]

Variants, timed on the same input, interleaved round by round (the order
rotates each round, so drift on a shared machine hits all of them):

  a fp32          the exported float32 model as a hybridized SymbolBlock
  b fp32 fused    the same after sym.optimize_for('MKLDNN') (MXNet's fusion)
  c mxnet int8    mx.contrib.quantization.quantize_net_v2(calib_mode='naive',
                  quantized_dtype='auto')
  d mxamp int8    the float32 model annotated with naive thresholds (max |x|
                  and min x of every operator output over the calibration
                  batches), through the backend with compute='int8'
  e mxamp fp32    the float32 model through the backend computing in float32

c and d calibrate on the same batches. Weights are random
(gluoncv's resnet50_v1, pretrained=False); inputs are uniform images
normalized with ImageNet's mean and deviation (so the first layer's input is
signed). Throughput is the batch over the median round time; "rel err" is the
relative L2 error of the output against a on the timed batch.
"""
import os

# Before MXNet starts its OpenMP pool: the machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet.contrib import quantization  # noqa: E402

import mxamp.backends  # noqa: E402
from mxamp.verify import relative_error  # noqa: E402

AMAX, MIN = "__mxamp_amax__", "__mxamp_min__"


def images(batch, seed):
    rs = np.random.RandomState(seed)
    mean = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
    return mx.nd.array((rs.uniform(size=(batch, 3, 224, 224)) - mean) / std)


def exported(directory, batch):
    """The float32 ResNet-50 v1 as (symbol, args, aux)."""
    from gluoncv import model_zoo
    net = model_zoo.get_model("resnet50_v1", pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(images(batch, 0))
    net.export(os.path.join(directory, "model"))
    sym, args, aux = mx.model.load_checkpoint(os.path.join(directory, "model"), 0)
    return sym, args, aux


def block(sym, args, aux):
    """A hybridized SymbolBlock of sym with its parameters."""
    net = mx.gluon.SymbolBlock(sym, [mx.sym.var("data")])
    net.collect_params().load_dict({**{f"arg:{k}": v for k, v in args.items()},
                                    **{f"aux:{k}": v for k, v in aux.items()}},
                                   ignore_extra=True)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def naive_ranges(sym, args, aux, batches, chunk=4):
    """(max |x|, min x) of the data and of output 0 of every operator over the
    batches, from the float32 model run unfused (in chunks, to bound memory)."""
    internals = sym.get_internals()
    names = [internals[i].name for i in range(len(internals.list_outputs()))]
    wanted = {n["name"] for n in json.loads(sym.tojson())["nodes"] if n["op"] != "null"}
    first = {}
    for i, name in enumerate(names):
        if (name in wanted or name == "data") and name not in first:
            first[name] = i
    group = mx.sym.Group([internals[i] for i in first.values()])
    os.environ["MXNET_SUBGRAPH_BACKEND"] = "NONE"  # fused nodes' inputs are no outputs
    try:
        ex = group.simple_bind(mx.cpu(), data=(chunk, 3, 224, 224), grad_req="null")
    finally:
        del os.environ["MXNET_SUBGRAPH_BACKEND"]
    ex.copy_params_from({k: v.copy() for k, v in args.items()}, aux)
    ranges = {}
    for batch in batches:
        for start in range(0, batch.shape[0], chunk):
            outs = ex.forward(is_train=False, data=batch[start:start + chunk])
            for name, out in zip(first, outs):
                out = out.asnumpy()
                amax, low = ranges.get(name, (0.0, np.inf))
                ranges[name] = (max(amax, float(np.abs(out).max())), min(low, float(out.min())))
    return ranges


def annotated(sym, ranges):
    graph = json.loads(sym.tojson())
    for node in graph["nodes"]:
        if node["name"] in ranges:
            attrs = node.setdefault("attrs", {})
            attrs[AMAX], attrs[MIN] = map(repr, ranges[node["name"]])
    return mx.sym.load_json(json.dumps(graph))


def mxnet_int8(sym, args, aux, batches):
    net = block(sym, args, aux)
    calib = mx.io.NDArrayIter(mx.nd.concat(*batches, dim=0), batch_size=batches[0].shape[0])
    net = quantization.quantize_net_v2(net, quantized_dtype="auto", calib_mode="naive",
                                       calib_data=calib, ctx=mx.cpu())
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--calib-batches", type=int, default=2)
    opts = parser.parse_args()
    onednn = mxamp.backends.get("onednn")
    with tempfile.TemporaryDirectory() as directory:
        sym, args, aux = exported(directory, opts.batch)
    calib = [images(opts.batch, 1 + i) for i in range(opts.calib_batches)]
    x = images(opts.batch, 100)

    ranges = naive_ranges(sym, args, aux, calib)
    fused = sym.optimize_for("MKLDNN", {**args, "data": x}, aux, ctx=mx.cpu())
    variants = {
        "a fp32": block(sym, args, aux),
        "b fp32 fused": block(fused, args, aux),
        "c mxnet int8": mxnet_int8(sym, args, aux, calib),
        "d mxamp int8": block(*onednn.apply_backend(annotated(sym, ranges), args, aux,
                                                    compute="int8")),
        "e mxamp fp32": block(*onednn.apply_backend(sym, args, aux, compute="float32")),
    }
    outputs, times = {}, {name: [] for name in variants}
    for name, net in variants.items():
        outputs[name] = net(x).asnumpy()  # first call: build, partitioning, packing
    names = list(variants)
    for r in range(opts.warmup + opts.runs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            variants[name](x).asnumpy()
            if r >= opts.warmup:
                times[name].append(time.perf_counter() - start)

    speed = {n: opts.batch / statistics.median(t) for n, t in times.items()}
    print(f"ResNet-50 v1, batch {opts.batch}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
          f"{opts.runs} runs, calibration {opts.calib_batches} x {opts.batch} images")
    print(f"{'variant':<14} {'img/s':>8} {'vs a':>7} {'vs c':>7} {'rel err':>9}")
    for name in names:
        print(f"{name:<14} {speed[name]:8.2f} {speed[name] / speed['a fp32']:7.2f} "
              f"{speed[name] / speed['c mxnet int8']:7.2f} "
              f"{relative_error(outputs[name], outputs['a fp32']):9.2e}")


if __name__ == "__main__":
    main()
