"""The models the commands read and make: a float32 checkpoint (a model in
another format named as such), a GluonCV zoo network, calibration data
checked against the model, and the INT8 model ``mxamp quantize`` makes."""
import contextlib

import click
import mxnet as mx
import numpy as np

from ..convert.marker import check_float32_graph
from ..dtypes import LOW_DTYPES, to_ndarray
from ..graph import graph_json
from . import checkpoint, evaluation, loading
from .console import progress
from .options import check_zoo_names
from .text import shape_text


def read_float32(prefix, epoch, verb):
    """The float32 model at `prefix`; an error names the format of one that
    is quantized, on the oneDNN backend or converted already, before any
    other check (a converted model without --shape was told to give one)."""
    *model, model_format = loading.read(prefix, epoch)
    if model_format not in ("float32", *LOW_DTYPES):
        raise click.ClickException(f"{prefix} is {model_format}; {verb} the original float32 "
                                   "model instead")
    sym, arg_params, aux_params = model
    check_float32_graph(graph_json(sym), verb, {**arg_params, **aux_params})
    return tuple(model)


def read_source(prefix, zoo_name, epoch, shapes):
    """((sym, arg_params, aux_params), data names, data shapes) of the model
    to quantize, PREFIX or the --zoo network; a zoo network's data shape is
    its family's usual one unless given."""
    if zoo_name:
        from ..gluon import model_of
        from . import zoo as zoo_lib
        check_zoo_names(zoo_lib, [zoo_name])
        shape = next(iter(shapes.values()), None) or zoo_lib.input_shape(zoo_name)
        net, _ = zoo_lib.build(zoo_name, shape)
        *model, data_names = model_of(net, "quantizing it")
        return tuple(model), list(data_names), {data_names[0]: shape}
    model = read_float32(prefix, epoch, "quantize")
    params = {**model[1], **model[2]}
    return model, [n for n in model[0].list_inputs() if n not in params], shapes


def check_calibration(model, arrays, calib):
    """The calibration arrays fit the model's data inputs. An image batch in
    channels-last layout (N, H, W, C) is named as such: the model's
    parameters are right, the data is not."""
    shapes = {n: (1, *a.shape[1:]) for n, a in arrays.items()}
    try:
        checkpoint.check_inputs(*model, shapes, "the model's parameters",
                                f"its examples ({shape_text(shapes)})")
    except ValueError as err:
        for name, shape in shapes.items():
            if len(shape) != 4:
                continue
            channels_first = (1, shape[3], shape[1], shape[2])
            with contextlib.suppress(ValueError):
                checkpoint.check_inputs(*model, {**shapes, name: channels_first}, "")
                raise click.ClickException(
                    f"calibration data {calib}: {name!r} has shape {arrays[name].shape}, "
                    f"channels last (N, H, W, C); the model reads channels first (N, C, H, W), "
                    f"here (N, {', '.join(map(str, channels_first[1:]))}): transpose it, "
                    "e.g. numpy.transpose(x, (0, 3, 1, 2))") from None
        raise click.ClickException(f"calibration data {calib} does not fit the model: "
                                   f"{err}") from None


def quantized(reference, data_names, arrays, labels, options, max_drop):
    """(the INT8 model, what --max-drop's tuning found or None)."""
    from ..quantization import quantize_model, tune_int8
    from ..quantization.api import excluded_nodes
    count = len(next(iter(arrays.values())))
    calib_iter = mx.io.NDArrayIter({n: to_ndarray(a, np.float32) for n, a in arrays.items()},
                                   batch_size=min(count, 32))
    exclude, exclude_ops = options["exclude"], options["exclude_ops"]
    common = {"num_calib_examples": options["num_calib_examples"],
              "rest_dtype": options["rest_dtype"], "data_names": data_names}
    with progress() as shown:
        if max_drop is None:
            return quantize_model(*reference, label_names=(), calib_mode=options["calib_mode"],
                                  calib_data=calib_iter, excluded_sym_names=list(exclude) or None,
                                  excluded_op_names=list(exclude_ops) or None,
                                  progress=shown, **common), None

        def accuracy(model):
            return evaluation.top1(evaluation.outputs(model, arrays)[0], labels)
        tuned = tune_int8(
            reference, calib_iter, accuracy, max_drop, options["calib_mode"], exclude_layers=[
                *exclude, *excluded_nodes(reference[0], None, None, exclude_ops)] or None,
            progress=shown, **common)
    return tuned.model, {"max_drop": max_drop, "float32_layers": tuned.excluded,
                         "accuracy_drop": tuned.metric_drop, "evaluations": tuned.evaluations}
