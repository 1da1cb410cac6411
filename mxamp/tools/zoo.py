"""Convert GluonCV model-zoo networks one at a time, for a batch run on this
machine, in worker processes or on a Dask cluster.

:func:`run_model` builds one network (weights from the local GluonCV cache
when there, else random; nothing is ever downloaded), runs it in float32,
converts it, compares the converted outputs with float32 on a random input,
saves the converted checkpoint, reloads it and runs it again. It returns
plain dicts (the saved files as bytes), so it can run anywhere and the
caller writes the files.

Errors are relative L2 errors of the raw outputs. Detector outputs pass
through NMS, a discrete selection, so for detectors ``max_error`` is the
largest error of the tensors fed into NMS (``pre_nms``) that are not computed
after another NMS (a two-stage detector's second stage depends on which RPN
proposals were kept; its error is in ``pre_nms`` but not in ``max_error``).
"""
import concurrent.futures
import contextlib
import dataclasses
import difflib
import io
import logging
import logging.handlers
import multiprocessing
import os
import re
import sys
import tempfile
import time
import warnings

import mxnet as mx
import numpy as np
try:
    from gluoncv import model_zoo
    from gluoncv.model_zoo import model_store
    from gluoncv.utils import check_sha1
except ImportError as err:  # an optional part; the CLI prints this one line
    raise RuntimeError(f"the zoo networks need GluonCV ({err}): install mxamp[zoo]") from None
from mxnet.base import MXNetError

from ..convert.api import convert_model_with
from ..convert.options import ConversionOptions
from ..dtypes import to_ndarray
from ..errors import OutOfMemory, memory_for, mxnet_logs_to_logging, mxnet_message
from ..gluon import model_of
from ..graph import Inserter, graph_json, summarize, to_symbol
from .. import address_space, verify
from ..verify import no_graph_fusion, relative_error
from . import checkpoint, inspection, signals

FAMILIES = {
    "detection": r"^(ssd|yolo3|faster_rcnn|mask_rcnn|center_net)_",
    "segmentation": r"^(fcn|psp|deeplab|icnet|danet|fastscnn)_",
    "pose": r"^(simple_pose|mobile_pose|alpha_pose)_",
    "action": r"_(kinetics400|ucf101|hmdb51|sthsthv2|kinetics700)$",
}
FAMILY_NAMES = ("classification", *FAMILIES)
BATCHNORM_OPS = ("BatchNorm", "_contrib_SyncBatchNorm")
CALIBRATION_SEED = 1  # not the seed of the comparison input (verify.feeds_for)
VIDEO_3D = re.compile(r"^(i3d|r2plus1d|c3d|p3d|slowfast)")
# Classification networks of the zoo (its list also holds re-ID, GAN and
# other networks this batch does not build).
CLASSIFICATION_PREFIXES = (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50", "resnext101",
    "se", "resnest50", "resnest101", "mobilenet1.0", "mobilenet0.75", "mobilenet0.5",
    "mobilenet0.25", "mobilenetv2", "mobilenetv3", "squeezenet1.0", "squeezenet1.1",
    "densenet121", "densenet161", "densenet169", "densenet201", "inceptionv3", "xception",
    "vgg11", "vgg13", "vgg16", "vgg19", "alexnet", "darknet53", "nasnet", "residualattentionnet56",
    "cifar")


def family_of(name):
    return next((f for f, pattern in FAMILIES.items() if re.search(pattern, name)),
                "classification")


def model_names(family=None):
    """Zoo networks with published weights, of one family or of all of them."""
    names = []
    for name in model_zoo.pretrained_model_list():
        found = family_of(name)
        if found == "classification" and name.split("_")[0] not in CLASSIFICATION_PREFIXES:
            continue
        if family in (None, found):
            names.append(name)
    return sorted(names)


def check_names(names):
    """ValueError for the first name the zoo does not know, with close matches."""
    known = model_zoo.get_model_list()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else \
                "; `mxamp zoo --help` says how to list them"
            raise ValueError(f"unknown model {name!r}{hint}")


def input_shape(name):
    """The input shape each family's networks are built for (batch 1)."""
    family = family_of(name)
    if family == "action" and VIDEO_3D.match(name):
        # SlowFast reads its 32 fast frames and then its slow ones from one
        # clip; C3D and P3D pool time down 16x.
        frames = {"slowfast_4x16": 36, "slowfast_8x8": 40, "c3d": 16, "p3d": 16}
        return (1, 3, next((f for p, f in frames.items() if name.startswith(p)), 8), 112, 112)
    if family == "pose":
        return (1, 3, 256, 192)
    if family == "detection":
        size = 512 if "512" in name else 300 if "_300_" in name else 320
        return (1, 3, size, size)
    if family == "segmentation":  # PSP, DeepLab, DANet etc. are built for 480 crops
        return (1, 3, 480, 480)
    size = 299 if "inception" in name or "xception" in name else 32 if "cifar" in name else 224
    return (1, 3, size, size)


class VectorSafeXavier(mx.init.Xavier):
    """Xavier for matrices and kernels; zeros for a 1-D "weight" (some FPN
    layers have one), where Xavier's fan-in/fan-out is undefined and fails."""

    def _init_weight(self, name, arr):
        if len(arr.shape) < 2:
            arr[:] = 0
        else:
            super()._init_weight(name, arr)


def cached_weights(name):
    """Path of the network's weights in the GluonCV cache, if there and intact."""
    home = os.environ.get("MXNET_HOME", os.path.join("~", ".mxnet"))
    try:
        file_name = f"{name}-{model_store.short_hash(name)}.params"
    except ValueError:  # the zoo publishes no weights for it
        return None
    path = os.path.expanduser(os.path.join(home, "models", file_name))
    ok = os.path.isfile(path) and check_sha1(path, model_store._model_sha1[name])
    return path if ok else None


@contextlib.contextmanager
def _offline_build():
    """Makes GluonCV raise instead of downloading weights, and lets its
    builders move parameters that are not initialized yet: some (TSN-style
    action networks built with pretrained_base=False) call reset_ctx before
    anything initializes them, which MXNet 1.9.1 refuses; they are
    initialized on the CPU afterwards."""
    def refuse(url, **_):
        raise RuntimeError(f"refusing to download {url}")

    def reset_ctx(param, ctx):
        if param._data is not None or param._deferred_init:
            saved_reset(param, ctx)
    saved_download, saved_reset = model_store.download, mx.gluon.Parameter.reset_ctx
    model_store.download, mx.gluon.Parameter.reset_ctx = refuse, reset_ctx
    try:
        yield
    finally:
        model_store.download, mx.gluon.Parameter.reset_ctx = saved_download, saved_reset


def _get_model(name, pretrained):
    if family_of(name) == "classification":
        # Classifiers have no base network, and some (darknet53) refuse
        # pretrained_base as an unknown keyword.
        return model_zoo.get_model(name, pretrained=pretrained)
    try:
        return model_zoo.get_model(name, pretrained=pretrained, pretrained_base=False)
    except TypeError:  # a builder of another family that takes no pretrained_base
        return model_zoo.get_model(name, pretrained=pretrained)


def random_network(name, shape):
    """The zoo network `name` with random weights (Xavier where GluonCV sets
    no initializer) and BatchNorm statistics set by :func:`calibrate_batchnorm`,
    hybridized and run once on an input of `shape`."""
    with _offline_build():
        net = _get_model(name, pretrained=False)
    net.initialize(VectorSafeXavier())
    net.hybridize()
    x = to_ndarray(np.random.RandomState(CALIBRATION_SEED).uniform(size=shape), np.float32)
    net(x)  # records the graph
    calibrate_batchnorm(net, x)
    return net


def calibrate_batchnorm(block, x):
    """Sets each BatchNorm's running variance to the mean square of its
    input on `x` (running mean 0), so every layer hands on activations of
    unit scale, as a trained network's do. Left at their initial (0, 1),
    the statistics rescale nothing and random activations drift in scale
    layer after layer (to ~1e-7 at the end of simple_pose, under float16's
    normal range). One scale per layer, not per channel, and no centering:
    normalizing each channel or subtracting its mean makes a random network
    chaotic (it amplifies small differences from layer to layer, to errors
    of 30% at the end of ResNet-152 in float16), which no trained network is."""
    sym, args, aux, names = model_of(block, "calibrating it")
    graph = graph_json(sym)
    inserter = Inserter(graph)
    layers = []  # (mean square entry, moving var name)
    aux = dict(aux)
    # Each BatchNorm reads its input already divided by the input's own root
    # mean square and keeps (0, 1) as statistics: one pass gives every
    # layer's statistic as the calibrated network sees it.
    for node in graph["nodes"]:
        if node["op"] not in BATCHNORM_OPS:
            continue
        name, attrs = node["name"], node.get("attrs", {})  # none when all are defaults

        def add(op, step, inputs, **op_attrs):
            return [inserter.add({"op": op, "name": f"{name}_calibration_{step}",
                                  "inputs": inputs,
                                  "attrs": {k: str(v) for k, v in op_attrs.items()}}), 0, 0]
        square = add("mean", "ms", [add("square", "sq", node["inputs"][:1])])
        scale = add("rsqrt", "rsqrt", [add("_plus_scalar", "eps", [square],
                                           scalar=attrs.get("eps", 1e-3))])
        node["inputs"][0] = add("broadcast_mul", "in", [node["inputs"][0], scale])
        node["attrs"] = {**attrs, "use_global_stats": "True"}
        mean, var = (graph["nodes"][e[0]]["name"] for e in node["inputs"][3:5])
        aux[mean], aux[var] = mx.nd.zeros_like(aux[mean]), mx.nd.ones_like(aux[var])
        layers.append((square, var))
    graph["heads"] = [e for e, _ in layers]
    calibrating = to_symbol(inserter.apply())
    feeds = {**args, names[0]: x.as_in_context(mx.cpu())}
    with no_graph_fusion():  # a Convolution fused with its BatchNorm hides the input
        exe = calibrating.bind(mx.cpu(), {n: feeds[n] for n in calibrating.list_arguments()},
                               aux_states={n: aux[n] for n in calibrating.list_auxiliary_states()},
                               grad_req="null")
        squares = exe.forward(is_train=False)
    for (_, var), value in zip(layers, squares):
        aux[var] = mx.nd.full(aux[var].shape, value.asscalar())
    params = {p.name: p for p in block.collect_params().values()}
    for name, value in aux.items():
        params[name].set_data(value)


def build(name, shape):
    """(hybridized network run once on an input of `shape`, what its weights are)."""
    path = cached_weights(name)
    if path is not None:
        try:
            with _offline_build():
                net = _get_model(name, pretrained=True)
            net.hybridize()
            net(mx.nd.zeros(shape))  # records the graph
            return net, f"pretrained ({path})"
        except Exception as err:  # noqa: BLE001 - any failure falls back to random weights
            weights = f"random (cached weights unusable: {str(err).splitlines()[0][:120]})"
    else:
        weights = "random"
    return random_network(name, shape), weights


def _failure(stage, err):
    # MXNet's own text may start with "MXNetError:" already, or with a traceback.
    message = mxnet_message(err) if isinstance(err, MXNetError) else str(err).strip()
    text = f"{type(err).__name__}: {message}"
    return {"status": "failed", "failed_in": stage, "error": text.splitlines()[0][:500]}


def run_model(name, dtypes, ctx="any", shape=None, options=None, progress=None):
    """Builds, converts to each of `dtypes`, verifies and saves one network.

    `ctx` is "cpu" (ops without a low-precision kernel on this CPU stay
    float32) or "any" (the full graph for any device; such ops are emulated
    here when verifying). Returns one result dict per dtype; a failure is
    recorded with ``failed_in``: "float32" (the float32 network itself does
    not build or run), "conversion" or "export". `options`, a
    :class:`~mxamp.convert.options.ConversionOptions`, gives the policy
    lists, rules and storage (the dtype, data names and device are each
    conversion's own); `progress(stage)`, if given, hears each stage as it
    starts ("build", "DTYPE convert", "DTYPE verify", "DTYPE export")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GluonCV's and MXNet's, once per network
        return _run_model(name, dtypes, ctx, shape, options or ConversionOptions(),
                          progress or (lambda _: None))


def _run_model(name, dtypes, ctx, shape, options, progress):
    mx.random.seed(0)
    shape = tuple(shape or input_shape(name))
    base = {"model": name, "family": family_of(name), "ctx": ctx, "input_shape": list(shape),
            "weights": "random"}
    progress("build")
    try:
        with memory_for(f"building {name}"), \
                contextlib.redirect_stdout(io.StringIO()):  # Gluon prints shape errors
            net, base["weights"] = build(name, shape)
            reference = model_of(net, "converting it")
    except OutOfMemory:
        raise  # not the network's failure: the batch cannot go on either
    except Exception as err:  # noqa: BLE001 - recorded, the batch goes on
        return [{**base, "dtype": d, **_failure("float32", err)} for d in dtypes]
    sym, args, aux, data_names = reference
    shapes = {data_names[0]: shape}
    return [{**base, "dtype": d, **_convert_one(name, (sym, args, aux), data_names, shapes, d,
                                                 None if ctx == "any" else mx.cpu(), options,
                                                 lambda stage, d=d: progress(f"{d} {stage}"))}
            for d in dtypes]


def _convert_one(name, reference, data_names, shapes, dtype, ctx, options, progress):
    stage = "conversion"
    try:
        with memory_for(f"converting {name} to {dtype}"):
            progress("convert")
            start = time.perf_counter()
            with mxnet_logs_to_logging():  # as the drop-in entry points do
                converted = convert_model_with(*reference, dataclasses.replace(
                    options, target_dtype=dtype, data_names=data_names, ctx=ctx))
            seconds = time.perf_counter() - start
            progress("verify")
            feeds = verify.feeds_for(converted[0], shapes)
            result = verify.compare(reference, converted, feeds)
            stage = "export"
            progress("export")
            files, result["reload_error"] = _export(f"{name}-{dtype}", converted, feeds,
                                                    result["verified"] == "emulated")
    except OutOfMemory:
        raise  # not the network's failure: the batch cannot go on either
    except Exception as err:  # noqa: BLE001 - recorded, the batch goes on
        return _failure(stage, err)
    # Tensors fed into NMS that are computed after another NMS (a two-stage
    # detector's second stage) depend on which proposals it kept: not measured.
    later = verify.after_selection(reference[0])
    measured = [e for n, e in result["pre_nms"].items()
                if n.rsplit("_output", 1)[0] not in later] or result["errors"]
    ok = result["finite"]
    return {"status": "ok" if ok else "failed", "failed_in": None if ok else "conversion",
            "error": None if ok else "non-finite outputs", **result,
            "max_error": max(measured, default=0.0),
            "casts": summarize(converted[0]),
            "ops_by_precision": inspection.precision_counts(converted),
            "param_bytes": {"float32": checkpoint.param_bytes(*reference[1:]),
                            "converted": checkpoint.param_bytes(*converted[1:])},
            "convert_seconds": round(seconds, 3), "files": files}


def _export(prefix, converted, feeds, emulate):
    """Saves the converted checkpoint, reloads and runs it; returns
    ({file name: bytes}, relative error of the reloaded model's outputs
    against the in-memory one's)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = checkpoint.save_checkpoint(os.path.join(tmp, prefix), *converted)
        reloaded = checkpoint.load_checkpoint(os.path.join(tmp, prefix), 0)
        outs = zip(verify.run(reloaded, feeds, emulate), verify.run(converted, feeds, emulate))
        error = max((relative_error(a, b) for a, b in outs), default=0.0)
        files = {}
        for path in paths:
            with open(path, "rb") as f:
                files[os.path.basename(path)] = f.read()
    return files, error


def run_batch(names, dtypes, ctx="any", shape=None, workers=1, scheduler=None, options=None,
              progress=None):
    """Yields each network's results (a list, one per dtype) as it finishes:
    in this process, in `workers` spawned processes, or as one task per
    network on the Dask cluster at `scheduler` ("tcp://host:port").
    `options` as in :func:`run_model`; `progress(name, stage)` hears the
    stages of networks converted in this process."""
    task = (dtypes, ctx, shape, options)
    if scheduler:
        from dask.distributed import Client, as_completed
        with Client(scheduler, timeout="20s") as client:
            futures = {client.submit(run_model, n, *task, pure=False): n for n in names}
            for future in as_completed(futures):
                yield _collect(future, futures[future], dtypes)
    elif workers > 1:
        context = multiprocessing.get_context("spawn")
        with _logs_relayed(context) as relay, concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=context, initializer=_start_worker,
                initargs=(*relay, workers)) as pool:
            futures = {pool.submit(run_model, n, *task): n for n in names}
            try:
                for future in concurrent.futures.as_completed(futures):
                    yield _collect(future, futures[future], dtypes)
            except OutOfMemory:
                pool.shutdown(cancel_futures=True)  # the batch stops, as in one process
                raise
    else:
        for name in names:
            yield run_model(name, *task,
                            progress and (lambda stage, name=name: progress(name, stage)))


# The loggers whose levels the command line sets (-v / -q), and the root's.
_RELAYED_LEVELS = ("", "mxamp", "mxnet")


@contextlib.contextmanager
def _logs_relayed(context):
    """Worker processes' log records, handled in this process by the logger
    of their name, so that this process's levels, filters and handlers apply
    to them as to its own (the command line's advice in its own terms, once
    for all workers). Yields the first initargs of :func:`_start_worker`."""
    queue = context.Queue()
    listener = logging.handlers.QueueListener(queue, _Relay())
    listener.start()
    try:
        yield queue, {name: logging.getLogger(name).level for name in _RELAYED_LEVELS}
    finally:
        listener.stop()  # after the workers ended: their last records are in


class _Relay(logging.Handler):
    def emit(self, record):
        logging.getLogger(record.name).handle(record)


def _start_worker(queue, levels, workers):
    """A worker's logging: this process's levels, every record to `queue`.
    Under a cgroup memory limit, each of the `workers` takes its share of
    what the cgroup leaves (their sum stays within it)."""
    address_space.share_cgroup_headroom(workers)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    logging.getLogger().handlers[:] = [logging.handlers.QueueHandler(queue)]


def _collect(future, name, dtypes):
    """A finished task's results; a worker that died fails its network only."""
    try:
        return future.result()
    except OutOfMemory:
        raise  # as in one process
    except Exception as err:  # noqa: BLE001 - e.g. a worker process killed by the OS
        return [{"model": name, "dtype": d, **_failure("worker", err)} for d in dtypes]


def write_batch(staging, names, dtypes, ctx, shape, workers, scheduler, options, quiet):
    """Converts the networks `names` (:func:`run_batch`), with a progress
    bar unless `quiet`; their files go into `staging`; returns the results,
    sorted."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm
    results = []
    with logging_redirect_tqdm(), tqdm(total=len(names), unit="model", file=sys.stderr,
                                       disable=True if quiet else None) as bar:
        def stage(name, what):
            signals.safe_point()
            bar.set_postfix_str(f"{name}: {what}")
        for model_results in run_batch(names, list(dtypes), ctx, shape, workers, scheduler,
                                       options, stage):
            signals.safe_point()
            for result in model_results:
                files = result.pop("files", {})
                for file_name, data in files.items():
                    with open(os.path.join(staging, file_name), "wb") as f:
                        f.write(data)
                result["files"] = sorted(files)
                results.append(result)
            bar.set_postfix_str(f"{model_results[0]['model']}: done")
            bar.update()
    return sorted(results, key=lambda r: (r["model"], r["dtype"]))


def outcomes(results):
    """The results that failed, whose float32 network failed, and that
    converted without an operator in the low dtype."""
    return {"failed": [r for r in results
                       if r["status"] != "ok" and r["failed_in"] != "float32"],
            "float32_failed": [r for r in results if r["failed_in"] == "float32"],
            "unchanged": [r for r in results if r["status"] == "ok"
                          and not r["ops_by_precision"].get(r["dtype"])]}


def counts(results):
    """How many networks converted, and how many of each of :func:`outcomes`."""
    found = outcomes(results)
    return {"converted": sum(r["status"] == "ok" for r in results) - len(found["unchanged"]),
            **{k: len(v) for k, v in found.items()}}
