"""Calibration inputs as the reference accepts them, and the one forward pass
a Gluon block needs before its graph can be read."""
import contextlib
import sys

import mxnet as mx
from mxnet.gluon import HybridBlock

from ..errors import OptionError, OptionTypeError


def _arrays(batch):
    """The NDArrays of one batch: a DataBatch's data, a tuple/list, or an array."""
    if isinstance(batch, mx.io.DataBatch):
        return list(batch.data)
    if isinstance(batch, mx.nd.NDArray):
        return [batch]
    if isinstance(batch, (list, tuple)) and all(isinstance(a, mx.nd.NDArray) for a in batch):
        return list(batch)
    raise OptionTypeError(f"a calibration batch must be an NDArray, a list/tuple of NDArrays "
                          f"or an mx.io.DataBatch, got {type(batch).__name__}")


def batches_of(calib_data):
    """Calibration batches as lists of NDArrays (data first, labels after, as
    a DataLoader gives them), from a gluon DataLoader, an mx.io.DataIter
    (reset first) or any iterable of batches; None stays None."""
    if calib_data is None:
        return None
    if isinstance(calib_data, mx.io.DataIter):
        calib_data.reset()
    elif isinstance(calib_data, (str, bytes)) or not hasattr(calib_data, "__iter__"):
        raise OptionTypeError(f"calib_data must be a gluon DataLoader, an mx.io.DataIter or a "
                              f"list of batches, got {type(calib_data).__name__}")
    return (_arrays(batch) for batch in calib_data)


def _shape_of(desc):
    return tuple(desc.shape if isinstance(desc, mx.io.DataDesc) else desc)


@contextlib.contextmanager
def traced(network, first_batch, data_shapes):
    """Inside, `network` holds a cached graph: if it has none, it is
    hybridized and run once on `first_batch` (a list of NDArrays, as many as
    it takes) or on zeros of `data_shapes`; afterwards every block's
    hybridization state is put back."""
    if network._cached_graph:
        yield
        return
    if first_batch is None and not data_shapes:
        raise OptionError("the network has not run yet: pass calib_data or data_shapes (the "
                          "shapes of its inputs) so it can be traced")
    inputs = first_batch if first_batch is not None else \
        [mx.nd.zeros(_shape_of(d)) for d in data_shapes]
    saved = []
    network.apply(lambda b: saved.append((b, dict(vars(b)))) if isinstance(b, HybridBlock)
                  else None)
    try:
        network.hybridize()
        _forward(network, inputs)
        yield
    finally:
        for block, state in saved:
            for key in ("_active", "_flags", "_cached_graph", "_cached_op"):
                setattr(block, key, state.get(key))


def _forward(network, inputs):
    """Runs the network on the first inputs it accepts: a DataLoader's batch
    also holds labels, which the network does not take."""
    for count in range(len(inputs), 0, -1):
        try:
            return network(*inputs[:count])
        except TypeError:
            if count == 1:
                raise


def with_progress(iterable, progress, desc, unit):
    """`iterable`, shown as a progress bar on stderr when `progress` (the
    ``progress=True`` option of quantize_model, tune_int8, optimize...)."""
    if not progress or iterable is None:
        return iterable
    from tqdm import tqdm
    # Every step drawn (steps take a second or more; there are tens of them).
    return tqdm(iterable, desc=desc, unit=unit, leave=False, file=sys.stderr, dynamic_ncols=True,
                mininterval=0, miniters=1)
