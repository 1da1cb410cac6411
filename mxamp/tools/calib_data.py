"""Calibration data for ``mxamp quantize``: a .npy file (the one data
input), a .npz file (one array per data input, plus an optional ``label``
array for accuracy) or a folder of images (resized to the input's height
and width, scaled to [0, 1], channels first)."""
import os

import mxnet as mx
import numpy as np

from ..errors import OptionError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
LABEL = "label"


def load(path, data_names, shapes):
    """({data name: float32 array (N, ...)}, labels or None). `shapes`
    ({name: shape}) gives the size images are resized to."""
    if os.path.isdir(path):
        return {_single(data_names, path): _images(path, shapes.get(data_names[0]))}, None
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        return {_single(data_names, path): np.load(path).astype("float32")}, None
    if ext != ".npz":
        raise OptionError(f"calibration data {path!r}: give a .npy or .npz file or a folder "
                          f"of images ({', '.join(IMAGE_EXTENSIONS)})")
    with np.load(path) as saved:
        arrays = dict(saved)
    labels = arrays.pop(LABEL, None)
    if len(data_names) == 1 and len(arrays) == 1:
        arrays = {data_names[0]: next(iter(arrays.values()))}
    missing = sorted(set(data_names) - set(arrays))
    if missing:
        raise OptionError(f"calibration data {path!r} has arrays {sorted(arrays)}; the model's "
                          f"data inputs {missing} are missing")
    sizes = {n: len(arrays[n]) for n in data_names}
    if labels is not None:
        sizes[LABEL] = len(labels)
    if len(set(sizes.values())) > 1:
        raise OptionError(f"calibration data {path!r}: its arrays hold different numbers of "
                          f"examples: {sizes}")
    return {n: arrays[n].astype("float32") for n in data_names}, labels


def _single(data_names, path):
    if len(data_names) != 1:
        raise OptionError(f"calibration data {path!r} holds one input; the model has "
                          f"{data_names}: give a .npz file with one array per input")
    return data_names[0]


def _images(folder, shape):
    if shape is None or len(shape) != 4:
        raise OptionError("calibration images need the input shape N,C,H,W (--shape or "
                          "--input-shapes) to be resized to")
    files = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        raise OptionError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {folder}")
    channels, height, width = shape[1:]
    images = []
    for name in files:
        image = mx.image.imread(os.path.join(folder, name), flag=int(channels != 1))
        image = mx.image.imresize(image, width, height).astype("float32") / 255
        images.append(image.transpose((2, 0, 1)).asnumpy())
    return np.stack(images)
