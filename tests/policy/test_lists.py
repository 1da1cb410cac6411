"""The default lists: complete, disjoint, alias-consistent, and reachable through
the list_* accessors under both spellings."""
import mxnet as mx
import numpy as np
import pytest

import mxamp
from mxamp.policy.defaults import OWN_PLACEMENT
from mxamp.policy.lists import symbol_bf16, symbol_fp16
from mxamp.dtypes import to_numpy
from mxamp.registry import canonical_op_names

MODULES = {"float16": (symbol_fp16, "FP16_FUNCS", "FP16_FP32_FUNCS"),
           "bfloat16": (symbol_bf16, "BF16_FUNCS", "BF16_FP32_FUNCS")}


def categories(dtype):
    """{list name: ops} of mxamp's own list module (policy/lists/)."""
    module, low, neutral = MODULES[dtype]
    return {low: getattr(module, low), neutral: getattr(module, neutral),
            "FP32_FUNCS": module.FP32_FUNCS, "WIDEST_TYPE_CASTS": module.WIDEST_TYPE_CASTS,
            "CONDITIONAL_FP32_FUNCS": [rule[0] for rule in module.CONDITIONAL_FP32_FUNCS]}


def default_lists(dtype):
    """{list name: ops} of the accessors' default lists."""
    module, low, neutral = MODULES[dtype]
    return {low: mxamp.list_lp16_ops(dtype), neutral: mxamp.list_lp16_fp32_ops(dtype),
            "FP32_FUNCS": mxamp.list_fp32_ops(dtype),
            "WIDEST_TYPE_CASTS": mxamp.list_widest_type_cast(dtype),
            "CONDITIONAL_FP32_FUNCS": [r[0] for r in mxamp.list_conditional_fp32_ops(dtype)]}


def default_categories(dtype):
    """{op: category list name} of the accessors' default lists."""
    return {op: name for name, ops in default_lists(dtype).items() for op in ops}


def reference_categories(dtype):
    """{op: list name} of the installed mxnet.contrib.amp's lists, for the
    operators MXNet 1.9.1 registers."""
    from mxnet.contrib.amp import lists as reference
    module, low, neutral = MODULES[dtype]
    ref_module = getattr(reference, module.__name__.rsplit(".", 1)[1])
    canon = canonical_op_names()
    ref = {op: name for name in (low, neutral, "FP32_FUNCS", "WIDEST_TYPE_CASTS")
           for op in getattr(ref_module, name) if op in canon}
    ref.update((r[0], "CONDITIONAL_FP32_FUNCS") for r in ref_module.CONDITIONAL_FP32_FUNCS
               if r[0] in canon)
    return ref


def test_every_registered_operator_is_in_exactly_one_list(dtype):
    # mxamp's own backend operators exist once a test loaded the backend
    registered = {op for op in mx.operator.get_all_registered_operators()
                  if not op.startswith(("_backward", "_mxamp_"))}
    seen = {}
    duplicated = []
    for list_name, ops in default_lists(dtype).items():
        for op in ops:
            if op in seen:
                duplicated.append((op, seen[op], list_name))
            seen[op] = list_name
    assert duplicated == []
    assert sorted(registered - seen.keys()) == []
    assert sorted(seen.keys() - registered) == []


def test_aliases_share_their_operators_category(dtype):
    seen = default_categories(dtype)
    by_op = {}
    for alias, op in canonical_op_names().items():
        if not alias.startswith("_mxamp_"):  # mxamp's own backend operators
            by_op.setdefault(op, set()).add(seen[alias])
    assert {op: cats for op, cats in by_op.items() if len(cats) > 1} == {}


def test_conditional_rules_are_well_formed(dtype):
    canon = canonical_op_names()
    for op, attr, values in mxamp.list_conditional_fp32_ops(dtype):
        assert isinstance(attr, str) and values and all(isinstance(v, str) for v in values)
        # the attribute and its values are real: MXNet builds the op with each
        for value in values:
            getattr(mx.sym, canon[op])(mx.sym.var("x"), **{attr: value})


def test_own_lists_hold_only_what_mxamp_decides(dtype):
    """policy/lists/ names an operator only where its entry takes effect:
    the reference's lists name neither it nor another alias of its operator,
    or it is a deliberate difference (OWN_PLACEMENT, each with its reason),
    every alias of which is there. Its loss heads are those the reference's
    omit."""
    from mxnet.contrib.amp import lists as reference
    canon = canonical_op_names()
    named = {canon[op] for op in reference_categories(dtype)}
    differences = OWN_PLACEMENT.get(dtype, {})
    own = {op for ops in categories(dtype).values() for op in ops}
    shadowed = sorted(op for op in own if canon[op] in named and canon[op] not in differences)
    assert shadowed == []
    assert all(reason for reason in differences.values())  # each says why
    assert sorted(alias for alias, op in canon.items()
                  if op in differences and alias not in own) == []
    module = MODULES[dtype][0]
    ref_module = getattr(reference, module.__name__.rsplit(".", 1)[1])
    assert set(module.LOSS_OUTPUT_FUNCTIONS) & set(ref_module.LOSS_OUTPUT_FUNCTIONS) == set()


def test_default_lists_place_operators_as_the_reference(dtype):
    """Every operator mxnet.contrib.amp's lists name (and MXNet 1.9.1 knows)
    is where the reference puts it, an alias where the reference puts its
    operator's own name (else its first listed alias); conditional rules are
    the reference's; the operators it omits take mxamp's category
    (policy/lists/), and so do the deliberate differences (OWN_PLACEMENT)."""
    from mxnet.contrib.amp import lists as reference
    module, low, neutral = MODULES[dtype]
    ref_module = getattr(reference, module.__name__.rsplit(".", 1)[1])
    canon = canonical_op_names()
    ref = reference_categories(dtype)
    by_op = {}
    for alias in sorted(ref):
        if alias == canon[alias] or canon[alias] not in by_op:
            by_op[canon[alias]] = ref[alias]
    own = {op: name for name, ops in categories(dtype).items() for op in ops}
    differences = OWN_PLACEMENT.get(dtype, {})
    for op, name in default_categories(dtype).items():
        expected = own[op] if canon[op] in differences or canon[op] not in by_op \
            else by_op[canon[op]]
        assert name == expected, op
    rules = {r[0]: r for r in ref_module.CONDITIONAL_FP32_FUNCS}
    assert [r for r in mxamp.list_conditional_fp32_ops(dtype) if r[0] in rules] == \
        list(ref_module.CONDITIONAL_FP32_FUNCS)
    # sqrt is dtype-neutral, as in the reference
    assert default_categories(dtype)["sqrt"] == neutral


def test_accessors_return_the_default_lists(dtype):
    module, low, neutral = MODULES[dtype]
    assert mxamp.list_lp16_ops(dtype) == mxamp.list_fp16_ops(dtype)
    assert mxamp.list_lp16_fp32_ops(dtype) == mxamp.list_fp16_fp32_ops(dtype)
    assert set(mxamp.list_lp16_ops(dtype)) == {op for op, name in
                                                default_categories(dtype).items() if name == low}
    from mxnet.contrib.amp import lists as reference
    ref_module = getattr(reference, module.__name__.rsplit(".", 1)[1])
    assert set(mxamp.list_loss_output_functions(dtype)) == \
        set(ref_module.LOSS_OUTPUT_FUNCTIONS) | set(module.LOSS_OUTPUT_FUNCTIONS)
    mxamp.list_lp16_ops(dtype).append("changed")  # accessors hand out copies
    assert "changed" not in mxamp.list_lp16_ops(dtype)


def test_accessors_reject_other_dtypes():
    with pytest.raises(ValueError, match="target_dtype 'float64' is not supported"):
        mxamp.list_lp16_ops("float64")


def test_numpy_dtype_spellings_are_accepted():
    import numpy as np
    assert mxamp.list_lp16_ops(np.float16) == mxamp.list_lp16_ops("float16")


@pytest.mark.parametrize("spelling, name", [
    ("float16", "float16"), (np.float16, "float16"), (np.dtype("float16"), "float16"),
    ("bfloat16", "bfloat16"), (to_numpy(12), "bfloat16")])  # MXNet's numpy bfloat16
def test_target_dtype_spellings(spelling, name):
    assert mxamp.dtypes.normalize_dtype(spelling) == name
    assert mxamp.list_lp16_ops(spelling) == mxamp.list_lp16_ops(name)


@pytest.mark.parametrize("spelling", ["float32", np.int8, "bf16", object()])
def test_other_target_dtypes_are_refused(spelling):
    with pytest.raises(ValueError, match="is not supported; allowed: float16, bfloat16"):
        mxamp.dtypes.normalize_dtype(spelling)
