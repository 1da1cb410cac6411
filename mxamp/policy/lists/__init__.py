"""Default operator precision lists, one module per target dtype.

Every operator registered in MXNet 1.9.1 (backward ops aside) sits in exactly
one category list of each module; tests/test_lists.py keeps that true."""
from . import symbol_bf16, symbol_fp16

__all__ = ["symbol_bf16", "symbol_fp16"]
