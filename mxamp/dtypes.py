"""The float dtypes AMP casts between, by name and by MXNet's integer code,
and NDArrays to numpy and back."""
import ctypes

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call
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


# MXNet copies an array of this many values or more to or from numpy with an
# OpenMP team on the calling thread (memory_view); a smaller one it copies
# alone, and faster than an engine copy (6-10 against 40-60 us at 1,000).
ENGINE_COPY_FROM = 200_000


def as_numpy(array):
    """An NDArray or numpy array as a numpy array that numpy can compute with:
    bfloat16 is widened to float32 (exactly), other dtypes are kept.

    A dense CPU NDArray of ENGINE_COPY_FROM values or more is copied on
    MXNet's engine thread, and numpy reads the copy (see memory_view for why
    not by MXNet's asnumpy, which copies any other). The copy is a Cast: it
    also copies a view of an array in a oneDNN layout, which copy() refuses,
    and it takes no workspace. An earlier call's failure that nobody waited
    for is raised once on the next operator that gets the failed one's
    workspace (identity does), and is not this array's."""
    if isinstance(array, mx.nd.NDArray):
        return _read(array, _engine_copy(array))
    array = np.asarray(array)
    if not is_bfloat16(array.dtype):
        return array
    bits = array.view(np.uint16).astype(np.uint32) << 16  # bfloat16 is float32's top half
    return bits.view(np.float32)


def as_numpy_all(arrays, ahead=2 ** 26):
    """Yields as_numpy of each of `arrays` in turn, MXNet given the engine
    copies of the next `ahead` bytes before one is read: waiting for each
    copy before MXNet has the next leaves its OpenMP team idle in between
    (ResNet-50's weights on two threads: 0.11 s of CPU time against 0.13 s
    one by one, medians of 7)."""
    arrays, copies, queued, nxt = list(arrays), {}, 0, 0
    for i, array in enumerate(arrays):
        while nxt < len(arrays) and (nxt <= i or queued < ahead):
            copies[nxt] = _engine_copy(arrays[nxt]) \
                if isinstance(arrays[nxt], mx.nd.NDArray) else None
            queued += _bytes(copies[nxt])
            nxt += 1
        copy = copies.pop(i)
        queued -= _bytes(copy)
        yield as_numpy(array) if not isinstance(array, mx.nd.NDArray) else _read(array, copy)


class _Copy:
    """An engine copy of an array, with its shape and dtype read once (each
    is a call into MXNet)."""

    def __init__(self, array, shape, dtype):
        self.array, self.shape, self.dtype = array, shape, dtype
        self.bytes = int(np.prod(shape)) * dtype.itemsize


def _bytes(copy):
    return 0 if copy is None else copy.bytes


def _read(array, copy):
    """as_numpy of the NDArray `array`: its engine copy `copy` viewed, or,
    where it has none, MXNet's own copy."""
    if copy is not None:
        copy.array.wait_to_read()
        return _view(copy.array, copy.shape, copy.dtype)
    return (array.astype("float32") if is_bfloat16(array.dtype) else array).asnumpy()


def _engine_copy(array):
    """as_numpy's engine copy of an NDArray (float32 for bfloat16), or None
    for one that MXNet's own copy reads."""
    if not in_cpu_memory(array):
        return None
    shape = array.shape
    if np.prod(shape) < ENGINE_COPY_FROM:
        return None
    dtype = np.dtype(array.dtype)
    dtype = np.dtype(np.float32) if is_bfloat16(dtype) else dtype
    with mx.autograd.pause():  # a copy, not a step of the user's recorded graph
        return _Copy(mx.nd.cast(array, dtype=dtype), shape, dtype)


def memory_view(array):
    """A numpy view (in its own dtype) of a dense CPU NDArray's memory, once
    MXNet has written it; valid until MXNet writes the array again. An array
    in a oneDNN layout is first reordered to the plain one, in place: view
    only arrays nothing else reads, such as as_numpy's copies.

    mxamp reads and fills dense CPU NDArrays this way, not by MXNet's copies
    to and from numpy: MXNet makes those of a large array with an OpenMP team
    started on the calling thread, and that team stays. With the engine
    thread's team, libgomp then manages more threads than there are CPUs
    and lets idle ones sleep at once, so that every oneDNN primitive run
    after it waits to wake them (docs/onednn.md, "Threads").
    MXNet's copies between NDArrays run on its engine thread."""
    if not in_cpu_memory(array):
        raise ValueError(f"memory_view reads dense CPU arrays; this one is {array.stype} "
                         f"on {array.context}")
    array.wait_to_read()
    return _view(array, array.shape, np.dtype(array.dtype))


def _view(array, shape, dtype):
    """memory_view of a dense CPU `array` of this shape and dtype, written."""
    size = int(np.prod(shape))
    if size == 0:
        return np.empty(shape, dtype)
    address = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(address)))
    if not address.value:  # MXNet could not allocate it (numpy would read address 0)
        raise MemoryError(f"MXNet holds no memory for an array of shape {shape}: "
                          f"Failed to allocate CPU Memory")
    memory = (ctypes.c_char * (size * dtype.itemsize)).from_address(address.value)
    memory.owner = array  # the view keeps the array, and so its memory, alive
    return np.frombuffer(memory, dtype).reshape(shape)


def to_ndarray(values, dtype=None):
    """A numpy array as a new CPU NDArray of its dtype (or `dtype`), filled by
    numpy (see memory_view for why not by mx.nd.array)."""
    values = np.asarray(values, dtype)
    array = mx.nd.empty(values.shape, ctx=mx.cpu(), dtype=values.dtype)
    memory_view(array)[...] = values
    return array


def in_cpu_memory(array):
    """Whether an NDArray is a dense array in CPU memory (whose memory a
    pointer reads as it is)."""
    return array.stype == "default" and array.context.device_type == "cpu"


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
