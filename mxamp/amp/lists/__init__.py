"""``mxnet.contrib.amp.lists``: mxamp's default lists per target dtype in the
reference's module layout and names (``symbol_fp16``, ``symbol_bf16``, each
with its ``*_FUNCS`` lists), as code written for the reference reads them."""
from . import symbol_bf16, symbol_fp16

__all__ = ["symbol_bf16", "symbol_fp16"]
