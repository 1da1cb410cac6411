"""NDArrays to numpy and back without MXNet's copies (mxamp.dtypes)."""
import gc

import mxnet as mx
import numpy as np
import pytest

from mxamp.dtypes import as_numpy, memory_view, to_ndarray


def test_memory_view_reads_an_array_written_in_a_onednn_layout():
    # MXNet's oneDNN convolution writes 16 channels in a blocked layout.
    rng = np.random.RandomState(0)
    x, w = (to_ndarray(rng.normal(size=s), np.float32) for s in [(2, 3, 9, 9), (16, 3, 3, 3)])
    y = mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=16, no_bias=True)
    assert np.array_equal(memory_view(y), y.asnumpy())
    assert memory_view(y[1:2]).shape == (1, 16, 7, 7)
    assert np.array_equal(memory_view(y[1:2]), y.asnumpy()[1:2])


def test_a_view_keeps_its_array_alive():
    view = memory_view(to_ndarray(np.arange(6).reshape(2, 3), np.float32))
    gc.collect()
    mx.nd.waitall()
    assert view.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_as_numpy_copies():
    # (tests/test_cpu.py checks how it widens bfloat16)
    array = to_ndarray([1.5, -3.0, 2.0 ** -130], np.float32)
    values = as_numpy(array)
    array[:] = 0
    assert values.tolist() == [1.5, -3.0, 2.0 ** -130]


@pytest.mark.parametrize("values, dtype, expected", [
    (np.array([1, -2], np.int8), None, np.int8),
    (np.array([0.5, 1e-3]), np.float32, np.float32),
    (np.arange(4, dtype=np.float64), None, np.float64)])
def test_to_ndarray_keeps_the_values_in_the_dtype_asked(values, dtype, expected):
    array = to_ndarray(values, dtype)
    assert array.dtype == expected
    assert array.asnumpy().tolist() == values.astype(expected).tolist()


def test_memory_view_refuses_a_sparse_array():
    with pytest.raises(ValueError, match="dense CPU arrays; this one is row_sparse on cpu"):
        memory_view(mx.nd.ones((3,)).tostype("row_sparse"))
    assert as_numpy(mx.nd.ones((3,)).tostype("row_sparse")).tolist() == [1, 1, 1]
