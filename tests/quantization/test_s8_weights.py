"""INT8 models hold their weights as int8 (s8) with a float32 scale per
output channel, BatchNorm folded in (the backend's finishing pass,
src/operator/onednn/s8_weights.cc): the saved
.params file is about a quarter of float32's; the model loaded from it
(mxamp.load, SymbolBlock.imports, Module.bind with data shapes only) gives
the in-memory model's outputs exactly; models saved with float32 weights in
their INT8 regions (before this layout) still load and run, named as such."""
import collections
import json
import logging
import os
import re
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxamp
import mxamp.quantization as quantization
from mxamp import cpu
from mxamp.backends import onednn
from mxamp.backends.onednn import REGION_OP
from mxamp.dtypes import to_code
from mxamp.graph import input_names
from mxamp.verify import relative_error

import nets
from graphs import pruned
from isa import require_onednn3

require_onednn3()

# Without VNNI the region requantizes the +-127 weights to +-64: rerun under
# each ISA limit.
pytestmark = pytest.mark.cpu

SHAPE = (4, 3, 16, 16)
OLD_FORMAT = "int8 on the oneDNN backend, float32 weights"


def conv_net(channels=32):
    """Three 3x3 convolutions (the first two with BatchNorm), a Dense head:
    weights dominate the parameters, as in real convolutional networks."""
    with mx.name.NameManager():
        net = nn.HybridSequential()
        net.add(nn.Conv2D(channels, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
                nn.Conv2D(channels, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
                nn.Conv2D(channels, 3, padding=1, use_bias=False), nn.Activation("relu"),
                nn.GlobalAvgPool2D(), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros(SHAPE))  # shapes the parameters
    rng = np.random.RandomState(3)
    for name, param in net.collect_params().items():  # BatchNorm statistics that fold
        if name.endswith(("running_var", "gamma")):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))
        elif name.endswith(("running_mean", "beta")):
            param.set_data(mx.nd.array(rng.normal(0, 0.1, param.shape)))
    return net


def batches(n=3, seed=1):
    rng = np.random.RandomState(seed)
    return [mx.nd.array(rng.normal(0, 1, SHAPE)) for _ in range(n)]


def params_file(prefix):
    return f"{prefix}-0000.params"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(float32 prefix, INT8 prefix, the in-memory INT8 block, its output on
    the first batch, the float32 block's)."""
    folder = tmp_path_factory.mktemp("s8")
    net = conv_net()
    data = batches()
    net.hybridize()
    expected = net(data[0]).asnumpy()
    net.export(str(folder / "f32"))
    qnet = quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive")
    got = qnet(data[0]).asnumpy()
    qnet.export(str(folder / "int8"))  # a block exports what it has run
    return str(folder / "f32"), str(folder / "int8"), qnet, got, expected


def test_the_file_is_about_a_quarter_of_float32(saved):
    f32, int8, _, got, expected = saved
    ratio = os.path.getsize(params_file(int8)) / os.path.getsize(params_file(f32))
    assert ratio <= 0.3, ratio
    loaded = mx.nd.load(params_file(int8))
    dtypes = {name.split(":", 1)[1]: a.dtype for name, a in loaded.items()}
    # Packed per region (_op0): the int8 weights one variable per row shape
    # (conv0's; conv1's and conv2's; dense's), the float32 scales one per
    # weight rank, the biases one: those folded from the two BatchNorms,
    # conv2's (it had none) and dense's, each corrected for the rounding of
    # its layer's weights.
    assert {n: (loaded["arg:" + n].shape, t) for n, t in dtypes.items()} == {
        "_op0_weight_s8_3x3x3": ((32, 3, 3, 3), np.int8),
        "_op0_weight_s8_32x3x3": ((64, 32, 3, 3), np.int8),
        "_op0_weight_s8_32": ((10, 32), np.int8),
        "_op0_weight_scales_4d": ((96, 1, 1, 1), np.float32),
        "_op0_weight_scales_2d": ((10, 1), np.float32),
        "_op0_bias_folded": ((106,), np.float32)}
    # conv1 reads u8 data (after relu): +-64 levels on a CPU without VNNI
    top = 127 if cpu.features("onednn").vnni else 64
    assert np.abs(loaded["arg:_op0_weight_s8_32x3x3"].asnumpy()[:32]).max() == top
    assert relative_error(got, expected) < 5e-2  # three INT8 layers on random weights


def region_of(block):
    """The region node (JSON form) of a block's one INT8 region."""
    nodes = json.loads(block._cached_graph[1].tojson())["nodes"]
    [region] = [n for n in nodes if n["op"] == REGION_OP]
    return region


def test_the_region_reads_packed_parameters(saved):
    """Each region input and node costs MXNet time on every call: the region
    reads the data and six packs (the int8 weights of each row shape, the
    scales of 4-d and 2-d weights, the biases, folded and corrected); each
    pack of weights is dequantized by one Cast and one broadcast_mul by its
    piece of the scales, then each layer's piece cut by a _split_v2, as
    each folded bias is."""
    region = region_of(saved[2])
    sub = region["subgraphs"][0]
    assert input_names(sub) == [
        "data0", "_op0_weight_s8_3x3x3", "_op0_weight_scales_4d", "_op0_bias_folded",
        "_op0_weight_s8_32x3x3", "_op0_weight_s8_32", "_op0_weight_scales_2d"]
    assert len(region["inputs"]) == 7
    assert collections.Counter(n["op"] for n in sub["nodes"]) == {
        "null": 7, "_split_v2": 6, "Cast": 3, "broadcast_mul": 3, "Convolution": 3,
        "Activation": 3, "Pooling": 1, "FullyConnected": 1}
    nodes = sub["nodes"]
    splits = {n["name"]: (nodes[n["inputs"][0][0]]["op"], n["attrs"]["indices"])
              for n in nodes if n["op"] == "_split_v2"}
    assert splits == {"_op0_weight_s8_3x3x3_split": ("broadcast_mul", "(0,)"),
                      "_op0_weight_s8_32x3x3_split": ("broadcast_mul", "(0, 32)"),
                      "_op0_weight_s8_32_split": ("broadcast_mul", "(0,)"),
                      "_op0_weight_scales_4d_split": ("null", "(0, 32)"),
                      "_op0_weight_scales_2d_split": ("null", "(0,)"),
                      "_op0_bias_folded_split": ("null", "(0, 32, 64, 96)")}
    assert {n["attrs"]["axis"] for n in nodes if n["op"] == "_split_v2"} == {"0"}


def older_layout(prefix, out, packed):
    """The INT8 model saved at `prefix` saved again at `out` as mxamp wrote it
    before dequantizing per pack: each layer's weights dequantized by a Cast
    and a broadcast_mul of its own, reading its rows of the packs (`packed`:
    the s8 weights cut per layer, the scales of each rank cut per layer too)
    or, earlier still, variables per layer (an int8 weight, a scale and a
    folded bias)."""
    sym, args, aux = mx.model.load_checkpoint(prefix, 0)
    graph = json.loads(sym.tojson())
    for node in graph["nodes"]:
        if node["op"] != REGION_OP:
            continue
        sub = node["subgraphs"][0]
        nodes = sub["nodes"]
        outer = dict(zip(input_names(sub), node["inputs"]))
        ranges = dict(zip(input_names(sub), node["attrs"]["input_ranges"].split(";")))

        def add(new, value=None):
            """Appends `new` to the subgraph; with `value`, a new variable."""
            nodes.append(new)
            if value is not None:
                args[new["name"]] = mx.nd.array(value, dtype=value.dtype)
                new["attrs"] = {"__dtype__": str(to_code(value.dtype.type)),
                                "__shape__": str(value.shape)}
                graph["nodes"].append(new)
                outer[new["name"]] = [len(graph["nodes"]) - 1, 0, 0]
            return [len(nodes) - 1, 0, 0]

        def starts(cut):
            return [int(i) for i in re.findall(r"\d+", cut["attrs"]["indices"])]

        # (reader, its input, [(packed variable, first row, end row)]): the
        # rows of the s8 weights and of their scales, or of a folded bias
        reads = []
        scale_cuts = {n["inputs"][1][0] for n in nodes if n["op"] == "broadcast_mul"}
        for k, cut in enumerate(nodes):
            if cut["op"] != "_split_v2" or k in scale_cuts:
                continue  # (the scales' cuts are read through their packs' below)
            source = nodes[cut["inputs"][0][0]]
            packs, offsets = [cut["inputs"][0]], [0]
            if source["op"] == "broadcast_mul":
                scales = source["inputs"][1]
                packs = [nodes[source["inputs"][0][0]]["inputs"][0],
                         nodes[scales[0]]["inputs"][0]]
                offsets = [0, starts(nodes[scales[0]])[scales[1]]]
            bounds = starts(cut) + [args[nodes[packs[0][0]]["name"]].shape[0]]
            for reader in list(nodes):
                for i, e in enumerate(reader["inputs"]):
                    if e[0] == k:
                        reads.append((reader, i, [(p, o + bounds[e[1]], o + bounds[e[1] + 1])
                                                  for p, o in zip(packs, offsets)]))
        names = {nodes[v[0]]["name"] for _, _, rows in reads for v, _, _ in rows}
        values = {} if packed else {n: args.pop(n).asnumpy() for n in names}
        cuts = {}  # packed variable -> [its per-layer split, its starts]
        for reader, i, rows in reads:
            read = []
            for var, first, end in rows:
                name = nodes[var[0]]["name"]
                if packed:
                    split, at = cuts.setdefault(name, [add({"op": "_split_v2", "inputs": [var],
                                                           "name": name + "_layers",
                                                           "attrs": {"axis": "0"}}), []])
                    read.append([split[0], len(at), 0])
                    at.append(first)
                else:
                    value = values[name][first:end]
                    read.append(add({"op": "null", "inputs": [], "name":
                                     f"{reader['name']}_{name}"}, value))
            if len(read) == 2:
                cast = add({"op": "Cast", "name": reader["name"] + "_weight_float",
                            "attrs": {"dtype": "float32"}, "inputs": [read[0]]})
                read = [add({"op": "broadcast_mul", "inputs": [cast, read[1]],
                             "name": reader["name"] + "_weight_dequantized"})]
            reader["inputs"][i] = read[0]
        for split, at in cuts.values():  # each layer's rows in the pack's order
            order = sorted(range(len(at)), key=at.__getitem__)
            nodes[split[0]]["attrs"]["indices"] = str(tuple(sorted(at)))
            for reader in nodes:
                reader["inputs"] = [[e[0], order.index(e[1]), 0] if e[0] == split[0] else e
                                    for e in reader["inputs"]]
        sub = pruned(sub)  # new variables last: MXNet takes any order
        node["subgraphs"] = [sub]
        node["inputs"] = [outer[n] for n in input_names(sub)]
        node["attrs"]["input_ranges"] = ";".join(ranges.get(n, "") for n in input_names(sub))
    graph = pruned(graph)
    mx.model.save_checkpoint(out, 0, mx.sym.load_json(json.dumps(graph)), args, aux)
    return graph


@pytest.mark.parametrize("packed", [True, False])
def test_a_model_saved_in_an_older_layout_runs(saved, tmp_path, packed):
    _, int8, _, got, _ = saved
    graph = older_layout(int8, str(tmp_path / "old"), packed)
    sub = [n for n in graph["nodes"] if n["op"] == REGION_OP][0]["subgraphs"][0]
    ops = collections.Counter(n["op"] for n in sub["nodes"])
    assert ops["Cast"] == ops["broadcast_mul"] == 4  # one per layer
    # the data, then the 6 packs, or 4 weights, 4 scales and 4 biases
    assert len(input_names(sub)) == (7 if packed else 13)
    assert ops["_split_v2"] == (6 if packed else 0)
    net = mxamp.load(str(tmp_path / "old"))
    assert net.mxamp_format == "int8 on the oneDNN backend"
    np.testing.assert_array_equal(net(batches()[0]).asnumpy(), got)


def test_a_pack_cut_otherwise_than_by_indices_is_named(saved, tmp_path):
    """A _split_v2 into equal sections passes MXNet's shape inference, but the
    region reads a pack's pieces only by their `indices`: the error names the
    cut and what is allowed."""
    sym, args, aux = mx.model.load_checkpoint(saved[1], 0)
    graph = json.loads(sym.tojson())
    [region] = [n for n in graph["nodes"] if n["op"] == REGION_OP]
    [split] = [n for n in region["subgraphs"][0]["nodes"]
               if n["name"] == "_op0_weight_s8_32x3x3_split"]
    split["attrs"] = {"axis": "0", "indices": "()", "sections": "2"}  # the same two halves
    mx.model.save_checkpoint(str(tmp_path / "cut"), 0, mx.sym.load_json(json.dumps(graph)),
                             args, aux)
    net = mxamp.load(str(tmp_path / "cut"))
    with pytest.raises(mx.base.MXNetError, match=r"_op0_weight_s8_32x3x3_split must cut its input "
                       r"along axis 0 by in-range `indices`.*got axis=0, indices=\(\)"):
        net(batches()[0]).wait_to_read()


def test_loaded_model_gives_the_in_memory_outputs(saved):
    _, int8, _, got, _ = saved
    x = batches()[0]
    net = mxamp.load(int8)
    assert net.mxamp_format == "int8 on the oneDNN backend"
    np.testing.assert_array_equal(net(x).asnumpy(), got)
    assert {p.data().dtype for n, p in net.collect_params().items()
            if "_weight_s8" in n} == {np.int8}
    # the way user code binds a checkpoint: data shapes only
    sym, args, aux = mx.model.load_checkpoint(int8, 0)
    mod = mx.mod.Module(sym, data_names=["data"], label_names=None)
    mod.bind([("data", SHAPE)], for_training=False)
    mod.set_params(args, aux)
    mod.forward(mx.io.DataBatch([x]), is_train=False)
    np.testing.assert_array_equal(mod.get_outputs()[0].asnumpy(), got)


def test_symbolblock_imports_in_a_new_process(saved, tmp_path):
    _, int8, _, got, _ = saved
    np.save(tmp_path / "x.npy", batches()[0].asnumpy())
    code = (
        "import numpy as np, mxnet as mx, mxamp.backends\n"
        "mxamp.backends.get('onednn')\n"
        f"net = mx.gluon.SymbolBlock.imports({int8 + '-symbol.json'!r}, ['data'],\n"
        f"                                  {params_file(int8)!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, net(mx.nd.array(np.load("
        f"{str(tmp_path / 'x.npy')!r}))).asnumpy())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), got)


def float32_weight_model(monkeypatch, net, data):
    """The INT8 model as mxamp wrote it before s8 weights: the regions read
    float32 weights (and BatchNorm) and quantize them when they first run."""
    optimize_for = mx.sym.Symbol.optimize_for

    def without_params(sym, backend, *args, **kwargs):
        if backend != onednn.FINISH:
            return optimize_for(sym, backend, *args, **kwargs)
        # The pass writes s8 weights from the parameters given, and the
        # reason for a layer it cannot write: neither, as before.
        kwargs.update(args=None, aux=None)
        graph = json.loads(optimize_for(sym, backend, *args, **kwargs).tojson())
        for region in graph["nodes"]:
            for node in region.get("subgraphs", [{"nodes": []}])[0]["nodes"]:
                node.get("attrs", {}).pop("__mxamp_float32_weights__", None)
        return mx.sym.load_json(json.dumps(graph))
    with monkeypatch.context() as patch:
        patch.setattr(mx.sym.Symbol, "optimize_for", without_params)
        return quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive")


def test_s8_weights_compute_what_float32_weights_did(monkeypatch):
    """The same INT8 layers with the weights quantized by mxamp (numpy) or,
    as before, by the region when it first ran: the same scales (max |w| /
    levels after folding BatchNorm, the levels this CPU's kernels take), so
    the same outputs but for rounding: on a VNNI CPU this net's are equal; on
    one without, a tie numpy and oneDNN round apart flips one weight step
    (2.9e-3 measured). Both without bias correction, which the region
    does not do."""
    net, data = conv_net(), batches()
    old = float32_weight_model(monkeypatch, net, data)(data[0]).asnumpy()
    monkeypatch.setattr(quantization.api, "data_means", lambda stats: {})
    new = quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive")
    got = new(data[0]).asnumpy()
    assert relative_error(got, old) < (1e-6 if cpu.features("onednn").vnni else 1e-2)
    net.hybridize()
    assert relative_error(got, net(data[0]).asnumpy()) < 5e-2


@pytest.mark.skipif(not cpu.features("onednn").vnni,
                    reason="weights at +-127 come from a CPU with VNNI")
def test_weights_quantized_with_vnni_run_without(monkeypatch, tmp_path):
    """A model quantized on a VNNI CPU (weights at +-127) run where oneDNN
    has no VNNI (AVX2): the region requantizes them to +-64 (and oneDNN
    halves those of convolutions reading signed data), one rounding more
    than the float32-weight layout, which quantizes there directly: 1.5x its
    error here (1.5e-2 against 9.6e-3)."""
    net, data = conv_net(), batches()
    models = {"s8": quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive"),
              "f32": float32_weight_model(monkeypatch, net, data)}
    for name, model in models.items():
        model(data[0])
        model.export(str(tmp_path / name))
    np.save(tmp_path / "x.npy", data[0].asnumpy())
    code = ("import numpy as np, mxnet as mx, mxamp\n"
            f"x = mx.nd.array(np.load({str(tmp_path / 'x.npy')!r}))\n"
            "for name in ('s8', 'f32'):\n"
            f"    y = mxamp.load({str(tmp_path)!r} + '/' + name)(x).asnumpy()\n"
            f"    np.save({str(tmp_path)!r} + '/' + name + '-y.npy', y)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2",
                               "DNNL_MAX_CPU_ISA": "AVX2"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    net.hybridize()
    expected = net(data[0]).asnumpy()
    errors = {n: relative_error(np.load(tmp_path / f"{n}-y.npy"), expected) for n in models}
    assert errors["s8"] < 5e-2 and errors["s8"] < 2 * errors["f32"], errors


def test_a_model_saved_with_float32_weights_loads_and_runs(monkeypatch, tmp_path, caplog):
    net, data = conv_net(8), batches()
    old = float32_weight_model(monkeypatch, net, data)
    assert {p.data().dtype for p in old.collect_params().values()} == {np.float32}
    expected = old(data[0]).asnumpy()  # a block exports what it has run
    old.export(str(tmp_path / "old"))
    asked = []  # the backend is asked which layers read float32 weights once per load
    monkeypatch.setattr(onednn, "float32_weight_layers",
                        lambda graph, ask=onednn.float32_weight_layers: asked.append(1) or ask(graph))
    with caplog.at_level(logging.WARNING, logger="mxamp.tools.loading"):
        loaded = mxamp.load(str(tmp_path / "old"))
    assert loaded.mxamp_format == OLD_FORMAT and len(asked) == 1
    assert "quantize the float32 model again" in caplog.text
    np.testing.assert_array_equal(loaded(data[0]).asnumpy(), expected)
    done = subprocess.run([sys.executable, "-m", "mxamp", "inspect", str(tmp_path / "old")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == f"{tmp_path / 'old'}: {OLD_FORMAT}"


def test_cli_quantize_writes_int8_weights(saved, tmp_path):
    f32, _, _, _, _ = saved
    np.save(tmp_path / "calib.npy", np.concatenate([b.asnumpy() for b in batches()]))
    out = str(tmp_path / "q")
    done = subprocess.run([sys.executable, "-m", "mxamp", "quantize", f32, "--calib",
                           str(tmp_path / "calib.npy"), "--calib-mode", "naive", "--out", out],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    ratio = os.path.getsize(params_file(out)) / os.path.getsize(params_file(f32))
    assert ratio <= 0.3, ratio
    # float32: 19,616 weights (864 + 2 x 9,216 + 320), 74 biases, 2 x 4 x 32
    # BatchNorm values. INT8: the weights in 19,616 bytes; 106 scales (32 x 3
    # + 10) and 106 biases (folded or corrected: every layer's), 848 bytes.
    sizes = "(float32 848 B, int8 19.2 KiB)"
    assert f"parameters: 77.9 KiB float32 -> 20.0 KiB {sizes}" in done.stdout.splitlines()
    shown = subprocess.run([sys.executable, "-m", "mxamp", "inspect", out],
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.splitlines()[0] == f"{out}: int8 on the oneDNN backend"
    assert f"parameters: 20.0 KiB {sizes}" in shown.stdout.splitlines()


def test_the_callers_dicts_are_left_as_they_were():
    """The finishing pass gets copies of the parameter dicts: the caller's
    keep every float32 weight and BatchNorm statistic as they were; the
    returned ones hold the packs instead of what the region no longer
    reads."""
    sym, shape = nets.small_net(), (4, 3, 12, 12)
    args, aux = nets.random_params(sym, shape)
    before = [{k: v.asnumpy() for k, v in d.items()} for d in (args, aux)]
    rng = np.random.RandomState(0)
    calib = mx.io.NDArrayIter(mx.nd.array(rng.uniform(-1, 1, shape)), batch_size=shape[0])
    _, qargs, qaux = quantization.quantize_model(sym, args, aux, label_names=(),
                                                 calib_mode="naive", calib_data=calib)
    for d, was in zip((args, aux), before):
        assert list(d) == list(was)
        for k, v in d.items():
            np.testing.assert_array_equal(v.asnumpy(), was[k])
    assert not {"c1_weight", "c2_weight", "fc_weight"} & set(qargs) and not qaux
    assert {v.dtype for k, v in qargs.items() if "_weight_s8_" in k} == {np.int8}
