"""Checkpoint files and what a conversion did to a model, for the command
line and the zoo batch: loading and saving ``PREFIX-symbol.json`` /
``PREFIX-NNNN.params`` with clear errors, running a model against its float32
original, and the precision each operator runs in, with the reason."""
import collections
import json
import os

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from . import convert
from .convert import convert_model, load_symbol_json, summarize
from .decide import decide, infer_entry_types, infer_shapes
from .errors import mxnet_message
from .policy import (DTYPE_CODES, FLOAT32, Category, canonical_op_names, dtype_name,
                     list_conditional_fp32_ops, list_fp32_ops, list_lp16_ops, resolve, to_code,
                     to_numpy)
from .verify import (SELECTION_OPS, no_graph_fusion, relative_error, run_emulated,
                     selection_errors)

CAST_OPS = ("amp_cast", "amp_multicast")
LOW_DTYPES = ("float16", "bfloat16")


def checkpoint_files(prefix, epoch):
    return f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params"


def _read(path, mode):
    if not os.path.exists(path):
        raise ValueError(f"file not found: {path}")
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError as err:  # a directory, no permission, an I/O error
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None


def load_checkpoint(prefix, epoch=0):
    """(symbol, arg_params, aux_params) as ``mx.model.load_checkpoint`` gives
    them, with a ValueError naming the file for anything missing or malformed."""
    sym_file, params_file = checkpoint_files(prefix, epoch)
    sym = load_symbol_json(_read(sym_file, "r"), where=sym_file)
    _read(params_file, "rb")  # existence and readability, with the errors above
    try:
        saved = mx.nd.load(params_file)
    except MXNetError as err:
        raise ValueError(f"{params_file} is not an MXNet params file (truncated or "
                         f"corrupt?): {mxnet_message(err)}") from None
    saved = saved or {}  # MXNet loads an empty file as an empty list
    if isinstance(saved, list) or any(":" not in k for k in saved):
        raise ValueError(f"{params_file} has parameter names without 'arg:'/'aux:' prefixes; "
                         "save models with HybridBlock.export or mx.model.save_checkpoint")
    params = {"arg": {}, "aux": {}}
    for key, array in saved.items():
        kind, name = key.split(":", 1)
        if kind not in params:
            raise ValueError(f"{params_file} holds {key!r}: parameter names must start "
                             "with 'arg:' or 'aux:'")
        params[kind][name] = array
    return sym, params["arg"], params["aux"]


def check_inputs(sym, arg_params, aux_params, data_shapes, params_file="the params file"):
    """Checks that the parameters and the data shapes ({name: shape}) cover
    the symbol's inputs with shapes that fit it."""
    args, _, aux = infer_shapes(sym, data_shapes, "--shape")
    params = {**arg_params, **aux_params}
    missing = [n for n in sym.list_inputs() if n not in params and n not in data_shapes]
    if missing:
        raise ValueError(f"no parameter in {params_file} and no --shape for the inputs "
                         f"{missing}: give each data input's shape as --shape NAME:DIMS")
    needed = dict(zip(sym.list_arguments() + sym.list_auxiliary_states(), args + aux))
    for name, shape in needed.items():
        if name in params and shape and 0 not in shape and params[name].shape != shape:
            raise ValueError(f"parameter {name!r} has shape {params[name].shape} in "
                             f"{params_file} but the symbol needs {shape}")


def save_checkpoint(prefix, sym, arg_params, aux_params, epoch=0):
    """Writes the pair ``mx.model.load_checkpoint`` reads, keeping amp_cast
    nodes (MXNet's default save drops them); returns the two paths."""
    paths = checkpoint_files(prefix, epoch)
    sym.save(paths[0], remove_amp_cast=False)
    mx.nd.save(paths[1], {**{f"arg:{k}": v for k, v in arg_params.items()},
                          **{f"aux:{k}": v for k, v in aux_params.items()}})
    return paths


def feeds_for(sym, data_shapes, seed=0):
    """Random inputs in [0, 1) for the data inputs, in the dtype each is
    declared in (float32 unless the converted graph reads it in low precision)."""
    attrs = sym.attr_dict()
    rng = np.random.RandomState(seed)
    feeds = {}
    for name, shape in data_shapes.items():
        array = mx.nd.array(rng.uniform(size=shape), dtype="float32")
        code = int(attrs.get(name, {}).get("__dtype__", FLOAT32))
        feeds[name] = array if code == FLOAT32 else mx.nd.amp_cast(array, dtype=to_numpy(code))
    return feeds


def run(model, feeds, emulate=False):
    """Outputs of a model (sym, arg_params, aux_params) on `feeds` on this
    CPU, without MXNet's graph fusion; with `emulate`, low-precision ops
    compute in float32 and round their outputs
    (:func:`mxamp.verify.run_emulated`), for graphs built for another device."""
    if emulate:
        return run_emulated(*model, feeds)
    sym, arg_params, aux_params = model
    args = {**arg_params, **feeds}
    # Unfused, as emulated runs are, so a float32 reference and a converted
    # model run the same way: MXNet's oneDNN fusion alone moves some float32
    # outputs (cifar_resnet20_v2's by 60%), which would count as conversion error.
    with no_graph_fusion():
        exe = sym.bind(mx.cpu(), {n: args[n] for n in sym.list_arguments()},
                       aux_states={n: aux_params[n] for n in sym.list_auxiliary_states()},
                       grad_req="null")
        return exe.forward(is_train=False)


def compare(reference, converted, feeds, emulate=False):
    """Runs the float32 `reference` and the `converted` model (each
    (sym, arg_params, aux_params)) on `feeds` (see :func:`run`): per-output
    relative error, whether all outputs are finite, and the error on the
    tensors fed into NMS, a discrete selection (empty when the graph has
    none; computed with low-precision ops emulated)."""
    refs = run(reference, {n: a.astype("float32") for n, a in feeds.items()})
    outs = run(converted, feeds, emulate)
    return {"errors": [relative_error(o, r) for o, r in zip(outs, refs)],
            "finite": all(bool(np.isfinite(o.astype("float32").asnumpy()).all()) for o in outs),
            "pre_nms": selection_errors(reference, converted, feeds)}


def after_selection(sym):
    """Names of the operator nodes that read, directly or not, the output of
    a selection op (NMS): their values depend on which boxes it kept."""
    nodes = graph_json(sym)["nodes"]
    tainted = set()
    for nid, node in enumerate(nodes):
        if any(nodes[e[0]]["op"] in SELECTION_OPS or e[0] in tainted for e in node["inputs"]):
            tainted.add(nid)
    return {nodes[nid]["name"] for nid in tainted}


def param_bytes(*param_dicts):
    return sum(a.size * np.dtype(a.dtype).itemsize for d in param_dicts for a in d.values())


def graph_json(sym):
    """A symbol's graph in MXNet's JSON form, casts included."""
    return json.loads(sym.tojson(remove_amp_cast=False))


def converted_dtype(sym):
    """The low-precision dtype a converted symbol casts to, or None for a float32 model."""
    return convert.converted_dtype(graph_json(sym))


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
    if category is Category.FP32:
        return "--fp32-op" if op in user_fp32 else "float32 list"
    if category is Category.CONDITIONAL:
        attrs = node.get("attrs", {})
        matched = [f"{a}={attrs.get(a)}" for a, values in policy.conditions.get(op, {}).items()
                   if attrs.get(a) in values]
        return "condition " + ", ".join(matched)
    return {Category.LOW: "low-precision list", Category.WIDEST: "widest input dtype",
            Category.NEUTRAL: "runs in its input's dtype",
            Category.FOLLOW: "low precision if its inputs are"}[category]


def reasons(sym, arg_params, aux_params, dtype, ctx=None, fp32_ops=(), excluded=(),
            cast_optional_params=False):
    """{node name: (category, reason)} for each operator of a float32 model:
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
    return {graph["nodes"][nid]["name"]: (category.value, _reason(
        graph["nodes"][nid], category, policy, decisions.fallbacks, set(fp32_ops)))
        for nid, category in decisions.categories.items()}


def float32_copy(sym, arg_params, aux_params):
    """The float32 model a converted one came from: casts removed (MXNet's
    own serializer drops amp_cast and amp_multicast) and parameters in float32."""
    plain = mx.sym.load_json(json.dumps(convert.unconverted(sym)))
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
        category, reason = why.get(name, ("", "not in the float32 graph"))
        expected = {Category.LOW.value: dtype, Category.FP32.value: "float32",
                    Category.CONDITIONAL.value: "float32"}.get(category, precision)
        if found is not None and expected != precision:  # converted with other options
            reason += f"; the model runs it in {precision} (converted with other options)"
        rows.append({"name": name, "op": op, "precision": precision, "category": category,
                     "reason": reason})
    summary = {"dtype": dtype, "was_converted": found is not None, "operators": rows,
               "ops_by_precision": precision_counts(converted), "casts": summarize(converted[0]),
               "param_bytes": {"float32": param_bytes(*original[1:]),
                               "converted": param_bytes(*converted[1:])}}
    return summary, converted
