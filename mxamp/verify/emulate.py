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
from ..errors import mxnet_logs_to_logging
from ..graph import (Inserter, body_symbol, body_variables, entry_name, graph_json,
                     infer_entry_types, to_symbol)


def emulated(sym, input_dtypes):
    """A copy of a converted symbol that runs on any device.

    Every operator reading low-precision inputs reads them cast to float32
    and has its low-precision outputs cast back, so it computes what a
    low-precision kernel accumulating in float32 computes (as oneDNN's and
    cuDNN's do), even where the device has no such kernel (bfloat16
    convolutions on a CPU without AVX-512, float16 ones on any CPU).
    Control-flow bodies are emulated too.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        A converted symbol.
    input_dtypes : dict of str to int
        ``{input name: MXNet dtype code}``.

    Returns
    -------
    mxnet.symbol.Symbol
    """
    graph = graph_json(sym)
    return to_symbol(_emulated_graph(graph, infer_entry_types(sym, input_dtypes)))


def _emulated_graph(graph, types):
    """:func:`emulated` on a graph in MXNet's JSON form whose entries have
    the dtype codes `types`, control-flow bodies included (each typed by
    MXNet's inference from the dtypes its node's inputs have)."""
    for node in graph["nodes"]:
        for k, body in enumerate(node.get("subgraphs", [])):
            reads = body_variables(node, k)
            known = {body["nodes"][v]["name"]: types.get(tuple(node["inputs"][j][:2]), -1)
                     for v, j in reads.items()}
            node["subgraphs"][k] = _emulated_graph(body, infer_entry_types(body_symbol(body),
                                                                           known))
    read = collections.defaultdict(set)  # node id -> indices of its outputs that are read
    for nid, idx, _ in [e for n in graph["nodes"] for e in n["inputs"]] + graph["heads"]:
        read[nid].add(idx)
    edit = Inserter(graph)
    moved = {}  # (node id, output) of an emulated operator -> the entry holding its value

    def plain(entry):
        # MXNet's amp_cast cannot cast oneDNN-blocked float32 arrays to
        # float16 (nor to bfloat16 without AVX-512); adding 0, an op without
        # a oneDNN kernel, hands it a plain array.
        name = entry_name(edit.nodes[entry[0]]["name"], entry[1]) + "_plain"
        node = {"op": "_plus_scalar", "name": name, "attrs": {"scalar": "0"},
                "inputs": [[entry[0], entry[1], 0]]}
        return [edit.add(node, ("plain", entry[0], entry[1])), 0, 0]

    for nid, node in enumerate(graph["nodes"]):
        lows = {i for i, e in enumerate(node["inputs"]) if types.get((e[0], e[1])) in LOW_CODES}
        inputs = [moved.get((e[0], e[1]), e) for e in node["inputs"]]
        if node["op"] == "amp_cast":
            if node["attrs"]["dtype"] in LOW_CODES.values() and not lows:
                inputs = [plain(inputs[0])]
        elif lows:
            inputs = [edit.cast(e, "float32") if i in lows else e for i, e in enumerate(inputs)]
            for k in sorted(read[nid]):
                dtype = LOW_CODES.get(types.get((nid, k)))
                if dtype is not None:
                    moved[(nid, k)] = edit.cast(plain([nid, k]), dtype)
        node["inputs"] = inputs
    graph["heads"] = [moved.get((h[0], h[1]), h) for h in graph["heads"]]
    return edit.apply()


def run_emulated(sym, arg_params, aux_params, feeds, ctx=None):
    """Run a converted model with its low-precision operators emulated.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        A converted model (see :func:`emulated`).
    arg_params, aux_params : dict of str to mxnet.nd.NDArray
        Its parameters.
    feeds : dict of str to mxnet.nd.NDArray
        Its data inputs.
    ctx : mxnet.Context, optional
        Where it runs (default: the CPU).

    Returns
    -------
    list of mxnet.nd.NDArray
        The outputs.
    """
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
    """Bind executors without MXNet's oneDNN graph fusion inside this context.

    MXNet's fused kernels reject some low-precision inputs and give wrong
    bfloat16 results on others (a FullyConnected fused with the element-wise
    operators after it). Inside, ``MXNET_SUBGRAPH_BACKEND`` is MXNet's
    ``"default"`` backend, which fuses only what it is told to, here nothing
    (``"NONE"`` would do the same but logs a line for every bind).
    """
    old = os.environ.get("MXNET_SUBGRAPH_BACKEND")
    os.environ["MXNET_SUBGRAPH_BACKEND"] = "default"
    try:
        with mxnet_logs_to_logging():  # "Subgraph backend default is activated."
            yield
    finally:
        if old is None:
            del os.environ["MXNET_SUBGRAPH_BACKEND"]
        else:
            os.environ["MXNET_SUBGRAPH_BACKEND"] = old
