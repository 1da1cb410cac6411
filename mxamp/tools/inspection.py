"""What a conversion did to a model: the precision each operator runs in,
with the reason, cast counts and parameter memory; given input shapes, also
each operator's FLOPs and the relative error of its output against float32."""
import collections
import math

import mxnet as mx

from .. import backends, verify
from ..backends.onednn import REGION_OP
from ..convert import unconverted
from ..convert.api import convert_model_with
from ..convert import converted_dtype as graph_dtype
from ..convert.decide import decide
from ..convert.options import ConversionOptions
from ..dtypes import DTYPE_CODES, FLOAT32, dtype_name, to_code
from ..errors import mxnet_logs_to_logging
from ..graph import (
    CAST_OPS,
    graph_json,
    infer_entry_shapes,
    infer_entry_types,
    internal_name,
    internal_outputs,
    passed_from,
    summarize,
    to_symbol,
)
from ..policy import (
    BEHAVIOUR,
    Cast,
    Category,
    list_conditional_fp32_ops,
    list_fp32_ops,
    list_lp16_ops,
)
from ..quantization.api import AMAX, FLOAT, MIN, named_apart
from ..registry import canonical_op_names
from .checkpoint import param_bytes, param_bytes_by_dtype


def converted_dtype(sym):
    """The low-precision dtype a converted symbol casts to, or None for a float32 model."""
    return graph_dtype(graph_json(sym))


def precisions(sym, arg_params, aux_params):
    """[(node name, op, dtype name of its first output)] for each operator
    node of a model, casts left out, as MXNet's type inference gives them."""
    known = {n: to_code(a.dtype) for n, a in {**arg_params, **aux_params}.items()}
    for name, attrs in sym.attr_dict().items():
        if "__dtype__" in attrs:
            known.setdefault(name, int(attrs["__dtype__"]))
    data = [n for n in sym.list_inputs() if n not in known]
    types = infer_entry_types(sym, {**known, **{n: FLOAT32 for n in data}})
    nodes = graph_json(sym)["nodes"]
    return [(node["name"], node["op"], dtype_name(types.get((nid, 0), -1)) or "unknown")
            for nid, node in enumerate(nodes) if node["op"] not in ("null",) + CAST_OPS]


def precision_counts(model):
    """{dtype name: number of operators} of a model (sym, arg_params, aux_params)."""
    counts = collections.Counter(p for _, _, p in precisions(*model))
    return dict(sorted(counts.items()))


def policy_options(dtype, fp32_ops=(), excluded=()):
    """ConversionOptions fields that add `fp32_ops` to the default
    float32 list (a given list replaces the default one, so the extra ops,
    and their aliases, are also taken out of the low-precision and
    conditional lists)."""
    if not fp32_ops:
        return {"excluded_sym_names": list(excluded)}
    canonical = canonical_op_names()
    extra = {canonical.get(op, op) for op in fp32_ops}

    def keep(op):
        return canonical.get(op, op) not in extra
    return {"fp32_ops": sorted(set(list_fp32_ops(dtype)) | set(fp32_ops)),
            "target_dtype_ops": [op for op in list_lp16_ops(dtype) if keep(op)],
            "conditional_fp32_ops": [c for c in list_conditional_fp32_ops(dtype) if keep(c[0])],
            "excluded_sym_names": list(excluded)}


def conversion_options(dtype, ctx=None, fp32_ops=(), excluded=(), cast_optional_params=False):
    """The options of the conversion inspected: `fp32_ops` added to the
    default float32 list (:func:`policy_options`)."""
    return ConversionOptions(target_dtype=dtype, ctx=ctx,
                             cast_optional_params=cast_optional_params,
                             **policy_options(dtype, fp32_ops, excluded))


def _reason(node, category, policy, fallbacks, user_fp32):
    name, op = node["name"], node["op"]
    if name in policy.excluded:
        return "excluded by name"
    if name in fallbacks:
        return fallbacks[name]
    if category is Category.FP32 and op in user_fp32:
        return "--fp32-op"
    return policy.reason(op, node.get("attrs", {}), category)


def reasons(sym, arg_params, aux_params, options, fp32_ops=()):
    """{node name: (Category, reason)} for each operator of a float32 model:
    what conversion with `options` (:func:`conversion_options`, which added
    `fp32_ops`) decides and why."""
    policy = options.policy
    params = {**arg_params, **aux_params}
    data_names = [n for n in sym.list_inputs() if n not in params]
    known = {**{n: to_code(a.dtype) for n, a in params.items()},
             **{n: FLOAT32 for n in data_names}}
    graph = graph_json(sym)
    decisions = decide(graph, policy, infer_entry_types(sym, known), data_names,
                       options.cast_optional_params, options.ctx)
    return {graph["nodes"][nid]["name"]: (category, _reason(
        graph["nodes"][nid], category, policy, decisions.fallbacks, set(fp32_ops)))
        for nid, category in decisions.categories.items()}


def float32_copy(sym, arg_params, aux_params):
    """The float32 model a converted one came from: casts removed (MXNet's
    own serializer drops amp_cast and amp_multicast) and parameters in float32."""
    plain = to_symbol(unconverted(sym))
    return (plain, *({k: v.astype("float32") if to_code(v.dtype) in DTYPE_CODES.values() else v
                      for k, v in params.items()} for params in (arg_params, aux_params)))


def source_names(graph):
    """{operator node name: the node its first input comes from}, looking
    through casts: what a node that "runs in its input's dtype" follows."""
    nodes = graph["nodes"]

    def source(entry):
        while nodes[entry[0]]["op"] in CAST_OPS:
            entry = passed_from(nodes, entry)
        return nodes[entry[0]]["name"]
    return {n["name"]: source(n["inputs"][0]) for n in nodes
            if n["op"] != "null" and n["op"] not in CAST_OPS and n["inputs"]}


def _multiply_adds(op, out, ins, attrs):
    """Multiply-adds of the ops that do more than one operation per output
    element (None for the others), from the output and input shapes."""
    if op == "Convolution":
        return math.prod(out) * math.prod(ins[1][1:])
    if op == "Deconvolution":  # each input element scatters over a kernel's outputs
        return math.prod(ins[0]) * math.prod(ins[1][1:])
    if op == "FullyConnected":
        return math.prod(out) * ins[1][1]
    if op in ("dot", "batch_dot"):
        transposed = attrs.get("transpose_a", "False") in ("True", "1", "true")
        return math.prod(out) * ins[0][-2 if transposed else -1]
    return None


def flops(sym, data_shapes):
    """{operator node name: floating-point operations} of a model on inputs
    of `data_shapes`: 2 per multiply-add for Convolution, Deconvolution,
    FullyConnected and matrix products, one per output element for every
    other operator (casts left out); 0 where MXNet cannot infer the shapes."""
    graph = graph_json(sym)
    shapes = infer_entry_shapes(graph, dict(data_shapes))
    counts = {}
    for nid, node in enumerate(graph["nodes"]):
        if node["op"] == "null" or node["op"] in CAST_OPS:
            continue
        out = shapes.get((nid, 0))
        ins = [shapes.get((e[0], e[1])) for e in node["inputs"]]
        if any(s is None or None in s for s in [out, *ins[:2]]):
            counts[node["name"]] = 0
            continue
        macs = _multiply_adds(node["op"], out, ins, node.get("attrs", {}))
        counts[node["name"]] = math.prod(out) if macs is None else 2 * macs
    return counts


def _outputs(model, entries, feeds, emulate):
    """The values of `entries` [(node name, internal output name)] of a
    model on `feeds`, as float32 (the cast also turns a oneDNN-internal
    layout into a plain array)."""
    outputs = internal_outputs(model[0], [e for _, e in entries])
    group = mx.sym.Group([mx.sym.amp_cast(out, dtype="float32") for out in outputs])
    return verify.run((group, *model[1:]), feeds, emulate)


LAYERS_PER_RUN = 48  # outputs kept alive at once when measuring every layer


def layer_errors(reference, converted, feeds, emulate):
    """{operator node name: relative error of its first output} of the
    `converted` model against its float32 `reference` (each (sym,
    arg_params, aux_params)) on `feeds`, for the operators both graphs have;
    with `emulate`, low-precision operators compute in float32 and round
    (:func:`mxamp.verify.run`). Runs a few dozen layers' outputs at a time."""
    converted_outputs = set(converted[0].get_internals().list_outputs())
    reference_outputs = set(reference[0].get_internals().list_outputs())
    names = [(n["name"], internal_name(reference_outputs, n["name"]))
             for n in graph_json(reference[0])["nodes"] if n["op"] != "null"]
    names = [(n, e) for n, e in names if e is not None and e in converted_outputs]
    plain = {n: a.astype("float32") for n, a in feeds.items()}
    errors = {}
    for start in range(0, len(names), LAYERS_PER_RUN):
        chunk = names[start:start + LAYERS_PER_RUN]
        pairs = zip(_outputs(converted, chunk, feeds, emulate),
                    _outputs(reference, chunk, plain, False))
        errors.update((name, verify.relative_error(got, want))
                      for (name, _), (got, want) in zip(chunk, pairs))
    return errors


def inspect_model(sym, arg_params, aux_params, dtype=None, ctx=None, fp32_ops=(),
                  excluded=(), cast_optional_params=False, data_shapes=None):
    """What conversion does to a model: per-operator precision and reason,
    cast counts and parameter memory, and the converted model
    (sym, arg_params, aux_params). A float32 model is converted with the
    given options first; for a converted model `dtype` is read off its casts,
    and reasons come from converting its float32 original with the options
    given here (the options it was converted with are not stored).

    With `data_shapes` ({data input: shape}), each operator also gets its
    FLOPs and the relative error of its output against float32 on a random
    input (emulated where this CPU has no kernel, as :func:`mxamp.verify.compare`)."""
    found = converted_dtype(sym)
    if found is not None and dtype is not None and dtype != found:
        raise ValueError(f"the model is already converted to {found}, not {dtype}")
    dtype = found or dtype or "bfloat16"
    options = conversion_options(dtype, ctx, fp32_ops, excluded, cast_optional_params)
    if found is None:
        original = (sym, arg_params, aux_params)
        with mxnet_logs_to_logging():  # as the drop-in entry points do
            converted = convert_model_with(sym, arg_params, aux_params, options)
    else:
        original, converted = float32_copy(sym, arg_params, aux_params), (sym, arg_params,
                                                                           aux_params)
    why = reasons(*original, options, fp32_ops)
    sources = source_names(graph_json(converted[0]))
    rows = []
    for name, op, precision in precisions(*converted):
        category, reason = why.get(name, (None, "not in the float32 graph"))
        cast = BEHAVIOUR[category].cast if category else Cast.NONE
        expected = {Cast.TARGET: dtype, Cast.FLOAT32: "float32"}.get(cast, precision)
        if found is not None and expected != precision:  # converted with other options
            reason += f"; the model runs it in {precision} (converted with other options)"
        rows.append({"name": name, "op": op, "precision": precision,
                     "category": category.value if category else "", "reason": reason,
                     "input_from": sources.get(name) if cast is Cast.NONE else None})
    if data_shapes:
        _measure(rows, original, converted, data_shapes)
    summary = {"dtype": dtype, "was_converted": found is not None, "operators": rows,
               "ops_by_precision": precision_counts(converted), "casts": summarize(converted[0]),
               "param_bytes": {"float32": param_bytes(*original[1:]),
                               "converted": param_bytes(*converted[1:])}}
    return summary, converted


def _measure(rows, original, converted, data_shapes):
    """Adds "flops" and "error" (None where not measured) to each operator
    row; low-precision operators this CPU has no kernel for are emulated."""
    counts = flops(converted[0], data_shapes)
    feeds = verify.feeds_for(converted[0], data_shapes)
    emulate = bool(verify.missing_kernels(converted, feeds))
    errors = layer_errors(original, converted, feeds, emulate)
    for row in rows:
        row["flops"], row["error"] = counts.get(row["name"], 0), errors.get(row["name"])


def _int8_marks(quantized_sym):
    """({node name: attributes} of the nodes inside the oneDNN backend's
    regions, {node name: what its region computes in outside INT8},
    {data input name: (min, threshold)}, the names of the operators outside
    the regions) of a quantized model."""
    graph = graph_json(quantized_sym)
    inner, rest, inputs = {}, {}, {}
    outside = {n["name"] for n in graph["nodes"] if n["op"] not in ("null", REGION_OP)}
    for node in graph["nodes"]:
        attrs = node.get("attrs", {})
        if node["op"] == "null" and AMAX in attrs:  # calibration's marks stay on data inputs
            inputs[node["name"]] = (float(attrs[MIN]), float(attrs[AMAX]))
        if node["op"] != REGION_OP:
            continue
        nodes = [n for n in node["subgraphs"][0]["nodes"] if n["op"] != "null"]
        inner.update((n["name"], n.get("attrs", {})) for n in nodes)
        rest.update((n["name"], attrs.get("rest_dtype", "float32")) for n in nodes)
    return inner, rest, inputs, outside


def int8_summary(reference, quantized, data_shapes):
    """What INT8 quantization did to a float32 model `reference` (sym,
    arg_params, aux_params), given the `quantized` model
    :func:`mxamp.quantization.quantize_model` made of it: per operator,
    whether it runs in an INT8 region ("int8") or not (excluded: what its
    region computes in outside INT8, "float32" or "bfloat16"; "float32"
    outside the regions), whether it was excluded from INT8 by the caller, its
    calibrated range (min, threshold) and the relative error of its output
    against float32 on a random input of `data_shapes`; the model's output
    errors; the data inputs' ranges.

    Per-layer errors come from the reference graph carrying the quantized
    model's calibration with every calibrated layer's output made a graph
    output, run on the backend in INT8: taking an output out of an INT8
    chain can stop a fusion there, so they approximate the quantized
    model's own layer values, and they are without bias correction (the
    channel means it needs are not kept in the model: docs/quantization.md,
    "Bias correction"), and None past MAX_INT8_LAYER_ERRORS operators;
    `output_errors` are the quantized model's."""
    inner, rest, inputs, outside = _int8_marks(quantized[0])
    reference = (named_apart(reference[0])[0].symbol, *reference[1:])  # as quantization names
    graph = graph_json(reference[0])
    rows, heads, precision = [], [], {}
    for nid, node in enumerate(graph["nodes"]):
        attrs = node.setdefault("attrs", {})
        if node["op"] == "null":
            if node["name"] in inputs:
                attrs[MIN], attrs[AMAX] = (repr(v) for v in inputs[node["name"]])
            continue
        marks = inner.get(node["name"], {})
        attrs.update({k: v for k, v in marks.items() if k in (AMAX, MIN, FLOAT)})
        calibrated = AMAX in marks
        if node["name"] not in inner and node["name"] not in outside:
            # Gone from the model: folded into the layer it reads (BatchNorm into INT8 weights).
            folded_into = graph["nodes"][node["inputs"][0][0]]["name"]
            precision[node["name"]] = precision.get(folded_into, "float32")
        else:
            precision[node["name"]] = "int8" if node["name"] in inner and FLOAT not in marks \
                else rest.get(node["name"], "float32")
        rows.append({"name": node["name"], "op": node["op"],
                     "precision": precision[node["name"]],
                     "excluded": FLOAT in marks,
                     "min": float(marks[MIN]) if calibrated else None,
                     "threshold": float(marks[AMAX]) if calibrated else None})
        heads.append([nid, 0, 0])
    graph["heads"] = heads
    feeds = verify.feeds_for(reference[0], data_shapes)
    if len(rows) <= MAX_INT8_LAYER_ERRORS:
        errors = _int8_layer_errors(graph, reference, rows, feeds,
                                    "bfloat16" if "bfloat16" in rest.values() else "float32")
    else:
        errors = [None] * len(rows)
    for row, error in zip(rows, errors):
        row["error"] = error
    outputs = zip(verify.run(quantized, feeds), verify.run(reference, feeds))
    return {"operators": rows, "output_errors": [verify.relative_error(a, b) for a, b in outputs],
            "input_ranges": {n: list(r) for n, r in inputs.items()}}


# Operators past which the INT8 summary leaves out per-layer errors: they
# come from one region with an output per layer, and MXNet 1.9.1 binds a
# region node in time that grows with the square of its outputs (21 s for
# 3,000).
MAX_INT8_LAYER_ERRORS = 1000


def _int8_layer_errors(graph, reference, rows, feeds, rest_dtype):
    """The relative error of each row's layer output (the heads of `graph`,
    the reference carrying the quantized model's calibration) run on the
    backend in INT8, against `reference` in float32."""
    probed = backends.get("onednn").apply_backend(to_symbol(graph), *reference[1:],
                                                  compute="int8", rest_dtype=rest_dtype)
    outputs = set(reference[0].get_internals().list_outputs())
    entries = [(r["name"], internal_name(outputs, r["name"])) for r in rows]
    return [verify.relative_error(got, want) for got, want in
            zip(verify.run(probed, feeds), _outputs(reference, entries, feeds, False))]


def packed_summary(sym, arg_params, aux_params, model_format):
    """What a model on the oneDNN backend or in MXNet's INT8 format runs:
    each backend region's compute dtype and operators, the operators
    outside the regions, and parameter memory (their precision is fixed by
    the format, not decided by a policy)."""
    regions, outside = [], collections.Counter()
    for node in graph_json(sym)["nodes"]:
        if node["op"] == REGION_OP:
            ops = collections.Counter(n["op"] for n in node["subgraphs"][0]["nodes"]
                                      if n["op"] != "null")
            regions.append({"name": node["name"],
                            "compute": node.get("attrs", {}).get("compute", "bfloat16"),
                            "operators": dict(sorted(ops.items()))})
        elif node["op"] != "null":
            outside[node["op"]] += 1
    return {"format": model_format, "regions": regions,
            "operators_outside_regions": dict(sorted(outside.items())),
            "param_bytes": param_bytes(arg_params, aux_params),
            "param_bytes_by_dtype": param_bytes_by_dtype(arg_params, aux_params)}
