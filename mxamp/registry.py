"""What MXNet's operator registry says: every operator name and the name
graphs record it under."""
import ctypes
import difflib
import functools

from mxnet.base import _LIB, OpHandle, c_str, check_call, py_str
from mxnet.operator import get_all_registered_operators

from .errors import OptionError


@functools.lru_cache(maxsize=None)
def canonical_op_names():
    """Every registered operator name (aliases included, backward ops excluded)
    mapped to the name MXNet records in graphs."""
    names = {}
    for name in get_all_registered_operators():
        if name.startswith("_backward"):
            continue
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
        real = ctypes.c_char_p()
        unused_str = ctypes.c_char_p()
        unused_num = ctypes.c_uint()
        unused_arr = ctypes.POINTER(ctypes.c_char_p)()
        check_call(_LIB.NNGetOpInfo(handle, ctypes.byref(real), ctypes.byref(unused_str),
                                    ctypes.byref(unused_num), ctypes.byref(unused_arr),
                                    ctypes.byref(unused_arr), ctypes.byref(unused_arr),
                                    ctypes.byref(unused_str)))
        names[name] = py_str(real.value)
    return names


def check_op_names(ops, what):
    """The names MXNet records in graphs for the operator names `ops`, in
    order; one OptionError listing the names MXNet does not know, each with
    its closest registered names (a different case first: 'convolution' is
    'Convolution')."""
    known = canonical_op_names()
    unknown = sorted(set(ops) - known.keys())
    if unknown:
        hints = []
        for op in unknown:
            close = [n for n in known if n.lower() == op.lower()] or \
                difflib.get_close_matches(op, known, n=3)
            hints.append(f"{op!r} (did you mean {' or '.join(map(repr, close))}?)" if close
                         else repr(op))
        raise OptionError(f"{what} names operators MXNet does not know: {', '.join(hints)}; "
                          "see mxnet.operator.get_all_registered_operators()")
    return [known[op] for op in ops]
