"""How a quantized model does against its float32 model on the examples a
command was given: the outputs on all of them, top-1 accuracy against
labels, and the INT8 model's error and accuracy beside float32's."""
import numpy as np

from .. import verify
from ..dtypes import as_numpy, to_ndarray
from . import signals


def outputs(model, arrays, batch=64):
    """A model's outputs (numpy) on all the examples of `arrays` ({data
    name: array}), run `batch` examples at a time."""
    count = len(next(iter(arrays.values())))
    parts = []
    for first in range(0, count, batch):
        signals.safe_point()
        feeds = {n: to_ndarray(a[first:first + batch], np.float32) for n, a in arrays.items()}
        parts.append([as_numpy(o) for o in verify.run(model, feeds)])
    return [np.concatenate(outs) for outs in zip(*parts)]


def top1(scores, labels):
    """The fraction of examples whose highest score is their label."""
    if scores.shape != (len(labels), scores.shape[-1]):
        raise ValueError(f"the calibration data's 'label' array has shape {labels.shape} and "
                         f"the model's first output {scores.shape}: accuracy needs one class "
                         "per example and an output of (examples, classes)")
    return float(np.mean(scores.argmax(axis=1) == labels))


def int8_against_float32(reference, quantized, arrays, labels):
    """The INT8 model against float32 on the examples: relative error per
    output and, with labels, top-1 accuracy of both."""
    outs = {"float32": outputs(reference, arrays), "int8": outputs(quantized, arrays)}
    result = {"errors": [verify.relative_error(q, f)
                         for q, f in zip(outs["int8"], outs["float32"])]}
    if labels is not None:
        result["accuracy"] = {k: top1(v[0], labels) for k, v in outs.items()}
    return result
