"""What a conversion did to a model: the precision each operator runs in,
with the reason, cast counts and parameter memory."""
import collections

from ..convert import convert_model, converted_dtype as graph_dtype, unconverted
from ..convert.decide import decide
from ..dtypes import DTYPE_CODES, FLOAT32, dtype_name, to_code
from ..graph import CAST_OPS, graph_json, infer_entry_types, summarize, to_symbol
from ..policy import (BEHAVIOUR, Cast, Category, list_conditional_fp32_ops, list_fp32_ops,
                      list_lp16_ops, resolve)
from ..registry import canonical_op_names
from .checkpoint import param_bytes


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
    """convert_model keyword arguments that add `fp32_ops` to the default
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


def _reason(node, category, policy, fallbacks, user_fp32):
    name, op = node["name"], node["op"]
    if name in policy.excluded:
        return "excluded by name"
    if name in fallbacks:
        return fallbacks[name]
    if category is Category.FP32 and op in user_fp32:
        return "--fp32-op"
    return policy.reason(op, node.get("attrs", {}), category)


def reasons(sym, arg_params, aux_params, dtype, ctx=None, fp32_ops=(), excluded=(),
            cast_optional_params=False):
    """{node name: (Category, reason)} for each operator of a float32 model:
    what conversion with these options decides and why."""
    options = policy_options(dtype, fp32_ops, excluded)
    policy = resolve(dtype, options.get("target_dtype_ops"), options.get("fp32_ops"),
                     options.get("conditional_fp32_ops"), options["excluded_sym_names"])
    params = {**arg_params, **aux_params}
    data_names = [n for n in sym.list_inputs() if n not in params]
    known = {**{n: to_code(a.dtype) for n, a in params.items()},
             **{n: FLOAT32 for n in data_names}}
    graph = graph_json(sym)
    decisions = decide(graph, policy, infer_entry_types(sym, known), data_names,
                       cast_optional_params, ctx)
    return {graph["nodes"][nid]["name"]: (category, _reason(
        graph["nodes"][nid], category, policy, decisions.fallbacks, set(fp32_ops)))
        for nid, category in decisions.categories.items()}


def float32_copy(sym, arg_params, aux_params):
    """The float32 model a converted one came from: casts removed (MXNet's
    own serializer drops amp_cast and amp_multicast) and parameters in float32."""
    plain = to_symbol(unconverted(sym))
    return (plain, *({k: v.astype("float32") if to_code(v.dtype) in DTYPE_CODES.values() else v
                      for k, v in params.items()} for params in (arg_params, aux_params)))


def inspect_model(sym, arg_params, aux_params, dtype=None, ctx=None, fp32_ops=(),
                  excluded=(), cast_optional_params=False):
    """What conversion does to a model: per-operator precision and reason,
    cast counts and parameter memory, and the converted model
    (sym, arg_params, aux_params). A float32 model is converted with the
    given options first; for a converted model `dtype` is read off its casts,
    and reasons come from converting its float32 original with the options
    given here (the options it was converted with are not stored)."""
    found = converted_dtype(sym)
    if found is not None and dtype is not None and dtype != found:
        raise ValueError(f"the model is already converted to {found}, not {dtype}")
    if found is None:
        original = (sym, arg_params, aux_params)
        dtype = dtype or "bfloat16"
        converted = convert_model(sym, arg_params, aux_params, target_dtype=dtype, ctx=ctx,
                                  cast_optional_params=cast_optional_params,
                                  **policy_options(dtype, fp32_ops, excluded))
    else:
        dtype = found
        original, converted = float32_copy(sym, arg_params, aux_params), (sym, arg_params,
                                                                           aux_params)
    why = reasons(*original, dtype, ctx, fp32_ops, excluded, cast_optional_params)
    rows = []
    for name, op, precision in precisions(*converted):
        category, reason = why.get(name, (None, "not in the float32 graph"))
        cast = BEHAVIOUR[category].cast if category else Cast.NONE
        expected = {Cast.TARGET: dtype, Cast.FLOAT32: "float32"}.get(cast, precision)
        if found is not None and expected != precision:  # converted with other options
            reason += f"; the model runs it in {precision} (converted with other options)"
        rows.append({"name": name, "op": op, "precision": precision,
                     "category": category.value if category else "", "reason": reason})
    summary = {"dtype": dtype, "was_converted": found is not None, "operators": rows,
               "ops_by_precision": precision_counts(converted), "casts": summarize(converted[0]),
               "param_bytes": {"float32": param_bytes(*original[1:]),
                               "converted": param_bytes(*converted[1:])}}
    return summary, converted
