"""The default operator lists per target dtype and the ``list_*`` accessors
of ``mxnet.contrib.amp``: the reference's placement of every operator its
lists name, mxamp's own categories (data in ``lists/``) for the rest."""
import functools

from ..dtypes import normalize_dtype
from ..registry import canonical_op_names
from .lists import symbol_bf16, symbol_fp16


# Per target dtype: the list module and the names of its category lists.
_LISTS = {
    "float16": (symbol_fp16, "FP16_FUNCS", "FP16_FP32_FUNCS"),
    "bfloat16": (symbol_bf16, "BF16_FUNCS", "BF16_FP32_FUNCS"),
}


def _lists(target_dtype):
    module, low, neutral = _LISTS[normalize_dtype(target_dtype)]
    return module, low, neutral


def _category_lists(module, low, neutral):
    """{list name: ops} of a list module (conditional rules by their op)."""
    lists = {name: getattr(module, name) for name in
             (low, neutral, "FP32_FUNCS", "WIDEST_TYPE_CASTS")}
    lists["CONDITIONAL_FP32_FUNCS"] = [rule[0] for rule in module.CONDITIONAL_FP32_FUNCS]
    return lists


# Deliberate differences from the reference's placement, by target dtype and
# canonical op: mxamp's own category (lists/) stands, for the reason measured.
OWN_PLACEMENT = {
    "bfloat16": {
        # The reference: float32. Between a bfloat16 Pooling and FullyConnected a
        # float32 Flatten splits the oneDNN backend's region in two
        # (tests/backends/test_onednn_backend.py, test_converted_model_runs_as_one_region).
        "Flatten": "neutral: a float32 Flatten splits the oneDNN backend's region",
    },
}


@functools.lru_cache(maxsize=None)
def _placed(target_dtype):
    """The default lists: mxnet.contrib.amp's placement of every operator its
    lists name (an alias follows its operator: the reference's category of
    the operator's own name, else of its first listed alias), mxamp's own
    category (lists/) for the operators it omits. {list name: sorted ops},
    and the conditional rules."""
    from mxnet.contrib.amp import lists as reference
    module, low, neutral = _lists(target_dtype)
    ref_module = getattr(reference, module.__name__.rsplit(".", 1)[1])
    canon = canonical_op_names()
    ref_of = {}  # canonical op -> the reference's list for it
    for name, ops in sorted(_category_lists(ref_module, low, neutral).items()):
        for op in sorted(o for o in ops if o in canon):
            if op == canon[op] or canon[op] not in ref_of:
                ref_of[canon[op]] = name
    placed = {name: [] for name in _category_lists(module, low, neutral)}
    for name, ops in _category_lists(module, low, neutral).items():
        for op in ops:
            own = canon.get(op, op) in OWN_PLACEMENT.get(target_dtype, {})
            placed[name if own else ref_of.get(canon.get(op, op), name)].append(op)
    # A conditional op (and its aliases) keeps the reference's rule where it has one.
    rules = {canon[rule[0]]: rule for rule in module.CONDITIONAL_FP32_FUNCS}
    rules.update((canon[rule[0]], rule) for rule in ref_module.CONDITIONAL_FP32_FUNCS
                 if rule[0] in canon)
    conditional = [(op, *rules[canon[op]][1:])
                   for op in sorted(placed.pop("CONDITIONAL_FP32_FUNCS"))]
    return {name: sorted(ops) for name, ops in placed.items()}, conditional


def list_lp16_ops(target_dtype):
    """Default ops that run in the target (low precision) dtype."""
    _, low, _ = _lists(target_dtype)
    return list(_placed(normalize_dtype(target_dtype))[0][low])


def list_fp32_ops(target_dtype):
    """Default ops that always run in float32."""
    return list(_placed(normalize_dtype(target_dtype))[0]["FP32_FUNCS"])


def list_lp16_fp32_ops(target_dtype):
    """Default ops that run in whichever float dtype they receive."""
    _, _, neutral = _lists(target_dtype)
    return list(_placed(normalize_dtype(target_dtype))[0][neutral])


def list_conditional_fp32_ops(target_dtype):
    """Default (op, attribute, values) rules that switch an op to float32."""
    return list(_placed(normalize_dtype(target_dtype))[1])


def list_widest_type_cast(target_dtype):
    """Default ops that run in the widest float dtype among their inputs."""
    return list(_placed(normalize_dtype(target_dtype))[0]["WIDEST_TYPE_CASTS"])


def list_loss_output_functions(target_dtype):
    """Loss output ops (informational; they are float32 ops)."""
    return list(_lists(target_dtype)[0].LOSS_OUTPUT_FUNCTIONS)


def list_lp16_use_fp32_params(target_dtype):
    """{op: input names kept in float32} for AMP training, as the reference
    gives it: None for float16."""
    module = _lists(target_dtype)[0]
    params = getattr(module, "BF16_USE_FP32_PARAMS", None)
    return None if params is None else {op: list(names) for op, names in params.items()}


# Spellings from MXNet releases before 1.9.
list_fp16_ops = list_lp16_ops


list_fp16_fp32_ops = list_lp16_fp32_ops
