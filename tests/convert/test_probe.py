"""Converting for a context: ops without a low-precision kernel there stay float32.

MXNet 1.9.1's CPU build has no float16 kernels for Convolution and
FullyConnected, and bfloat16 ones only on CPUs with AVX-512 (oneDNN's
avx512_core), so conversion for the CPU keeps them in float32 where the kernel
is missing and the result runs; conversion without a context gives the full
graph.
"""
import mxnet as mx
import numpy as np
import pytest

import mxamp
from graphs import structure
from mxamp import cpu
from mxamp.convert import probe

FC = ("FullyConnected", (("num_hidden", "8"),), (-1, -1, -1))
CONV = ("Convolution", (("kernel", "(3, 3)"), ("num_filter", "8"), ("num_group", "4")),
        (-1, -1, -1))


@pytest.mark.cpu
@pytest.mark.parametrize("op, attrs, in_types", [FC, CONV])
def test_cpu_kernels_follow_the_instruction_set(op, attrs, in_types):
    assert probe.has_kernel(op, attrs, in_types, "bfloat16", mx.cpu()) is cpu.mxnet_has_bfloat16()
    assert probe.has_kernel(op, attrs, in_types, "float16", mx.cpu()) is False


@pytest.mark.parametrize("groups, channels", [(1, 4), (2, 4), (3, 6), (4, 4), (960, 960)])
def test_grouped_convolutions_are_probed_with_as_few_channels_as_fit(groups, channels):
    """Input 0 has a multiple of num_group channels, at least 4: one per
    group from 4 groups on (the depthwise kernel a network runs: two per
    group take a generic kernel that costs a first conversion of MobileNet
    v2 about 0.1 s of probing), and the probe runs."""
    attrs = (("kernel", "(3, 3)"), ("no_bias", "True"), ("num_filter", str(groups)),
             ("num_group", str(groups)))
    sym = mxamp.graph.single_op("Convolution", attrs, 2)
    assert probe._guesses(sym, attrs, 2)[0] == (2, channels, probe._SIDE, probe._SIDE)
    assert probe.run_kernel("Convolution", attrs, (0, 0), "bfloat16", mx.cpu()) is not None


def test_float32_inputs_the_op_asks_for_are_kept_in_the_probe():
    """BatchNorm in float16 takes float32 gamma/beta/statistics: it has a kernel."""
    assert probe.has_kernel("BatchNorm", (), (-1, 0, 0, 0, 0), "float16", mx.cpu()) is True


def test_products_are_probed_with_square_inputs():
    """dot / batch_dot need matching inner dimensions: all-equal sides fit.
    MXNet's CPU dot has no float16 kernel."""
    assert probe.has_kernel("batch_dot", (), (-1, -1), "float16", mx.cpu()) is False
    assert probe.has_kernel("dot", (), (-1, -1), "float16", mx.cpu()) is False


def test_reshape_is_probed_with_the_right_number_of_elements():
    """MXNet's Reshape accepts any input shape in inference and crashes when
    run with the wrong element count: the probe feeds exactly as many."""
    assert probe.has_kernel("Reshape", (("shape", "(2, 3, 4)"),), (-1,), "float16",
                            mx.cpu()) is True


def test_unknown_when_no_synthetic_shape_fits():
    assert probe.has_kernel("broadcast_to", (("shape", "(2, 3, 4)"),), (-1,), "float16",
                            mx.cpu()) is None


def searched_in_float32(op, attrs, in_types, dtype, ctx):
    """has_kernel's answer as it is defined: the low-precision run at the
    first guessed shapes that run in float32 (None where none does)."""
    shapes = probe._fitting_shapes(op, attrs, len(in_types), ctx, 2)
    if shapes is None:
        return None
    sym = probe.single_op(op, attrs, len(in_types))
    return probe.runs(sym, shapes, probe._low_types(sym, in_types, dtype), ctx)


QUESTIONS = [FC, CONV, ("BatchNorm", (), (-1, 0, 0, 0, 0)), ("batch_dot", (), (-1, -1)),
             ("dot", (), (-1, -1)), ("Reshape", (("shape", "(2, 3, 4)"),), (-1,)),
             ("broadcast_to", (("shape", "(2, 3, 4)"),), (-1,)),
             ("Embedding", (("input_dim", "10"), ("output_dim", "4")), (0, -1)),
             ("take", (), (-1, 4)), ("clip", (("a_max", "6"), ("a_min", "0")), (-1,))]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op, attrs, in_types", QUESTIONS)
def test_answers_are_those_of_the_float32_shape_search(op, attrs, in_types, dtype):
    """has_kernel runs each guess in the target dtype first: the answers are
    still those of searching the shapes in float32 first."""
    probe.has_kernel.cache_clear()
    assert probe.has_kernel(op, attrs, in_types, dtype, mx.cpu()) is \
        searched_in_float32(op, attrs, in_types, dtype, mx.cpu())


def test_a_kernel_that_exists_is_found_by_one_run(monkeypatch):
    runs = []
    monkeypatch.setattr(probe, "runs", lambda *a: runs.append(a) or True)
    probe.has_kernel.cache_clear()
    assert probe.has_kernel("BatchNorm", (), (-1, 0, 0, 0, 0), "float16", mx.cpu()) is True
    assert len(runs) == 1


def test_answers_are_cached_per_op_attributes_dtype_and_context():
    probe.has_kernel(*FC, "float16", mx.cpu())
    hits = probe.has_kernel.cache_info().hits
    probe.has_kernel(*FC, "float16", mx.cpu())
    assert probe.has_kernel.cache_info().hits == hits + 1


def mlp():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(16, activation="relu"), mx.gluon.nn.Dense(4))
    net.initialize()
    net.hybridize()
    return net


def test_float16_for_cpu_keeps_dense_in_float32_and_runs():
    net = mlp()
    x = mx.nd.random.uniform(shape=(2, 8))
    ref = net(x)
    converted = mxamp.convert_hybrid_block(net, target_dtype="float16")  # ctx: the CPU
    assert mxamp.summarize(converted._cached_graph[1]) == {}  # nothing to cast
    np.testing.assert_allclose(converted(x).asnumpy(), ref.asnumpy(), rtol=1e-6)


def test_without_a_context_the_float16_graph_is_complete():
    """A GPU graph can be built on a CPU-only machine: no context, no probing."""
    net = mlp()
    net(mx.nd.ones((2, 8)))
    sym = net._cached_graph[1]
    full = mxamp.convert_symbol(sym, target_dtype="float16")
    assert mxamp.summarize(full) == {"amp_cast:float16": 5,  # data, 2 weights, 2 biases
                                     "amp_cast:float32": 1}  # the output
    for_cpu = mxamp.convert_symbol(sym, target_dtype="float16", ctx=mx.cpu())
    assert mxamp.summarize(for_cpu) == {}


@pytest.mark.cpu
def test_bfloat16_for_cpu_is_the_full_graph_only_with_avx512():
    net = mlp()
    net(mx.nd.ones((2, 8)))
    sym = net._cached_graph[1]
    for_cpu = mxamp.convert_symbol(sym, target_dtype="bfloat16", ctx=mx.cpu())
    if cpu.mxnet_has_bfloat16():
        assert structure(for_cpu) == structure(mxamp.convert_symbol(sym, target_dtype="bfloat16"))
    else:
        assert mxamp.summarize(for_cpu) == {}


def test_probing_leaves_the_random_stream_alone():
    probe.has_kernel.cache_clear()
    mx.random.seed(7)
    expected = mx.nd.random.uniform(shape=(4,)).asnumpy()
    mx.random.seed(7)
    assert probe.has_kernel(*CONV, "float16", mx.cpu()) is False
    np.testing.assert_array_equal(mx.nd.random.uniform(shape=(4,)).asnumpy(), expected)


def test_a_context_this_machine_lacks_gives_the_full_graph():
    """Nothing runs on a GPU this machine lacks, so the probe cannot say and
    conversion for it builds the full graph (as with no context)."""
    assert mx.context.num_gpus() == 0  # the CPU-only MXNet build
    assert probe.has_kernel(*FC, "float16", mx.gpu(0)) is None
    net = mlp()
    net(mx.nd.ones((2, 8)))
    sym = net._cached_graph[1]
    assert structure(mxamp.convert_symbol(sym, target_dtype="float16", ctx=mx.gpu(0))) == \
        structure(mxamp.convert_symbol(sym, target_dtype="float16"))


def tanh_clip():
    data = mx.sym.var("data")
    return mx.sym.clip(mx.sym.tanh(data, name="t"), 0, 1, name="c")


@pytest.fixture
def timed(monkeypatch):
    """probe.slowdown answering from a table of the test's own (the shipped
    one is measured in bench/): {op: how many times slower than float32};
    the questions asked are recorded."""
    asked, table = [], {}

    def slowdown(op, attrs, in_types, dtype, ctx, measure=False):
        asked.append(op)
        return table.get(op, 1.0)
    monkeypatch.setattr(probe, "slowdown", slowdown)
    return table, asked


def test_an_operator_measured_slower_in_low_precision_stays_float32(timed, caplog):
    """clip runs in bfloat16 only because tanh hands it bfloat16; on a device
    where that is measured slower than float32 it runs in float32 (tanh is
    in the low list: asked for, not timed), and a WARNING names it with
    where the speed comes from."""
    table, asked = timed
    table.update(clip=probe.SLOWER * 2, tanh=probe.SLOWER * 2)
    lists = dict(target_dtype_ops=["tanh"], fp32_ops=[], conditional_fp32_ops=[])
    sym = mxamp.convert_symbol(tanh_clip(), target_dtype="bfloat16", ctx=mx.cpu(), **lists)
    _, ops, heads = structure(sym)
    assert ops["t"] == (("amp_cast", "bfloat16", ("data", 0)),)
    assert ops["c"] == (("amp_cast", "float32", ("t", 0)),)
    assert heads == (("c", 0),)
    assert asked == ["clip"]
    assert "kept in float32 (bfloat16 kernel on cpu(0) slower than float32, as measured on " \
           f"{probe.measured_class(probe.cpu_class())} CPUs" in caplog.text
    assert "(mxamp/convert/kernel_speed.json)): clip x1" in caplog.text
    table["clip"] = probe.SLOWER / 2  # fast enough: it follows tanh
    sym = mxamp.convert_symbol(tanh_clip(), target_dtype="bfloat16", ctx=mx.cpu(), **lists)
    _, ops, heads = structure(sym)
    assert ops["c"] == (("t", 0),) and heads == (("amp_cast", "float32", ("c", 0)),)


def test_without_a_device_nothing_is_timed(timed):
    _, asked = timed
    mxamp.convert_symbol(tanh_clip(), target_dtype="bfloat16", target_dtype_ops=["tanh"],
                         fp32_ops=[], conditional_fp32_ops=[])
    assert asked == []


def test_kernels_are_timed_only_where_they_exist():
    clip = ("clip", (("a_max", "1"), ("a_min", "0")), (-1,))
    assert probe.timed(*clip, "bfloat16", mx.cpu()) > 0  # bfloat16 casts run everywhere
    assert probe.timed(*CONV, "float16", mx.cpu()) is None  # no float16 convolution
    assert probe.timed(*clip, "bfloat16", mx.gpu(0)) is None  # a device not here
