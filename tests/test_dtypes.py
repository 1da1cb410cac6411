"""NDArrays to numpy and back without MXNet's copies to or from numpy (mxamp.dtypes)."""
import gc
import os
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest

import mxamp.dtypes

from mxamp.dtypes import as_numpy, as_numpy_all, memory_view, to_ndarray, to_numpy

BF16 = to_numpy(12)


@pytest.fixture(params=["engine copy", "mxnet copy"])
def copy_path(request, monkeypatch):
    """as_numpy's two ways, whatever the array's size: a copy on MXNet's
    engine that numpy reads (large arrays), or MXNet's asnumpy (small ones)."""
    if request.param == "engine copy":
        monkeypatch.setattr(mxamp.dtypes, "ENGINE_COPY_FROM", 1)
    return request.param


def convolved():
    """A fresh output of MXNet's oneDNN convolution (which may keep it in a
    blocked layout), and its values as MXNet's asnumpy reads them."""
    rng = np.random.RandomState(0)
    x, w = (to_ndarray(rng.normal(size=s), np.float32) for s in [(2, 3, 9, 9), (16, 3, 3, 3)])
    y = mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=16, no_bias=True)
    return y, mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=16, no_bias=True).asnumpy()


def test_memory_view_reads_an_operators_output_and_its_slices():
    y, expected = convolved()
    assert np.array_equal(memory_view(y[1:2]), expected[1:2])
    assert np.array_equal(memory_view(y), expected)


@pytest.mark.parametrize("view", [lambda y: y[1], lambda y: y[1:2], lambda y: y.reshape((2, -1)),
                                  lambda y: y])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_as_numpy_reads_views_of_a_fresh_output(view, dtype, copy_path):
    y, expected = convolved()
    if dtype == "bfloat16":
        y = mx.nd.amp_cast(y, dtype=BF16)
        expected = mx.nd.amp_cast(mx.nd.amp_cast(to_ndarray(expected), dtype=BF16),
                                  dtype="float32").asnumpy()
    got = as_numpy(view(y))
    assert got.dtype == np.float32
    assert np.array_equal(got, view(mx.nd.array(expected)).asnumpy())


def test_a_view_keeps_its_array_alive():
    view = memory_view(to_ndarray(np.arange(6).reshape(2, 3), np.float32))
    gc.collect()
    mx.nd.waitall()
    assert view.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_as_numpy_copies(copy_path):
    array = to_ndarray([1.5, -3.0, 2.0 ** -130], np.float32)
    values = as_numpy(array)
    array[:] = 0
    assert values.tolist() == [1.5, -3.0, 2.0 ** -130]


@pytest.mark.parametrize("values, dtype, expected", [
    (np.array([1, -2], np.int8), None, np.int8),
    (np.array([0.5, 1e-3]), np.float32, np.float32),
    (np.arange(4, dtype=np.float64), None, np.float64),
    (np.array([True, False]), None, np.bool_)])
def test_to_ndarray_keeps_the_values_in_the_dtype_asked(values, dtype, expected):
    array = to_ndarray(values, dtype)
    assert array.dtype == expected
    assert array.asnumpy().tolist() == values.astype(expected).tolist()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.bool_, np.float16,
                                   np.float64])
def test_as_numpy_keeps_every_other_dtype(dtype, copy_path):
    values = np.array([1, 0, 1, 1], dtype)
    got = as_numpy(to_ndarray(values))
    assert got.dtype == dtype and got.tolist() == values.tolist()


def test_as_numpy_reads_an_array_of_unknown_shape_as_mxnet_does():
    array = mx.nd.array(np.float32(3))  # MXNet 1.x: 0-d is "shape unknown"
    assert as_numpy(array).tolist() == array.asnumpy().tolist()


def test_to_ndarray_fills_a_bfloat16_array():
    bits = np.array([0x3FC0, 0xC040], np.uint16)  # 1.5, -3.0
    array = to_ndarray(bits.view(BF16))
    assert array.dtype == BF16
    assert as_numpy(array).tolist() == [1.5, -3.0]


def test_memory_view_refuses_a_sparse_array():
    with pytest.raises(ValueError, match="dense CPU arrays; this one is row_sparse on cpu"):
        memory_view(mx.nd.ones((3,)).tostype("row_sparse"))
    assert as_numpy(mx.nd.ones((3,)).tostype("row_sparse")).tolist() == [1, 1, 1]


def test_as_numpy_reads_past_an_earlier_failure_nobody_waited_for():
    """MXNet raises a failed operator's error, if no one waited for its
    output, on the next operator that gets the same temporary workspace
    (one workspace here). It is not the array's: as_numpy's engine copy
    takes no workspace, and the failed output's own read raises it."""
    code = textwrap.dedent("""
        import mxnet as mx, numpy as np
        import mxamp.dtypes
        from mxamp.dtypes import as_numpy
        mxamp.dtypes.ENGINE_COPY_FROM = 1  # the engine copy for these small arrays too
        half = mx.nd.ones((2, 4), dtype="float16")
        failed = mx.nd.FullyConnected(half, half, num_hidden=2, no_bias=True)  # no CPU kernel
        print(as_numpy(mx.nd.arange(3)).tolist(), as_numpy(mx.nd.arange(2)).tolist())
        try:
            as_numpy(failed)
        except mx.base.MXNetError as err:
            print("raised", "float16 fully connected" in str(err))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "MXNET_CPU_TEMP_COPY": "1"}, timeout=120)
    assert done.stdout.splitlines() == ["[0.0, 1.0, 2.0] [0.0, 1.0]", "raised True"], done.stderr


@pytest.mark.parametrize("ahead", [0, 100, 2 ** 26])
def test_as_numpy_all_reads_each_array_as_as_numpy_does(ahead, copy_path):
    """Whatever copies it queues ahead (`ahead` bytes), each value is the
    array's own, in order: float32, bfloat16, integers, numpy arrays."""
    y, _ = convolved()
    arrays = [y, mx.nd.amp_cast(y, dtype=BF16), mx.nd.arange(5, dtype="int32"),
              np.arange(3.0), y[1], mx.nd.ones((2, 2))]
    got = list(as_numpy_all(arrays, ahead))
    assert len(got) == len(arrays)
    for array, values in zip(arrays, got):
        expected = as_numpy(array)
        assert values.dtype == expected.dtype and np.array_equal(values, expected)
