"""Node names through every entry point of the backend and of INT8
quantization: any name MXNet accepts (backslashes, quotes, commas,
semicolons, tabs, newlines, unicode, one name on several nodes, an operator
named as an input) works, or is refused with one error naming it.

MXNet 1.9.1 hands a graph to an extension library as JSON that its lib_api.cc
reads taking the backslash ending a string for one escaping the closing
quote: such a name is refused before the graph reaches the library (it
misread the graph, or spun forever). MXNet reads a tensor by its node's
name, so quantization names apart the operators whose names repeat."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import mxamp
import mxamp.backends
from isa import needs, require_onednn3
from mxamp import quantization
from mxamp.verify import relative_error

require_onednn3()

D = mx.sym.var("data")
SHAPE = (4, 3, 8, 8)
# Names each part of a graph's way to the library must carry whole.
ODD = ["a\\b", 'q"uote', "comma,semi;colon", "tab\there", "new\nline", "é ü ∑", "br}ace]s"]


def _odd_net():
    x = mx.sym.Convolution(D, kernel=(3, 3), pad=(1, 1), num_filter=8, name=ODD[0])
    x = mx.sym.BatchNorm(x, fix_gamma=False, name=ODD[1])
    x = mx.sym.Activation(x, act_type="relu", name=ODD[2])
    y = mx.sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=8, name=ODD[3])
    x = mx.sym.Pooling(mx.sym.elemwise_add(x, y, name=ODD[4]), kernel=(2, 2), stride=(2, 2),
                       pool_type="max", name=ODD[5])
    return mx.sym.FullyConnected(x, num_hidden=5, name=ODD[6])


def _repeated_net():
    """Two Convolutions named 'c' and one named as the data input."""
    x = mx.sym.Convolution(D, mx.sym.var("w1"), mx.sym.var("b1"), kernel=(3, 3), pad=(1, 1),
                           num_filter=8, name="c")
    x = mx.sym.Convolution(mx.sym.relu(x), mx.sym.var("w2"), mx.sym.var("b2"), kernel=(3, 3),
                           pad=(1, 1), num_filter=8, name="c")
    x = mx.sym.Convolution(mx.sym.relu(x), kernel=(1, 1), num_filter=4, name="data")
    return mx.sym.FullyConnected(x, num_hidden=5, name="fc")


def _model(sym):
    rs = np.random.RandomState(0)
    arg_shapes, _, aux_shapes = sym.infer_shape(data=SHAPE)
    args = {n: mx.nd.array(rs.uniform(-1, 1, s) * (3 / np.prod(s[1:])) ** 0.5)
            for n, s in zip(sym.list_arguments(), arg_shapes) if n != "data"}
    aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux, mx.nd.array(rs.uniform(-1, 1, SHAPE))


def _run(sym, args, aux, x):
    ex = sym.bind(mx.cpu(), {**args, "data": x}, aux_states={k: v.copy() for k, v in aux.items()},
                  grad_req="null")
    return ex.forward(is_train=False)[0].asnumpy()


def _quantized(sym, args, aux, x):
    return quantization.quantize_model(sym, args, aux, label_names=(), calib_mode="naive",
                                       calib_data=mx.io.NDArrayIter(x, batch_size=len(x)))


@pytest.mark.parametrize("net", [_odd_net, _repeated_net])
@pytest.mark.cpu
def test_apply_backend_and_conversion_take_any_name(net):
    sym = net()
    args, aux, x = _model(sym)
    ref = _run(sym, args, aux, x)
    out = mxamp.backends.get("onednn").apply_backend(sym, args, aux, compute="float32")
    assert len(mxamp.backends.get("onednn").regions(out[0])) == 1
    np.testing.assert_allclose(_run(*out, x), ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    converted = mxamp.convert_model(sym, args, aux, target_dtype="bfloat16", backend="onednn",
                                    backend_compute="float32")
    assert relative_error(_run(*converted, x), ref) < 1e-2


@needs("avx2")
def test_quantization_takes_odd_names(caplog):
    """The convolutions whose parameter names MXNet's extension API cannot
    read back keep float32 weights, named in a WARNING; the model runs."""
    sym = _odd_net()
    args, aux, x = _model(sym)
    out, qargs, qaux = _quantized(sym, args, aux, x)
    assert len(mxamp.backends.get("onednn").regions(out)) == 1
    kept = [r.getMessage() for r in caplog.records if "keeps float32 weights" in r.getMessage()]
    assert kept == [f"INT8: {name!r} keeps float32 weights in the model: the finishing pass got "
                    "no tensor for its parameters: they are no parameter of the model, or their "
                    "name holds a quote, a backslash or a control character, which MXNet's "
                    "extension API does not read back; the region quantizes its weights when it "
                    "first runs" for name in (ODD[0], ODD[3])]
    assert relative_error(_run(out, qargs, qaux, x), _run(sym, args, aux, x)) < 3e-2


@needs("avx2")
def test_quantization_names_repeated_operators_apart(caplog):
    """Each of the three convolutions gets its own calibration: the INT8
    model is as close to float32 as the same model named apart."""
    sym = _repeated_net()
    args, aux, x = _model(sym)
    before = sym.tojson()
    out, qargs, qaux = _quantized(sym, args, aux, x)
    assert sym.tojson() == before
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["INT8: node names repeat (MXNet reads tensors by name, so calibration "
                        "needs them apart); in the INT8 model 'c' (Convolution, node 7) is "
                        "'c_1', 'data' (Convolution, node 11) is 'data_1'"]
    graph = json.loads(sym.tojson())
    assert [graph["nodes"][nid]["name"] for nid in (3, 7, 11)] == ["c", "c", "data"]
    for nid, name in ((7, "c_1"), (11, "data_1")):
        graph["nodes"][nid]["name"] = name
    apart = mx.sym.load_json(json.dumps(graph))
    ref = _run(sym, args, aux, x)
    error = relative_error(_run(out, qargs, qaux, x), ref)
    assert error < 3e-2
    assert error == relative_error(_run(*_quantized(apart, args, aux, x), x), ref)
    # an exclusion by a repeated name keeps every node of that name float32
    out, _, _ = quantization.quantize_model(
        sym, args, aux, label_names=(), calib_mode="naive", excluded_sym_names=["c"],
        calib_data=mx.io.NDArrayIter(x, batch_size=len(x)))
    inner = [n for r in json.loads(out.tojson())["nodes"] if "subgraphs" in r
             for n in r["subgraphs"][0]["nodes"]]
    assert sorted(n["name"] for n in inner if n.get("attrs", {}).get("__mxamp_float__")) == [
        "c", "c_1"]


# Each entry point on a model whose Convolution is named 'c\': refused with
# one error naming it (in a child: it hung).
BACKSLASH_CHILD = r"""
import mxnet as mx, numpy as np, mxamp, mxamp.backends
from mxamp import quantization
sym = mx.sym.FullyConnected(mx.sym.relu(mx.sym.Convolution(
    mx.sym.var("data"), kernel=(3, 3), num_filter=4, name="c\\")), num_hidden=3, name="fc")
shapes = dict(zip(sym.list_arguments(), sym.infer_shape(data=(2, 3, 8, 8))[0]))
args = {n: mx.nd.ones(s) * 0.1 for n, s in shapes.items() if n != "data"}
calib = mx.io.NDArrayIter(mx.nd.ones((2, 3, 8, 8)), batch_size=2)
calls = {
    "apply_backend": lambda: mxamp.backends.get("onednn").apply_backend(sym, args, {},
                                                                        compute="float32"),
    "convert_model": lambda: mxamp.convert_model(sym, args, {}, target_dtype="bfloat16",
                                                 backend="onednn", backend_compute="float32"),
    "quantize_model": lambda: quantization.quantize_model(
        sym, args, {}, label_names=(), calib_mode="naive", calib_data=calib),
}
for name, call in calls.items():
    try:
        call()
        print(name, "ran")
    except ValueError as err:
        print(name, type(err).__name__, err)
"""


def test_a_name_ending_in_a_backslash_is_refused_by_every_entry_point():
    done = subprocess.run([sys.executable, "-c", BACKSLASH_CHILD], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [os.path.dirname(os.path.dirname(
                                  os.path.abspath(__file__))), os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        f"{call} ValueError MXNet cannot hand a graph to the oneDNN backend's partitioner when "
        "a node name or attribute ends in a backslash: ['c\\\\']; rename them"
        for call in ("apply_backend", "convert_model", "quantize_model")]


@needs("avx2")
def test_mxamp_quantize_takes_repeated_names(tmp_path):
    """The command line quantizes and reports (per layer: the reference
    named as the INT8 model) a model whose operator names repeat."""
    sym = _repeated_net()
    args, aux, x = _model(sym)
    mx.model.save_checkpoint(str(tmp_path / "net"), 0, sym, args, aux)
    np.save(tmp_path / "calib.npy", x.asnumpy())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()",
                           "quantize", "net", "--calib", "calib.npy", "--out", "q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "q.json").read_text())
    assert [(row["name"], row["precision"]) for row in report["operators"]
            if row["op"] == "Convolution"] == [("c", "int8"), ("c_1", "int8"), ("data_1", "int8")]


def test_a_node_left_on_mxnet_is_named_whatever_its_name(caplog):
    """The library reports the nodes oneDNN cannot run by index: a name with
    a tab and a newline comes back whole."""
    name = "reversed\tclip\n1"
    sym = mx.sym.clip(mx.sym.relu(D), a_min=1, a_max=0, name=name)
    out, _, _ = mxamp.backends.get("onednn").apply_backend(sym, {}, {}, compute="float32")
    assert mxamp.backends.get("onednn").regions(out) == [["relu"]]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"oneDNN backend: {name} (clip) stays on MXNet: could not create a primitive "
        "descriptor for an eltwise forward propagation primitive in float32"]


@needs("avx2")
def test_int8_partitioning_refuses_repeated_names_it_cannot_tell_apart():
    """apply_backend with compute='int8' reads each region input's range by
    the name of a node reading it: two nodes of one name reading different
    ranges are one clear error (quantize_model names them apart first)."""
    sym = _repeated_net()
    graph = json.loads(sym.tojson())
    for node in graph["nodes"]:
        if node["op"] != "null" or node["name"] == "data":
            node.setdefault("attrs", {}).update(
                {"__mxamp_amax__": str(1 + len(node["name"]) + node["name"].count("_")),
                 "__mxamp_min__": "-1"})
    relus = [n for n in graph["nodes"] if n["op"] == "relu"]
    relus[0]["attrs"]["__mxamp_amax__"], relus[1]["attrs"]["__mxamp_amax__"] = "2", "3"
    args, aux, _ = _model(sym)
    with pytest.raises(mxamp.errors.BackendError,
                       match="two nodes named 'c' read tensors of other calibrated ranges at "
                             "input 0; INT8 needs their names to differ"):
        mxamp.backends.get("onednn").apply_backend(mx.sym.load_json(json.dumps(graph)), args,
                                                   aux, compute="int8")
