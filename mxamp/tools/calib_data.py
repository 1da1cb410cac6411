"""Calibration data for ``mxamp quantize``: a .npy file (the one data
input), a .npz file (one array per data input, plus an optional ``label``
array for accuracy: class indices (N,) or (N, 1), or one-hot (N, C)) or a
folder of images (resized to the input's height and width, scaled to
[0, 1], channels first)."""
import io
import os
import zipfile
import zlib

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError
from PIL import Image

from ..dtypes import as_numpy
from ..errors import OptionError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
ACCEPTED = "give JPEG, PNG or BMP files"
LABEL = "label"


def load(path, data_names, shapes):
    """({data name: float32 array (N, ...)}, labels or None). `shapes`
    ({name: shape}) gives the size images are resized to."""
    if os.path.isdir(path):
        name = _single(data_names, path)
        return {name: _images(path, shapes.get(name))}, None
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        return {_single(data_names, path): _read(path)[None].astype("float32")}, None
    if ext != ".npz":
        raise OptionError(f"calibration data {path!r}: give a .npy or .npz file or a folder "
                          f"of images ({', '.join(IMAGE_EXTENSIONS)})")
    arrays = _read(path)
    labels = arrays.pop(LABEL, None)
    if labels is not None:
        labels = _class_indices(labels, path)
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


def _read(path):
    """{name: array} of a .npz file, {None: array} of a .npy file; one
    OptionError for a file numpy cannot read whole (truncated, not a zip) or
    a member that is not a numeric array."""
    kind = os.path.splitext(path)[1].lower()
    try:
        loaded = np.load(path)
        if isinstance(loaded, np.ndarray):
            arrays = {None: loaded}
        else:
            with loaded:
                arrays = {name: loaded[name] for name in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise OptionError(f"calibration data {path!r} is not a readable {kind} file "
                          f"(truncated or corrupt?): {err}; write it with "
                          f"{'numpy.save' if kind == '.npy' else 'numpy.savez'}") from None
    odd = sorted(str(n) for n, a in arrays.items()
                 if not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf")
    if odd:
        raise OptionError(f"calibration data {path!r}: {', '.join(odd)} is not a numeric "
                          f"array (save arrays with numpy.save / numpy.savez)")
    return arrays


def _class_indices(labels, path):
    """Labels as one class index per example: given as (N,) or (N, 1) whole
    numbers, or one-hot (N, C)."""
    if labels.ndim == 2 and labels.shape[1] > 1 and \
            np.isin(labels, (0, 1)).all() and (labels.sum(axis=1) == 1).all():
        return labels.argmax(axis=1)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or not (labels >= 0).all() or not (labels == np.round(labels)).all():
        raise OptionError(f"calibration data {path!r}: its 'label' array (shape "
                          f"{labels.shape}, {labels.dtype}) must hold one class index per "
                          "example, shaped (N,) or (N, 1), or one-hot rows (N, classes)")
    return labels.astype("int64")


def _single(data_names, path):
    if len(data_names) != 1:
        raise OptionError(f"calibration data {path!r} holds one input; the model has "
                          f"{data_names}: give a .npz file with one array per input")
    return data_names[0]


def _images(folder, shape):
    if shape is None or len(shape) != 4:
        raise OptionError(f"calibration data {folder!r} is a folder of images: they need the "
                          "input shape N,C,H,W (--shape or --input-shapes) to be resized to")
    files = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        raise OptionError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {folder}")
    channels, height, width = shape[1:]
    images = []
    for name in files:
        image = _decoded(os.path.join(folder, name), channels)
        image = mx.image.imresize(image, width, height).astype("float32") / 255
        images.append(as_numpy(image.transpose((2, 0, 1))))
    return np.stack(images)


def _decoded(path, channels):
    """The image file at `path` as an NDArray (H, W, C). Pillow reads it whole
    first: MXNet's decoder names no file, crashes on a directory and lets
    libpng print its own errors, and gives a 0 x 0 image for some damaged
    files."""
    if os.path.isdir(path):
        raise OptionError(f"calibration image {path!r} is a directory, not an image file: "
                          f"{ACCEPTED}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise OptionError(f"cannot read calibration image {path!r}: {err.strerror}") from None
    if not data:
        raise OptionError(f"calibration image {path!r} is empty: {ACCEPTED}")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
        decoded = mx.image.imdecode(data, flag=int(channels != 1))
        decoded.wait_to_read()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, MXNetError):
        decoded = None
    if decoded is None or 0 in decoded.shape:
        raise OptionError(f"calibration image {path!r} cannot be decoded as an image "
                          f"(truncated or corrupt?): {ACCEPTED}")
    return decoded
