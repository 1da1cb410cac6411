"""``mxnet.contrib.amp.lists.symbol_bf16``: mxamp's default bfloat16 lists under
the reference's names, computed on first read (the list_* accessors' values)."""
from ...policy.defaults import list_names, named_list

__all__ = list_names("bfloat16")


def __getattr__(name):
    return named_list("bfloat16", name)


def __dir__():
    return __all__
