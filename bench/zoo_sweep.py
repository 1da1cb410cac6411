"""Convert GluonCV zoo networks with mxamp and report per-output error vs float32.

    python bench/zoo_sweep.py [MODEL ...] [--family NAME] [--dtype bfloat16 float16]
                              [--json out.json]

Without MODEL, sweeps every zoo network of one family (default classification;
also detection, segmentation, pose, action). Weights are
random (pretrained=False, pretrained_base=False), so errors are relative L2
errors of the raw outputs, not accuracy. Detector outputs pass through NMS,
whose selection is discrete, so for them the sweep also reports the error of
each tensor fed into NMS ("pre_nms"; for two-stage detectors the first is the
RPN's, later ones already depend on which proposals were kept). float16 runs
convert for the CPU (ops without float16 CPU kernels stay float32). One failure
never stops the sweep; the exit status says whether any network failed.
"""
import argparse
import json
import re
import sys
import time
import traceback
import warnings

import mxnet as mx
import numpy as np
from gluoncv import model_zoo

import mxamp
from mxamp.verify import pre_selection_errors, relative_error


def build(name):
    try:
        net = model_zoo.get_model(name, pretrained=False, pretrained_base=False)
    except TypeError:  # classification builders take no pretrained_base
        net = model_zoo.get_model(name, pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


FAMILIES = {
    "detection": r"^(ssd|yolo3|faster_rcnn|mask_rcnn|center_net)_",
    "segmentation": r"^(fcn|psp|deeplab|icnet|danet|fastscnn)_",
    "pose": r"^(simple_pose|mobile_pose|alpha_pose)_",
    "action": r"_(kinetics400|ucf101|hmdb51|sthsthv2|kinetics700)$",
}
VIDEO_3D = re.compile(r"^(i3d|r2plus1d|c3d|p3d|slowfast)")


def family_of(name):
    return next((f for f, pattern in FAMILIES.items() if re.search(pattern, name)),
                "classification")


def input_for(name):
    family = family_of(name)
    if family == "action" and VIDEO_3D.match(name):
        shape = (1, 3, 32 if "slowfast" in name else 8, 112, 112)
    elif family == "pose":
        shape = (1, 3, 256, 192)
    elif family == "detection":
        size = 512 if "512" in name else 300 if "_300_" in name else 320
        shape = (1, 3, size, size)
    elif family == "segmentation":  # PSP, DeepLab, DANet etc. are built for 480 crops
        shape = (1, 3, 480, 480)
    else:
        size = 299 if "inception" in name or "xception" in name else 32 if "cifar" in name \
            else 224
        shape = (1, 3, size, size)
    return mx.nd.random.uniform(shape=shape)


def flat(outputs):
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def sweep_one(name, dtypes):
    net = build(name)
    x = input_for(name)
    refs = flat(net(x))
    result = {"model": name}
    for dtype in dtypes:
        start = time.perf_counter()
        converted = mxamp.convert_hybrid_block(net, target_dtype=dtype)
        seconds = time.perf_counter() - start
        outs = flat(converted(x))
        result[dtype] = {"errors": [relative_error(o, r) for o, r in zip(outs, refs)],
                         "pre_nms": pre_selection_errors(net, converted, x),
                         "finite": all(np.isfinite(o.astype("float32").asnumpy()).all()
                                       for o in outs),
                         "casts": mxamp.summarize(converted._cached_graph[1]),
                         "convert_seconds": round(seconds, 3)}
    return result


def describe(dtype, result):
    text = f"{dtype}: max err {max(result['errors']):.2e}"
    if result["pre_nms"]:
        text += " (pre-NMS " + ", ".join(f"{e:.2e}" for e in result["pre_nms"].values()) + ")"
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*")
    parser.add_argument("--family", default="classification",
                        choices=["classification", *FAMILIES])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float16"],
                        choices=["bfloat16", "float16"])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    models = args.models or sorted(
        n for n in model_zoo.pretrained_model_list() if family_of(n) == args.family
        and (args.family != "classification" or n.split("_")[0] in CLASSIFICATION_PREFIXES))
    results, failed = [], 0
    for name in models:
        try:
            result = sweep_one(name, args.dtype)
            line = "  ".join(describe(d, result[d]) for d in args.dtype)
        except Exception as err:  # noqa: BLE001 - one failing network never stops the sweep
            failed += 1
            result = {"model": name, "error": f"{type(err).__name__}: {err}".splitlines()[0],
                      "traceback": traceback.format_exc()}
            line = "FAILED " + result["error"][:200]
        results.append(result)
        print(f"{name}: {line}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"{len(models) - failed} converted, {failed} failed")
    sys.exit(1 if failed else 0)


CLASSIFICATION_PREFIXES = (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50", "resnext101",
    "se", "resnest50", "resnest101", "mobilenet1.0", "mobilenet0.75", "mobilenet0.5",
    "mobilenet0.25", "mobilenetv2", "mobilenetv3", "squeezenet1.0", "squeezenet1.1",
    "densenet121", "densenet161", "densenet169", "densenet201", "inceptionv3", "xception",
    "vgg11", "vgg13", "vgg16", "vgg19", "alexnet", "darknet53", "nasnet", "residualattentionnet56",
    "cifar")

if __name__ == "__main__":
    main()
