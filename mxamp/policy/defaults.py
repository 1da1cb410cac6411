"""The default operator lists per target dtype and the ``list_*`` accessors
of ``mxnet.contrib.amp``: the installed reference's placement of every
operator its lists name, mxamp's own categories (data in ``lists/``) for the
rest and for the deliberate differences (``OWN_PLACEMENT``). ``lists/`` holds
nothing else: an entry the reference's placement would override fails
tests/policy/test_lists.py."""
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


def _reference(target_dtype):
    """mxnet.contrib.amp's list module for `target_dtype`."""
    from mxnet.contrib.amp import lists as reference
    return getattr(reference, _lists(target_dtype)[0].__name__.rsplit(".", 1)[1])


@functools.lru_cache(maxsize=None)
def _placed(target_dtype):
    """The default lists: every registered operator the installed
    mxnet.contrib.amp's lists name where they put it (an alias follows its
    operator: the reference's category of the operator's own name, else of
    its first listed alias), mxamp's own category (lists/) for the operators
    they omit and for OWN_PLACEMENT's. {list name: sorted ops}, and the
    conditional rules."""
    module, low, neutral = _lists(target_dtype)
    ref_module = _reference(target_dtype)
    canon = canonical_op_names()
    ref_of = {}  # canonical op -> the reference's list for it
    for name, ops in sorted(_category_lists(ref_module, low, neutral).items()):
        for op in sorted(o for o in ops if o in canon):
            if op == canon[op] or canon[op] not in ref_of:
                ref_of[canon[op]] = name
    own = {op: name for name, ops in _category_lists(module, low, neutral).items()
           for op in ops}
    differences = OWN_PLACEMENT.get(target_dtype, {})
    placed = {name: [] for name in _category_lists(module, low, neutral)}
    for op, real in sorted(canon.items()):
        name = own.get(op) if real in differences or real not in ref_of else ref_of[real]
        if name is not None:  # else in no list (another library's operator)
            placed[name].append(op)
    # A conditional op (and its aliases) keeps the reference's rule where it has one.
    rules = {canon[rule[0]]: rule for rule in module.CONDITIONAL_FP32_FUNCS}
    rules.update((canon[rule[0]], rule) for rule in ref_module.CONDITIONAL_FP32_FUNCS
                 if rule[0] in canon)
    conditional = [(op, *rules[canon[op]][1:])
                   for op in sorted(placed.pop("CONDITIONAL_FP32_FUNCS"))]
    return {name: ops for name, ops in placed.items()}, conditional


def list_lp16_ops(target_dtype):
    """Default operators that run in the target (low-precision) dtype.

    Parameters
    ----------
    target_dtype : str
        The dtype the list is for: ``"float16"`` or ``"bfloat16"`` (or a short
        name).

    Returns
    -------
    list of str
    """
    _, low, _ = _lists(target_dtype)
    return list(_placed(normalize_dtype(target_dtype))[0][low])


def list_fp32_ops(target_dtype):
    """Default operators that always run in float32.

    Parameters
    ----------
    target_dtype : str
        The dtype the float32 list is for: ``"float16"`` or ``"bfloat16"`` (or a short
        name).

    Returns
    -------
    list of str
    """
    return list(_placed(normalize_dtype(target_dtype))[0]["FP32_FUNCS"])


def list_lp16_fp32_ops(target_dtype):
    """Default operators that run in whichever float dtype they receive.

    Parameters
    ----------
    target_dtype : str
        The dtype the dtype-neutral list is for: ``"float16"`` or ``"bfloat16"`` (or a short
        name).

    Returns
    -------
    list of str
    """
    _, _, neutral = _lists(target_dtype)
    return list(_placed(normalize_dtype(target_dtype))[0][neutral])


def list_conditional_fp32_ops(target_dtype):
    """Default rules that switch an operator to float32 by an attribute.

    Parameters
    ----------
    target_dtype : str
        The dtype the rules' list is for: ``"float16"`` or ``"bfloat16"`` (or a short
        name).

    Returns
    -------
    list of tuple
        ``(op, attribute, [values])`` records: `op` runs in float32 where
        `attribute` has one of the values.
    """
    return list(_placed(normalize_dtype(target_dtype))[1])


def list_widest_type_cast(target_dtype):
    """Default operators that run in the widest float dtype among their inputs.

    Parameters
    ----------
    target_dtype : str
        The dtype the widest-type list is for: ``"float16"`` or ``"bfloat16"`` (or a short
        name).

    Returns
    -------
    list of str
    """
    return list(_placed(normalize_dtype(target_dtype))[0]["WIDEST_TYPE_CASTS"])


def list_loss_output_functions(target_dtype):
    """Loss output operators (for information: they are float32 operators).

    Parameters
    ----------
    target_dtype : str
        The dtype the loss outputs' list is for: ``"float16"`` or ``"bfloat16"`` (or a short
        name).

    Returns
    -------
    list of str
        The reference's list, then the operators mxamp adds.
    """
    ref = list(_reference(target_dtype).LOSS_OUTPUT_FUNCTIONS)
    return ref + [op for op in _lists(target_dtype)[0].LOSS_OUTPUT_FUNCTIONS if op not in ref]


def list_lp16_use_fp32_params(target_dtype):
    """Operator inputs that AMP training keeps in float32.

    Parameters
    ----------
    target_dtype : str
        The dtype the training list is for: ``"float16"`` or ``"bfloat16"`` (or a short
        name).

    Returns
    -------
    dict or None
        ``{op: [input names]}`` as the reference gives it (for the operators
        MXNet 1.9.1 registers); None for float16, for which the reference has
        no such list.
    """
    params = getattr(_reference(target_dtype), "BF16_USE_FP32_PARAMS", None)
    if params is None:
        return None
    canon = canonical_op_names()
    return {op: list(names) for op, names in params.items() if op in canon}


def _named(target_dtype):
    """{name in mxnet.contrib.amp.lists' module: accessor} for `target_dtype`."""
    _, low, neutral = _lists(target_dtype)
    named = {low: list_lp16_ops, neutral: list_lp16_fp32_ops, "FP32_FUNCS": list_fp32_ops,
             "CONDITIONAL_FP32_FUNCS": list_conditional_fp32_ops,
             "WIDEST_TYPE_CASTS": list_widest_type_cast,
             "LOSS_OUTPUT_FUNCTIONS": list_loss_output_functions}
    if list_lp16_use_fp32_params(target_dtype) is not None:
        named[f"{low.split('_')[0]}_USE_FP32_PARAMS"] = list_lp16_use_fp32_params
    return named


def list_names(target_dtype):
    """The names of the lists the reference's list module for `target_dtype` has."""
    return sorted(_named(target_dtype))


def named_list(target_dtype, name):
    """The default list the reference's list module calls `name`."""
    accessor = _named(target_dtype).get(name)
    if accessor is None:
        raise AttributeError(f"the {target_dtype} lists have no {name!r}; they have "
                             f"{list_names(target_dtype)}")
    return accessor(target_dtype)


# Spellings from MXNet releases before 1.9.
list_fp16_ops = list_lp16_ops


list_fp16_fp32_ops = list_lp16_fp32_ops
