"""The attribute that marks a graph as converted by mxamp, and the way back
to the float32 graph."""
from ..dtypes import FLOAT32, LOW_CODES
from ..graph import graph_json

# Attribute on every input variable of a converted graph, naming the target
# dtype: variable attributes survive export, load_checkpoint and imports.
MARKER = "__mxamp_converted__"


def converted_dtype(graph):
    """The dtype mxamp converted a graph (JSON form) to, or None. Only mxamp's
    marker counts: float32 models may hold casts of their own (GluonCV's box
    decoders do)."""
    return next((n["attrs"][MARKER] for n in graph["nodes"] if MARKER in n.get("attrs", {})),
                None)


def refuse_converted(graph, verb="convert"):
    """ValueError if mxamp converted the graph (JSON form) already: a
    converted graph's low-precision parameters and casts do not go through
    another conversion, nor INT8 quantization."""
    dtype = converted_dtype(graph)
    if dtype is not None:
        raise ValueError(f"the model is already converted to {dtype} (its inputs carry "
                         f"mxamp's {MARKER} attribute); {verb} the original float32 model "
                         "instead")


def unconverted(sym):
    """The float32 graph (JSON form) a converted symbol came from: casts,
    marker and low-precision ``__dtype__`` declarations removed (MXNet's own
    serializer drops amp_cast and amp_multicast)."""
    graph = graph_json(sym, casts=False)
    low = {str(code) for code in LOW_CODES}
    for node in graph["nodes"]:
        attrs = node.get("attrs", {})
        if attrs.pop(MARKER, None) is not None and attrs.get("__dtype__") in low:
            attrs["__dtype__"] = str(FLOAT32)
    return graph
