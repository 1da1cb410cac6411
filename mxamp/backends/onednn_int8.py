"""s8 weights in the oneDNN backend's INT8 regions: what a saved INT8 model
holds instead of float32 weights, a quarter of their size.

After partitioning with ``compute="int8"``, each Convolution /
FullyConnected that a region runs in INT8 (its data calibrated, the layer
not kept float32) reads its weights as its piece of

    broadcast_mul(Cast(<s8 weights>, dtype=float32), <their scales>)

the weights in int8, quantized per output channel as the region quantized
float32 weights itself (scale = max |w| / levels: 127 levels, or 64 where
this CPU's INT8 kernels take no more, see src/operator/onednn/engine.cc),
and the scales in float32, shaped (channels, 1, ...). A BatchNorm that the
region folds into the convolution before it is folded here, before
quantizing, and leaves the graph; its convolution then reads a new float32
bias. Other biases stay as they are, float32, but where calibration gave
the mean of each channel of the layer's data (``data_means``): then the
bias also takes the mean shift that rounding the weights gives the layer's
outputs, ``sum((w - q) * mean)`` per output channel (bias correction, as
NNCF's fast bias correction does; about 40 % less error on ResNet-50,
docs/quantization.md), and the layer reads a new bias too.

A region's new parameters are packed: each kind is one variable whose rows
(axis 0) are its layers' output channels, and a ``_split_v2`` along axis 0
cuts each layer's piece. The s8 weights are one variable per row shape
(``<region>_weight_s8_32x3x3``: every layer with 32 input channels and
3x3 kernels), dequantized as a whole before the cut; their scales are one
variable per weight rank (``<region>_weight_scales_4d``), cut into the
packs' pieces; the folded biases are one (``<region>_bias_folded``); each
name is made unique if a model parameter has it. Every region input and
node costs MXNet time on every call (an input's dispatch and engine
dependency, Gluon's argument list; the three walks of the subgraph of its
mutable-input query): a MobileNet v2 region read 159 inputs with
variables per layer, 18 packed, and its b1 call took about 10 % less CPU;
dequantizing per pack, not per layer, takes its subgraph from 241 nodes
to 165 (ResNet-50: 261 to 177), with as many inputs.

The subgraph states what the region computes, so MXNet's type and shape
inference read it as they read any graph; the region reads the pieces in
place (weights.cc, Plan::param_of). Run on a CPU without VNNI, weights at
+-127 are requantized to +-64 there (one rounding more than quantizing at
64 here). The new variables carry ``__dtype__`` and ``__shape__``, so a
module bound with data shapes only infers them. Layers left in float32 keep
float32 weights, and so do models saved before this layout (the region
still quantizes those when it first runs); models saved with variables per
layer (``<layer>_weight_s8``, ``<layer>_weight_scale``,
``<layer>_bias_folded``), or with each layer's piece of the packs
dequantized on its own, run as they are.
"""
import collections
import logging

import numpy as np

from ..dtypes import as_numpy, to_code, to_ndarray
from ..graph import Inserter, input_names

# The node attributes mxamp's quantization sets and the library reads
# (src/operator/onednn/attrs.cc): a tensor's threshold and minimum, and the
# mark of a node kept in float32.
AMAX, MIN, FLOAT = "__mxamp_amax__", "__mxamp_min__", "__mxamp_float__"
S8_SUFFIX, SCALES_SUFFIX, BIAS_SUFFIX = "_weight_s8", "_weight_scales", "_bias_folded"
NO_CHANNELS = "none"  # the channel axis (int8_layers) of a layer whose bias is not corrected

log = logging.getLogger(__name__)


def float32_weight_layers(graph, region_op, layers_of):
    """The names of the layers INT8 regions of `graph` (JSON form) run in
    INT8 from float32 weights (`layers_of`: the backend's
    :func:`mxamp.backends.onednn.int8_layers`): a model saved before s8
    weights (the region quantizes them when it first runs)."""
    found = []
    for node in graph["nodes"]:
        if node["op"] != region_op or node.get("attrs", {}).get("compute") != "int8":
            continue
        sub = node["subgraphs"][0]
        found += [sub["nodes"][layer["node"]]["name"]
                  for layer in layers_of(sub, node["attrs"].get("input_ranges", ""))
                  if layer["int8"] and sub["nodes"][layer["params"][0]]["op"] == "null"]
    return found


def mean_axes(nodes, layers):
    """{node name: axis} of the tensors (a node's output 0, of `nodes`) that
    the layers with weights (`layers`, of
    :func:`mxamp.backends.onednn.int8_layers`) read as data, and the axis
    of their channels: what calibration averages for bias correction. A
    tensor whose readers see its channels on different axes is left out
    (every reader counts, excluded layers too)."""
    axes = collections.defaultdict(set)
    for layer in layers:
        nid, index = layer["data"]
        if layer["axis"] != NO_CHANNELS and index == 0:
            axes[nodes[nid]["name"]].add(layer["axis"])
    return {name: found.pop() for name, found in axes.items() if len(found) == 1}


def quantize_weights(graph, arg_params, aux_params, region_op, layers_of, data_means=None):
    """The partitioned graph (JSON form, edited in place) with the weights of
    its INT8 regions' INT8 layers (`layers_of`: the backend's
    :func:`mxamp.backends.onednn.int8_layers`) in int8, and new parameter
    dicts (the given dicts and arrays are not modified). `data_means`:
    {node name: the mean of each channel (:func:`mean_axes`) of its output
    0}, from calibration; a layer reading one gets its bias corrected."""
    params = {**arg_params, **aux_params}
    outer = Inserter(graph)
    new = {}
    corrected = 0
    for node in graph["nodes"]:
        if node["op"] == region_op and node.get("attrs", {}).get("compute") == "int8":
            layers = layers_of(node["subgraphs"][0], node["attrs"].get("input_ranges", ""))
            corrected += _region(node, params, outer, new, layers, data_means or {})
    if corrected:
        log.info("INT8: %d layers' biases corrected for the mean shift of their weights' "
                 "rounding", corrected)
    if not new:
        return graph, arg_params, aux_params
    graph = _pruned(outer.apply())
    used = {n["name"] for n in graph["nodes"] if n["op"] == "null"}
    args = {k: v for k, v in arg_params.items() if k in used}
    args.update({k: to_ndarray(v) for k, v in new.items()})
    return graph, args, {k: v for k, v in aux_params.items() if k in used}


def _region(node, params, outer, new, layers, data_means):
    """Rewrites one INT8 region node: its layers' weights and biases, its
    subgraph and its inputs. New parameters (numpy) go into `new`. Returns
    how many layers' biases were corrected."""
    sub = node["subgraphs"][0]
    names = input_names(sub)
    source = dict(zip(names, node["inputs"]))  # inner variable -> outer entry
    ranges = node["attrs"].get("input_ranges", "").split(";")
    inner = Inserter(sub)
    packs = _Packs(node["name"], inner, outer, source)
    nodes = sub["nodes"]
    # Read before any BatchNorm leaves: a layer reading one then reads its convolution.
    means = {layer["node"]: data_means.get(_tensor_name(nodes, layer["data"], source, outer))
             for layer in layers}
    corrected = 0
    for layer in layers:
        found = _layer_params(nodes, layer, source, outer, params) if layer["int8"] else None
        if found is None:
            continue
        weights, bias = found
        q, scale = _quantized(weights, layer["levels"], layer["step"])
        rows = "x".join(map(str, q.shape[1:]))
        node_of = nodes[layer["node"]]
        node_of["inputs"][1] = packs.piece(f"{S8_SUFFIX}_{rows}", q, scale)
        shift = _rounding_shift(layer, weights - q * scale, means.get(layer["node"]))
        if shift is not None:
            bias = shift if bias is None else bias + shift
            corrected += 1
        if "batchnorm" in layer:
            _drop_batchnorm(sub, layer["node"], layer["batchnorm"]["node"],
                            packs.piece(BIAS_SUFFIX, bias))
        elif shift is not None:
            _set_bias(node_of, packs.piece(BIAS_SUFFIX, bias))
    packs.write(new)
    sub = _pruned(inner.apply())
    node["subgraphs"] = [sub]
    kept = dict(zip(names, ranges))
    names = input_names(sub)
    node["inputs"] = [source[n] for n in names]
    node["attrs"]["input_ranges"] = ";".join(kept.get(n, "") for n in names)
    return corrected


def _tensor_name(nodes, entry, source, outer):
    """The name of the node whose output 0 `entry` of a region's subgraph is
    (in the model outside the region for a region input: another region's
    output has none); None for another output."""
    nid, index = entry
    if nodes[nid]["op"] == "null" and nodes[nid]["name"] in source:
        outer_entry = source[nodes[nid]["name"]]
        return outer.nodes[outer_entry[0]]["name"] if outer_entry[1] == 0 else None
    return nodes[nid]["name"] if index == 0 else None


def _rounding_shift(layer, error, mean):
    """The mean shift that the rounding `error` of a layer's weights (float32
    weights minus their INT8 values) gives each of its output channels, on
    data whose channels have means `mean` (along the layer's channel axis;
    None: unknown): each weight's error times its channel's mean, summed
    (every tap of a kernel counted whole, as away from the padding). None
    where the layer's channels are no axis."""
    if mean is None or layer["axis"] == NO_CHANNELS:
        return None
    rows = error.reshape(len(error), -1).astype(np.float64)
    if layer["axis"] == 1:  # a convolution's channels, in groups
        groups = int(layer["groups"])
        per_group = error.shape[1]
        if mean.size != groups * per_group:
            return None
        taps = rows.reshape(len(error), per_group, -1).sum(axis=2)
        means = mean.reshape(groups, per_group)[np.arange(len(error)) * groups // len(error)]
        return (taps * means).sum(axis=1).astype(np.float32)
    return (rows @ mean).astype(np.float32) if mean.size == rows.shape[1] else None


def _declared(value):
    """The attributes that declare a variable's type and shape to MXNet's
    inference (a module bound with data shapes only)."""
    return {"__dtype__": str(to_code(value.dtype.type)), "__shape__": str(value.shape)}


class _Packs:
    """The new parameters of one region's layers packed into one variable per
    kind, each layer's piece cut by a _split_v2 along axis 0. s8 weights are
    dequantized before the cut, by one Cast and one broadcast_mul by their
    scales (a piece of the scales of their rank): nodes per pack, not per
    layer (MXNet walks the region's subgraph on every call)."""

    def __init__(self, region, inner, outer, source):
        self.region, self.inner, self.outer, self.source = region, inner, outer, source
        self.packs = {}  # suffix -> (outer variable, inner variable, split, pieces)
        self.scales = {}  # s8 suffix -> (its broadcast_mul, its layers' scales)

    def piece(self, suffix, value, scales=None):
        """The inner entry of `value` (numpy), the next piece of the variable
        `<region><suffix>` (a variable of the region's subgraph and of the
        outer graph); with `scales`, `value` is s8 weights and the entry their
        piece dequantized."""
        if suffix not in self.packs:
            var = {"op": "null", "name": self.region + suffix, "attrs": {}, "inputs": []}
            outer_var = self.outer.add(var)
            name = self.outer.nodes[outer_var]["name"]
            inner_var = self.inner.add({**var, "name": name, "attrs": {}})
            self.source[self.inner.nodes[inner_var]["name"]] = [outer_var, 0, 0]
            cut = [inner_var, 0, 0]
            if scales is not None:
                cast = self.inner.add({"op": "Cast", "name": name + "_float",
                                       "attrs": {"dtype": "float32"}, "inputs": [cut]})
                mul = self.inner.add({"op": "broadcast_mul", "name": name + "_dequantized",
                                      "inputs": [[cast, 0, 0], None]})  # scales: write()
                self.scales[suffix] = (mul, [])
                cut = [mul, 0, 0]
            split = self.inner.add({"op": "_split_v2", "name": name + "_split",
                                    "attrs": {"axis": "0"}, "inputs": [cut]})
            self.packs[suffix] = (outer_var, inner_var, split, [])
        _, _, split, pieces = self.packs[suffix]
        pieces.append(value)
        if scales is not None:
            self.scales[suffix][1].append(scales)
        return [split, len(pieces) - 1, 0]

    def write(self, new):
        """Gives each pack of s8 weights its scales, declares the packed
        variables, gives each split its cuts and puts the packed values into
        `new`."""
        for mul, scales in self.scales.values():
            value = np.concatenate(scales)
            self.inner.nodes[mul]["inputs"][1] = self.piece(f"{SCALES_SUFFIX}_{value.ndim}d", value)
        for outer_var, inner_var, split, pieces in self.packs.values():
            value = np.concatenate(pieces)
            self.outer.nodes[outer_var]["attrs"] = _declared(value)
            self.inner.nodes[inner_var]["attrs"] = _declared(value)
            starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
            self.inner.nodes[split]["attrs"]["indices"] = str(tuple(int(i) for i in starts))
            new[self.outer.nodes[outer_var]["name"]] = value


def _layer_params(nodes, layer, source, outer, params):
    """(float32 weights, float32 bias (folded) or None) of an INT8 layer of a
    region's subgraph `nodes`, its BatchNorm folded in as the region folds it
    (normalisation.cc: the factor in double, then float32); None where its
    parameters are not the model's."""
    names = [_param_name(nodes, nid, source, outer, params) for nid in layer["params"]]
    bn = layer.get("batchnorm")
    bn_names = [_param_name(nodes, nid, source, outer, params) for nid in bn["params"]] \
        if bn else []
    if None in names + bn_names:
        return None
    weights = as_numpy(params[names[0]]).astype(np.float32)
    bias = as_numpy(params[names[1]]).astype(np.float32) if len(names) > 1 else None
    if bn is None:
        return weights, bias
    gamma, beta, mean, var = (as_numpy(params[n]).astype(np.float32) for n in bn_names)
    if bn["fix_gamma"]:
        gamma = np.ones_like(gamma)
    factor = (gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + bn["eps"]))
    factor = factor.astype(np.float32)
    bias = np.zeros_like(mean) if bias is None else bias
    weights = weights * factor.reshape((-1,) + (1,) * (weights.ndim - 1))
    return weights, (bias - mean) * factor + beta


def _quantized(weights, levels, step=1):
    """(int8 weights, float32 scales shaped (channels, 1, ...)): one scale
    per output channel, max |w| / levels (1 for a channel of zeros); the
    weights multiples of `step`."""
    flat = weights.reshape(weights.shape[0], -1)
    top = np.abs(flat).max(axis=1)
    scale = np.where(top > 0, top / np.float32(levels), np.float32(1)).astype(np.float32)
    steps = np.rint(flat / (scale[:, None] * np.float32(step))) * step
    q = np.clip(steps, -levels, levels).astype(np.int8)
    shape = (-1,) + (1,) * (weights.ndim - 1)
    return q.reshape(weights.shape), scale.reshape(shape)


def _param_name(nodes, nid, source, outer, params):
    """The model parameter that node `nid` of a region's subgraph (an input
    variable) stands for, or None (also for -1: an input the layer lacks)."""
    if nid < 0:
        return None
    node = nodes[nid]
    if node["op"] != "null" or node["name"] not in source:
        return None
    name = outer.nodes[source[node["name"]][0]]["name"]
    return name if name in params and outer.nodes[source[node["name"]][0]]["op"] == "null" \
        else None


def _drop_batchnorm(sub, nid, bn, bias):
    """Convolution `nid` takes the place of BatchNorm `bn` (folded into its
    new weights and `bias`): the BatchNorm's readers and calibration."""
    nodes = sub["nodes"]
    layer = nodes[nid]
    _set_bias(layer, bias)
    attrs = {k: v for k, v in layer["attrs"].items() if k not in (AMAX, MIN)}
    bn_attrs = nodes[bn].get("attrs", {})
    attrs.update({k: bn_attrs[k] for k in (AMAX, MIN) if k in bn_attrs})
    layer["attrs"] = attrs
    for node in nodes:
        node["inputs"] = [[nid, 0, 0] if e[0] == bn else e for e in node["inputs"]]
    sub["heads"] = [[nid, 0, 0] if h[0] == bn else h for h in sub["heads"]]


def _set_bias(layer, bias):
    """Layer `layer` reads its bias from entry `bias`."""
    layer["inputs"] = layer["inputs"][:2] + [bias]
    layer["attrs"] = {**layer.get("attrs", {}), "no_bias": "False"}


def _pruned(graph):
    """`graph` (JSON form, nodes in topological order) without the nodes its
    heads do not reach."""
    nodes = graph["nodes"]
    keep, stack = set(), [h[0] for h in graph["heads"]]
    while stack:
        nid = stack.pop()
        if nid not in keep:
            keep.add(nid)
            stack.extend(e[0] for e in nodes[nid]["inputs"])
    where = {old: new for new, old in enumerate(sorted(keep))}

    def renumber(entries):
        return [[where[e[0]], *e[1:]] for e in entries]
    kept = [{**nodes[i], "inputs": renumber(nodes[i]["inputs"])} for i in sorted(keep)]
    out = {k: v for k, v in graph.items() if k != "node_row_ptr"}
    out.update(nodes=kept, heads=renumber(graph["heads"]),
               arg_nodes=[i for i, n in enumerate(kept) if n["op"] == "null"])
    return out
