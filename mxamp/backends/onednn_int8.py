"""What Python reads of the oneDNN backend's INT8 regions.

Their s8 weights are written by the library's finishing pass while
partitioning with ``compute="int8"`` (src/operator/onednn/s8_weights.h
describes the layout: each INT8 layer's weights in int8 with a float32
scale per output channel, BatchNorm folded in, biases corrected for the
mean shift of the rounding, packed per region). Python names the
calibration attributes the library reads, tells calibration which channel
means to take for bias correction (:func:`mean_axes`) and finds the layers
of a model that read float32 weights, and why (:func:`float32_weight_layers`):
the library's reason, or a model saved before this layout.
"""
import collections

# The node attributes mxamp's quantization sets and the library reads
# (src/operator/onednn/attrs.cc): a tensor's threshold and minimum, and the
# mark of a node kept in float32.
AMAX, MIN, FLOAT = "__mxamp_amax__", "__mxamp_min__", "__mxamp_float__"
# Why a layer of a model whose regions the finishing pass never saw reads float32 weights.
SAVED_BEFORE = ("saved before INT8 models stored int8 weights; the region quantizes them when "
                "it first runs (quantize the float32 model again for int8 weights, a file "
                "about a quarter of the size)")
NO_CHANNELS = "none"  # the channel axis (int8_layers) of a layer whose bias is not corrected


def float32_weight_layers(nodes, lines):
    """{layer name: why} of the layers the library's answer `lines` names
    ("<region node> <layer node>\\t<reason>" each, into the model's `nodes`
    and the region's subgraph): its reason, or SAVED_BEFORE where it gave
    none."""
    found = {}
    for line in lines.splitlines():
        where, why = line.split("\t", 1)
        region, layer = map(int, where.split())
        found[nodes[region]["subgraphs"][0]["nodes"][layer]["name"]] = why or SAVED_BEFORE
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
