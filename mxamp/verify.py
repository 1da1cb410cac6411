"""Compare a converted model with its float32 original, on any machine.

A converted graph holds operators in float16 / bfloat16 that this machine may
have no kernels for (MXNet's CPU build has no float16 Convolution, and
bfloat16 ones only with AVX-512). :func:`run_emulated` runs it anyway: each
such operator computes in float32 on its low-precision inputs and rounds its
outputs, as a low-precision kernel accumulating in float32 does.

Detector outputs pass through non-maximum suppression, whose selection is
discrete: a tiny score change can swap which boxes survive. Their numerics are
therefore compared on the tensors fed into the selection ops instead.
"""
import collections
import contextlib
import json
import os

import mxnet as mx
import numpy as np

from .convert import model_of
from .decide import infer_entry_types
from .policy import DTYPE_CODES, to_code

# Ops whose output is a discrete selection of their input.
SELECTION_OPS = frozenset({"_contrib_box_nms", "_contrib_box_non_maximum_suppression"})
_LOW = {DTYPE_CODES[d]: d for d in ("float16", "bfloat16")}


def relative_error(out, ref):
    """Relative L2 error of `out` against `ref` (NDArrays or arrays of any float dtype)."""
    out, ref = (np.asarray(a.astype("float32").asnumpy() if isinstance(a, mx.nd.NDArray) else a,
                           dtype=np.float32) for a in (out, ref))
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-12))


def selection_inputs(sym):
    """Names of the entries that feed a selection op, in graph order."""
    internals = set(sym.get_internals().list_outputs())
    nodes = json.loads(sym.tojson())["nodes"]
    names = []
    for node in nodes:
        if node["op"] in SELECTION_OPS:
            source, index = node["inputs"][0][:2]
            base = nodes[source]["name"] + "_output"
            name = base if base in internals else f"{base}{index}"
            if name not in names:
                names.append(name)
    return names


def selection_errors(reference, converted, feeds, ctx=None):
    """{entry name: relative error} of the `converted` model against the
    float32 `reference` on every entry fed into a selection op (empty if the
    graph has none). Models are (symbol, arg_params, aux_params), run with
    :func:`run_emulated` on `ctx`."""
    names = selection_inputs(reference[0])
    if not names:
        return {}

    def run(sym, args, aux):
        internals = sym.get_internals()
        # The float32 cast also turns a oneDNN-internal layout into a plain array.
        group = mx.sym.Group([mx.sym.amp_cast(internals[n], dtype="float32") for n in names])
        return run_emulated(group, args, aux, feeds, ctx)

    return {n: relative_error(got, ref)
            for n, got, ref in zip(names, run(*converted), run(*reference))}


def pre_selection_errors(block, converted, *inputs):
    """:func:`selection_errors` of a converted Gluon block against its float32
    original; both must have run forward once."""
    *reference, names = model_of(block, "comparing it")
    return selection_errors(reference, model_of(converted, "comparing it")[:3],
                            dict(zip(names, inputs)),
                            inputs[0].context)


def emulated(sym, input_dtypes):
    """A copy of a converted symbol that runs on any device: every operator
    reading low-precision inputs reads them cast to float32 and has its
    low-precision outputs cast back, so it computes what a low-precision
    kernel accumulating in float32 computes (as oneDNN's and cuDNN's do),
    even where the device has no such kernel (e.g. bfloat16 convolutions on a
    CPU without AVX-512, float16 ones on any CPU). `input_dtypes` is {input
    name: dtype code}."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    types = infer_entry_types(sym, input_dtypes)
    read = collections.defaultdict(set)  # node id -> indices of its outputs that are read
    for nid, idx, _ in [e for n in graph["nodes"] for e in n["inputs"]] + graph["heads"]:
        read[nid].add(idx)
    nodes, new_id, as_fp32 = [], {}, {}  # old entry -> new entry; new entry -> its fp32 cast

    def add(node):
        nodes.append(node)
        return len(nodes) - 1

    def to_low(entry, dtype, name):
        # MXNet's amp_cast cannot cast oneDNN-blocked float32 arrays to
        # float16 (nor to bfloat16 without AVX-512); adding 0, an op without
        # a oneDNN kernel, hands it a plain array.
        plain = add({"op": "_plus_scalar", "name": f"{name}_plain", "attrs": {"scalar": "0"},
                     "inputs": [[*entry, 0]]})
        return add(_cast_node(name, (plain, 0), dtype)), 0

    for nid, node in enumerate(graph["nodes"]):
        inputs = [new_id[tuple(e[:2])] for e in node["inputs"]]
        lows = [i for i, e in enumerate(node["inputs"]) if types.get(tuple(e[:2])) in _LOW]
        if node["op"] == "amp_cast" and node["attrs"]["dtype"] in _LOW.values() and not lows:
            new_id[(nid, 0)] = to_low(inputs[0], node["attrs"]["dtype"], node["name"])
            continue
        if node["op"] == "amp_cast" or not lows:
            own = add({**node, "inputs": [[*e, 0] for e in inputs]})
            new_id.update({(nid, k): (own, k) for k in read[nid]})
            continue
        for i in lows:
            if inputs[i] not in as_fp32:
                as_fp32[inputs[i]] = add(_cast_node(f"{node['name']}_in{i}_emulated",
                                                    inputs[i], "float32")), 0
            inputs[i] = as_fp32[inputs[i]]
        own = add({**node, "inputs": [[*e, 0] for e in inputs]})
        for k in sorted(read[nid]):
            dtype = _LOW.get(types.get((nid, k)))
            new_id[(nid, k)] = (own, k) if dtype is None else \
                to_low((own, k), dtype, f"{node['name']}_out{k}_emulated")
    return symbol_of(nodes, [[*new_id[tuple(h[:2])], 0] for h in graph["heads"]],
                     graph.get("attrs", {}))


def symbol_of(nodes, heads, attrs):
    """The symbol of a JSON node list (inputs referring to earlier nodes),
    its `heads` and graph `attrs`."""
    return mx.sym.load_json(json.dumps({
        "nodes": nodes, "heads": heads, "attrs": attrs,
        "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"]}))


def _cast_node(name, entry, dtype):
    return {"op": "amp_cast", "name": name, "attrs": {"dtype": dtype}, "inputs": [[*entry, 0]]}


def run_emulated(sym, arg_params, aux_params, feeds, ctx=None):
    """Outputs of a converted model on `feeds` ({input name: NDArray}), its
    low-precision operators emulated as in :func:`emulated`."""
    ctx = ctx or mx.cpu()
    args = {**arg_params, **feeds}
    aux = {n: aux_params[n] for n in sym.list_auxiliary_states()}
    sym = emulated(sym, {n: to_code(a.dtype) for n, a in {**args, **aux}.items()})
    with no_graph_fusion():
        exe = sym.bind(ctx, {n: args[n] for n in sym.list_arguments()}, aux_states=aux,
                       grad_req="null")
        return exe.forward(is_train=False)


@contextlib.contextmanager
def no_graph_fusion():
    """Executors bound inside run without MXNet's oneDNN graph fusion, whose fused
    kernels reject some low-precision inputs and give wrong bfloat16 results
    on others (a FullyConnected fused with the element-wise ops after it)."""
    old = os.environ.get("MXNET_SUBGRAPH_BACKEND")
    os.environ["MXNET_SUBGRAPH_BACKEND"] = "NONE"
    try:
        yield
    finally:
        if old is None:
            del os.environ["MXNET_SUBGRAPH_BACKEND"]
        else:
            os.environ["MXNET_SUBGRAPH_BACKEND"] = old
