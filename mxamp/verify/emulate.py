"""Compare a converted model with its float32 original, on any machine.

A converted graph holds operators in float16 / bfloat16 that this machine may
have no kernels for (MXNet's CPU build has no float16 Convolution, and
bfloat16 ones only with AVX-512). :func:`run_emulated` runs it anyway: each
such operator computes in float32 on its low-precision inputs and rounds its
outputs, as a low-precision kernel accumulating in float32 does.
"""
import collections
import contextlib
import os

import mxnet as mx

from ..dtypes import LOW_CODES, to_code
from ..graph import cast_node, graph_json, infer_entry_types, symbol_of


def emulated(sym, input_dtypes):
    """A copy of a converted symbol that runs on any device: every operator
    reading low-precision inputs reads them cast to float32 and has its
    low-precision outputs cast back, so it computes what a low-precision
    kernel accumulating in float32 computes (as oneDNN's and cuDNN's do),
    even where the device has no such kernel (e.g. bfloat16 convolutions on a
    CPU without AVX-512, float16 ones on any CPU). `input_dtypes` is {input
    name: dtype code}."""
    graph = graph_json(sym)
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
        return add(cast_node(name, (plain, 0), dtype)), 0

    for nid, node in enumerate(graph["nodes"]):
        inputs = [new_id[tuple(e[:2])] for e in node["inputs"]]
        lows = [i for i, e in enumerate(node["inputs"]) if types.get(tuple(e[:2])) in LOW_CODES]
        if node["op"] == "amp_cast" and node["attrs"]["dtype"] in LOW_CODES.values() and not lows:
            new_id[(nid, 0)] = to_low(inputs[0], node["attrs"]["dtype"], node["name"])
            continue
        if node["op"] == "amp_cast" or not lows:
            own = add({**node, "inputs": [[*e, 0] for e in inputs]})
            new_id.update({(nid, k): (own, k) for k in read[nid]})
            continue
        for i in lows:
            if inputs[i] not in as_fp32:
                as_fp32[inputs[i]] = add(cast_node(f"{node['name']}_in{i}_emulated",
                                                    inputs[i], "float32")), 0
            inputs[i] = as_fp32[inputs[i]]
        own = add({**node, "inputs": [[*e, 0] for e in inputs]})
        for k in sorted(read[nid]):
            dtype = LOW_CODES.get(types.get((nid, k)))
            new_id[(nid, k)] = (own, k) if dtype is None else \
                to_low((own, k), dtype, f"{node['name']}_out{k}_emulated")
    return symbol_of(nodes, [[*new_id[tuple(h[:2])], 0] for h in graph["heads"]],
                     graph.get("attrs", {}))


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
