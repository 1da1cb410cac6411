"""Comparing a converted model with its float32 original: relative errors,
runs of both on the same inputs, and detectors' selection ops.

Detector outputs pass through non-maximum suppression, whose selection is
discrete: a tiny score change can swap which boxes survive. Their numerics are
therefore compared on the tensors fed into the selection ops instead.
"""
import mxnet as mx
import numpy as np

from ..convert import probe
from ..errors import mxnet_logs_to_logging
from ..dtypes import FLOAT32, LOW_CODES, as_numpy, to_code, to_ndarray, to_numpy
from ..gluon import model_of
from ..graph import CAST_OPS, graph_json, infer_entry_types, internal_name, internal_outputs
from .emulate import no_graph_fusion, run_emulated

#: The operators whose output is a discrete selection of their input (NMS).
SELECTION_OPS = frozenset({"_contrib_box_nms", "_contrib_box_non_maximum_suppression"})


def relative_error(out, ref):
    """Relative L2 error of `out` against `ref`.

    Parameters
    ----------
    out, ref : mxnet.nd.NDArray or numpy.ndarray
        Arrays of one shape, of any float dtype (bfloat16 included).

    Returns
    -------
    float
        ``norm(out - ref) / norm(ref)``.
    """
    out, ref = (as_numpy(a).astype(np.float32) for a in (out, ref))
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-12))


def selection_inputs(sym):
    """Names of the entries that feed a selection op, in graph order."""
    internals = set(sym.get_internals().list_outputs())
    nodes = graph_json(sym)["nodes"]
    names = []
    for node in nodes:
        if node["op"] in SELECTION_OPS:
            source, index = node["inputs"][0][:2]
            name = internal_name(internals, nodes[source]["name"], index)
            if name not in names:
                names.append(name)
    return names


def selection_errors(reference, converted, feeds, ctx=None):
    """Errors on the tensors fed into selection operators (NMS).

    A detector's output passes through non-maximum suppression, a discrete
    selection: its numerics are compared on the tensors fed into it.

    Parameters
    ----------
    reference, converted : tuple
        The float32 model and the converted one, each ``(sym, arg_params, aux_params)``.
    feeds : dict of str to mxnet.nd.NDArray
        Their data inputs.
    ctx : mxnet.Context, optional
        Where they run, with low-precision operators emulated
        (:func:`run_emulated`).

    Returns
    -------
    dict of str to float
        ``{entry name: relative error}``; empty when the graph has no
        selection operator.
    """
    names = selection_inputs(reference[0])
    if not names:
        return {}

    def run(sym, args, aux):
        # The float32 cast also turns a oneDNN-internal layout into a plain array.
        group = mx.sym.Group([mx.sym.amp_cast(out, dtype="float32")
                              for out in internal_outputs(sym, names)])
        return run_emulated(group, args, aux, feeds, ctx)

    return {n: relative_error(got, ref)
            for n, got, ref in zip(names, run(*converted), run(*reference))}


def pre_selection_errors(block, converted, *inputs):
    """:func:`selection_errors` of a converted Gluon block against its original.

    Parameters
    ----------
    block : mxnet.gluon.HybridBlock
        The float32 block; it must have run forward once.
    converted : mxnet.gluon.HybridBlock
        The converted block; it must have run forward once.
    *inputs : mxnet.nd.NDArray
        The data inputs, in the blocks' order.

    Returns
    -------
    dict of str to float
    """
    *reference, names = model_of(block, "comparing it")
    return selection_errors(reference, model_of(converted, "comparing it")[:3],
                            dict(zip(names, inputs)),
                            inputs[0].context)


def feeds_for(sym, data_shapes, seed=0):
    """Random inputs for a model's data inputs.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        The model.
    data_shapes : dict of str to tuple
        ``{data input name: shape}``.
    seed : int
        Seed of the values.

    Returns
    -------
    dict of str to mxnet.nd.NDArray
        Uniform values in [0, 1), in the dtype each input is declared in
        (float32 unless the converted graph reads it in low precision).
    """
    attrs = sym.attr_dict()
    rng = np.random.RandomState(seed)
    feeds = {}
    for name, shape in data_shapes.items():
        array = to_ndarray(rng.uniform(size=shape), np.float32)
        code = int(attrs.get(name, {}).get("__dtype__", FLOAT32))
        feeds[name] = array if code == FLOAT32 else mx.nd.amp_cast(array, dtype=to_numpy(code))
    return feeds


@mxnet_logs_to_logging()  # kernel probes bind graphs
def missing_kernels(model, feeds):
    """The operators of a converted model this CPU has no kernel for.

    Parameters
    ----------
    model : tuple
        A converted model, ``(sym, arg_params, aux_params)``.
    feeds : dict of str to mxnet.nd.NDArray
        Its data inputs.

    Returns
    -------
    list of str
        Sorted names of the operators that read float16 / bfloat16 inputs
        this CPU has no kernel for (found by running each once, cached). Empty:
        the model runs natively here; else it needs emulation
        (:func:`run_emulated`).
    """
    sym, arg_params, aux_params = model
    known = {n: to_code(a.dtype) for n, a in {**arg_params, **aux_params, **feeds}.items()}
    types = infer_entry_types(sym, known)
    missing = set()
    for nid, node in enumerate(graph_json(sym)["nodes"]):
        in_types = tuple(types.get((e[0], e[1]), -1) for e in node["inputs"])
        low = [LOW_CODES[t] for t in in_types if t in LOW_CODES]
        if node["op"] == "null" or node["op"] in CAST_OPS or not low:
            continue  # casts run on every CPU
        attrs = tuple(sorted(node.get("attrs", {}).items()))
        if probe.has_kernel(node["op"], attrs, in_types, low[0], mx.cpu()) is not True:
            missing.add(node["op"])
    return sorted(missing)


def run(model, feeds, emulate=False):
    """Run a model on this CPU without MXNet's graph fusion.

    Parameters
    ----------
    model : tuple
        ``(sym, arg_params, aux_params)``.
    feeds : dict of str to mxnet.nd.NDArray
        Its data inputs.
    emulate : bool
        Compute each low-precision operator in float32 and round its outputs
        (:func:`run_emulated`), for graphs built for another device.

    Returns
    -------
    list of mxnet.nd.NDArray
        The outputs.
    """
    if emulate:
        return run_emulated(*model, feeds)
    sym, arg_params, aux_params = model
    args = {**arg_params, **feeds}
    # Copies: MXNet's oneDNN kernels keep a weight they have read in a
    # blocked layout, and a later amp_cast of that array to bfloat16 fails
    # ("could not create a primitive descriptor for a reorder primitive");
    # a copy is a plain array.
    # Unfused, as emulated runs are, so a float32 reference and a converted
    # model run the same way: MXNet's oneDNN fusion alone moves some float32
    # outputs (cifar_resnet20_v2's by 60%), which would count as conversion error.
    with no_graph_fusion():
        exe = sym.bind(mx.cpu(), {n: args[n].copy() for n in sym.list_arguments()},
                       aux_states={n: aux_params[n].copy()
                                   for n in sym.list_auxiliary_states()},
                       grad_req="null")
        return exe.forward(is_train=False)


def compare(reference, converted, feeds):
    """Run a float32 model and its conversion on the same inputs and compare them.

    The converted model runs natively where this CPU has a kernel for every
    low-precision operator, else emulated (:func:`run_emulated`).

    Parameters
    ----------
    reference, converted : tuple
        The float32 model and the converted one, each ``(sym, arg_params, aux_params)``.
    feeds : dict of str to mxnet.nd.NDArray
        Their data inputs (see :func:`feeds_for`).

    Returns
    -------
    dict
        ``errors``: the relative error of each output; ``finite``: whether all
        outputs are finite; ``verified``: ``"native"`` or ``"emulated"``;
        ``emulated_ops``: the operators that needed emulation; ``pre_nms``: the
        errors on the tensors fed into NMS (:func:`selection_errors`).
    """
    missing = missing_kernels(converted, feeds)
    refs = run(reference, {n: a.astype("float32") for n, a in feeds.items()})
    outs = run(converted, feeds, emulate=bool(missing))
    return {"verified": "emulated" if missing else "native", "emulated_ops": missing,
            "errors": [relative_error(o, r) for o, r in zip(outs, refs)],
            "finite": all(bool(np.isfinite(as_numpy(o)).all()) for o in outs),
            "pre_nms": selection_errors(reference, converted, feeds)}


def after_selection(sym):
    """The operator nodes whose values depend on a selection operator's choice.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        The model.

    Returns
    -------
    set of str
        The names of the nodes that read, directly or not, the output of a
        selection operator (NMS).
    """
    nodes = graph_json(sym)["nodes"]
    tainted = set()
    for nid, node in enumerate(nodes):
        if any(nodes[e[0]]["op"] in SELECTION_OPS or e[0] in tainted for e in node["inputs"]):
            tainted.add(nid)
    return {nodes[nid]["name"] for nid in tainted}
