"""Compare a converted Gluon block with its float32 original.

Detector outputs pass through non-maximum suppression, whose selection is
discrete: a tiny score change can swap which boxes survive. Their numerics are
therefore compared on the tensors fed into the selection ops instead.
"""
import json

import mxnet as mx
import numpy as np

# Ops whose output is a discrete selection of their input.
SELECTION_OPS = frozenset({"_contrib_box_nms", "_contrib_box_non_maximum_suppression"})


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


def _run_entry(block, name, inputs):
    inputs_vars, sym = block._cached_graph
    # The float32 cast also turns a oneDNN-internal layout into a plain array.
    entry = mx.sym.amp_cast(sym.get_internals()[name], dtype="float32")
    params = {p.name: p.data() for p in block.collect_params().values()}
    feeds = {v.name: x for v, x in zip(inputs_vars, inputs)}
    args = {n: feeds[n] if n in feeds else params[n] for n in entry.list_arguments()}
    aux = {n: params[n] for n in entry.list_auxiliary_states()}
    exe = entry.bind(inputs[0].context, args, aux_states=aux, grad_req="null")
    return exe.forward(is_train=False)[0]


def pre_selection_errors(block, converted, *inputs):
    """{entry name: relative error} of `converted` against the float32 `block` on
    every entry fed into a selection op (empty if the graph has none). Both
    blocks must have run forward once."""
    return {name: relative_error(_run_entry(converted, name, inputs),
                                 _run_entry(block, name, inputs))
            for name in selection_inputs(block._cached_graph[1])}
