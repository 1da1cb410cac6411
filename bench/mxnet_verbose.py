"""The child of benchlib.mxnet_verbose_runs: runs an exported MXNet model
with the oneDNN verbose its parent set (DNNL_VERBOSE=1, which MXNet 1.9.1's
own oneDNN 2.4 reads when it starts), marking the start of each call.

    python bench/mxnet_verbose.py PREFIX INPUT.npy CALLS

PREFIX-symbol.json and PREFIX-0000.params: the model, its input named data.
Two calls first, unmarked: they create the primitives and reorder the weights.
"""
import ctypes
import os
import sys

import mxnet as mx
import numpy as np

import mxamp  # noqa: F401  MXNet's kernels as mxamp's users run them (AMX where the CPU has it)
from benchlib import CALL_MARK


def main(prefix, input_path, calls):
    block = mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"],
                                         f"{prefix}-0000.params", ctx=mx.cpu())
    block.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(np.load(input_path))
    libc = ctypes.CDLL(None)
    for call in range(2 + calls):
        if call >= 2:
            libc.fflush(None)  # oneDNN writes through C stdio
            os.write(1, f"{CALL_MARK}\n".encode())
        block(x).wait_to_read()
    libc.fflush(None)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
