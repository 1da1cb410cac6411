"""The attribute that marks a graph as converted by mxamp, and the way back
to the float32 graph."""
from ..backends.onednn import REGION_OP
from ..dtypes import FLOAT32, LOW_CODES, to_code
from ..errors import OptionError
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


# MXNet's own INT8 graph format: its quantization pass's operators, and its
# oneDNN fusion's operators once quantized.
_INT8_OPS = ("_contrib_quantize", "_contrib_quantized_", "_contrib_requantize",
             "_contrib_dequantize")
_FUSED = "_sg_mkldnn_"


def _int8_op(node):
    if node["op"].startswith(_INT8_OPS):
        return True
    return node["op"].startswith(_FUSED) and \
        str(node.get("attrs", {}).get("quantized", "")).lower() in ("true", "1")


def check_float32_graph(graph, verb, params=None):
    """Raises one OptionError when a graph (JSON form) is not a float32 model
    mxamp can `verb` ("convert", "quantize"): it holds oneDNN backend regions,
    it is INT8, mxamp converted it already, or (given `params`, a dict of
    arrays) its parameters are float16 / bfloat16. Read off the JSON alone: MXNet's own queries on a region node
    crash the process."""
    ops = {n["op"] for n in graph["nodes"]}
    if REGION_OP in ops:
        raise OptionError(
            f"the symbol holds mxamp's oneDNN backend regions ({REGION_OP} nodes: "
            "the output of apply_backend, apply_backend_block, mxamp.optimize or "
            f"mxamp.quantization); {verb} the float32 model they were made from instead")
    int8 = sorted({n["op"] for n in graph["nodes"] if _int8_op(n)})
    if int8:
        raise OptionError(
            f"the symbol is already quantized to INT8 (it holds {', '.join(int8)}); "
            f"{verb} the float32 model it was quantized from instead")
    dtype = converted_dtype(graph)
    if dtype is not None:
        raise OptionError(
            f"the model is already converted to {dtype} (its inputs carry mxamp's "
            f"{MARKER} attribute); {verb} the original float32 model instead")
    low = sorted(n for n, a in (params or {}).items()
                 if LOW_CODES.get(to_code(a.dtype), "float32") != "float32")
    if low:
        raise OptionError(
            f"the model's parameters {low[:3]}{' ...' if len(low) > 3 else ''} are "
            f"{LOW_CODES[to_code(params[low[0]].dtype)]}; {verb} the float32 model instead")


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
