"""``mxnet.contrib.amp.lists.symbol_fp16``: mxamp's default float16 lists under
the reference's names, computed on first read (the list_* accessors' values)."""
from ...policy.defaults import list_names, named_list

__all__ = list_names("float16")


def __getattr__(name):
    return named_list("float16", name)


def __dir__():
    return __all__
