"""The float dtypes AMP casts between, by name and by MXNet's integer code."""
import mxnet as mx
import numpy as np
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP, _DTYPE_NP_TO_MX

from .errors import OptionError

# The low-precision dtypes a model converts to.
LOW_DTYPES = ("float16", "bfloat16")
# MXNet's integer dtype codes for the float types AMP casts between.
FLOAT32 = 0
DTYPE_CODES = {"float32": FLOAT32, "float16": 2, "bfloat16": 12}
CASTABLE = frozenset(DTYPE_CODES.values())
LOW_CODES = {DTYPE_CODES[name]: name for name in LOW_DTYPES}  # code -> name


def to_code(np_type):
    """MXNet's integer dtype code for a numpy type (-1 when unknown)."""
    return _DTYPE_NP_TO_MX.get(np_type, -1) if np_type is not None else -1


def to_numpy(code):
    return _DTYPE_MX_TO_NP[code]


def dtype_name(code):
    """'float32', 'bfloat16', 'int32'… for an MXNet dtype code; None when unknown."""
    names = {c: n for n, c in DTYPE_CODES.items()}
    if code in names:
        return names[code]
    return np.dtype(to_numpy(code)).name if code >= 0 and code in _DTYPE_MX_TO_NP else None


def is_bfloat16(dtype):
    """Whether a numpy dtype is MXNet's numpy stand-in for bfloat16 (a record
    type named so, on which numpy has no arithmetic)."""
    return np.dtype(dtype).names == ("bfloat16",)


def as_numpy(array):
    """An NDArray or numpy array as a numpy array that numpy can compute with:
    bfloat16 is widened to float32 (exactly), other dtypes are kept."""
    if isinstance(array, mx.nd.NDArray):
        return (array.astype("float32") if is_bfloat16(array.dtype) else array).asnumpy()
    array = np.asarray(array)
    if not is_bfloat16(array.dtype):
        return array
    bits = array.view(np.uint16).astype(np.uint32) << 16  # bfloat16 is float32's top half
    return bits.view(np.float32)


def normalize_dtype(target_dtype, allowed=LOW_DTYPES, what="target_dtype"):
    """The name in `allowed` ('float16' / 'bfloat16' by default) of a string
    or numpy dtype (MXNet's numpy bfloat16 type too); an OptionError (a
    ValueError) naming the option `what` otherwise."""
    if isinstance(target_dtype, str):
        name = target_dtype
    else:
        try:
            dtype = np.dtype(target_dtype)
        except TypeError:
            name = repr(target_dtype)
        else:
            name = "bfloat16" if is_bfloat16(dtype) else dtype.name
    if name not in allowed:
        raise OptionError(f"{what} {target_dtype!r} is not supported; "
                          f"allowed: {', '.join(allowed)}")
    return name
