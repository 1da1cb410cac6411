"""Validation of the user's options and their resolution, with the defaults,
into one per-call :class:`Policy`."""
from dataclasses import dataclass, field, replace

from ..dtypes import normalize_dtype
from ..errors import OptionError, OptionTypeError
from ..registry import check_op_names
from .categories import BEHAVIOUR, Category
from .defaults import (list_conditional_fp32_ops, list_fp32_ops, list_lp16_fp32_ops,
                       list_lp16_ops, list_widest_type_cast)
from .rules import _rules_by_op


def str_list(value, what):
    """A list of strings from a list/tuple/set, or TypeError naming `what`."""
    if not isinstance(value, (list, tuple, set, frozenset)) or \
            not all(isinstance(v, str) for v in value):
        raise OptionTypeError(f"{what} must be a list of str, got {value!r}")
    return list(value)


def _op_set(ops, what):
    """Canonical op names from a user list; ValueError for names MXNet does not know."""
    return frozenset(check_op_names(str_list(ops, what), what))


def _conditions(rules):
    """{op: {attr: frozenset(values)}} from (op, attr, [values]) records."""
    if not isinstance(rules, (list, tuple)):
        raise OptionTypeError(f"conditional_fp32_ops must be a list of (op, attribute, [values]) "
                        f"tuples, got {rules!r}")
    conditions = {}
    for rule in rules:
        if not (isinstance(rule, (list, tuple)) and len(rule) == 3
                and isinstance(rule[0], str) and isinstance(rule[1], str)
                and isinstance(rule[2], (list, tuple))
                and all(isinstance(v, str) for v in rule[2])):
            raise OptionTypeError(f"conditional_fp32_ops entries must be (op: str, attribute: str, "
                            f"values: list of str), got {rule!r}")
        (op,) = check_op_names([rule[0]], "conditional_fp32_ops")
        attrs = conditions.setdefault(op, {})
        attrs[rule[1]] = attrs.get(rule[1], frozenset()) | frozenset(rule[2])
    return conditions


def _reference_choices(target_dtype):
    """The op names mxnet.contrib.amp lets a user list name, spelled as its
    default low-precision, float32, neutral and conditional lists spell them
    (it compares names: its widest-type ops, the ops it omits and other
    spellings are refused)."""
    from mxnet.contrib.amp.lists import symbol_bf16, symbol_fp16
    module, low, neutral = ((symbol_fp16, "FP16_FUNCS", "FP16_FP32_FUNCS")
                            if target_dtype == "float16"
                            else (symbol_bf16, "BF16_FUNCS", "BF16_FP32_FUNCS"))
    return set(getattr(module, low) + getattr(module, neutral) + module.FP32_FUNCS
               + [rule[0] for rule in module.CONDITIONAL_FP32_FUNCS])


def _check_listed(target_dtype, user_lists):
    """Refuses, as mxnet.contrib.amp does (an AssertionError), a user list
    naming an op outside the lists of choice (a widest-type op in both)."""
    # mxamp's own lists of choice too, while they still differ from the reference's.
    allowed = _reference_choices(target_dtype) | set(
        list_lp16_ops(target_dtype) + list_fp32_ops(target_dtype)
        + list_lp16_fp32_ops(target_dtype)
        + [rule[0] for rule in list_conditional_fp32_ops(target_dtype)])
    for what, ops in user_lists.items():
        refused = sorted(set(ops or ()) - allowed)
        if refused:
            raise OptionError(
                f"{what} names {refused}, in none of mxnet.contrib.amp's or mxamp's "
                f"{target_dtype} lists a user list may choose from (list_lp16_ops, list_fp32_ops, "
                "list_lp16_fp32_ops, list_conditional_fp32_ops): widest-type ops "
                "(list_widest_type_cast) run in their widest input's dtype; use a Rule "
                "for other operators")


def _shapes(input_shapes):
    if input_shapes is None:
        return None
    if not isinstance(input_shapes, dict) or not all(
            isinstance(k, str) and isinstance(v, (tuple, list))
            and all(isinstance(d, int) for d in v) for k, v in input_shapes.items()):
        raise OptionTypeError(f"input_shapes must be a dict of input name to a tuple of ints, "
                        f"got {input_shapes!r}")
    return {k: tuple(v) for k, v in input_shapes.items()}


@dataclass(frozen=True)
class Policy:
    """Resolved per-call precision policy (canonical op names)."""
    target_dtype: str
    low: frozenset
    fp32: frozenset
    widest: frozenset
    conditions: dict
    excluded: frozenset
    keep_io_types: bool = True  # graph inputs and outputs stay float32
    follow: frozenset = frozenset()
    rules: dict = field(default_factory=dict)   # op -> rules, highest priority first
    input_shapes: dict = None                   # known input shapes, for rules

    def category(self, op, name, attrs, ruled=None):
        """The category of an operator node: an excluded name first, then a
        rule's result (`ruled`), then the lists in the reference's order."""
        if name in self.excluded:
            return Category.FP32
        if ruled is not None:
            return ruled
        if op in self.fp32:
            return Category.FP32
        if op in self.low:
            return Category.LOW
        if op in self.widest:
            return Category.WIDEST
        if op in self.follow:
            return Category.FOLLOW
        if self.matched(op, attrs):
            return Category.CONDITIONAL
        return Category.NEUTRAL

    def matched(self, op, attrs):
        """The (attribute, value) pairs of `attrs` that a conditional rule for `op` names."""
        return [(attr, attrs.get(attr)) for attr, values in self.conditions.get(op, {}).items()
                if attrs.get(attr) in values]

    def reason(self, op, attrs, category):
        """Why a node of `category` runs as it does, in the words of reports."""
        condition = ", ".join(f"{attr}={value}" for attr, value in self.matched(op, attrs))
        return BEHAVIOUR[category].reason.format(condition=condition)

    @property
    def listed_ops(self):
        """Every op a list names (other ops are NEUTRAL unless a rule or an
        excluded name says otherwise)."""
        return self.low | self.fp32 | self.widest | self.follow | frozenset(self.conditions)

    def with_fp32(self, ops):
        """This policy with `ops` in its float32 list and out of its
        low-precision one (the float32 list comes before the others)."""
        ops = frozenset(ops)
        return replace(self, low=self.low - ops, fp32=self.fp32 | ops)


def resolve(target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
            conditional_fp32_ops=None, excluded_sym_names=None, widest_dtype_ops=None,
            keep_io_types=True, follow_ops=None, rules=None, input_shapes=None):
    """Validates the user's options and merges them with the defaults.

    A given list replaces the default list of the same kind, as in
    ``mxnet.contrib.amp``; ``follow_ops`` (default empty) takes its ops out of
    the default lists, and may not overlap a list given explicitly.
    Precedence per node: excluded name, then ``rules``, then float32 list,
    target list, widest list, follow list, conditional rules.
    """
    target_dtype = normalize_dtype(target_dtype)
    follow = _op_set([] if follow_ops is None else follow_ops, "follow_ops")
    low = _op_set(list_lp16_ops(target_dtype) if target_dtype_ops is None else target_dtype_ops,
                  "target_dtype_ops")
    fp32 = _op_set(list_fp32_ops(target_dtype) if fp32_ops is None else fp32_ops, "fp32_ops")
    conditions = _conditions(list_conditional_fp32_ops(target_dtype)
                             if conditional_fp32_ops is None else conditional_fp32_ops)
    widest = _op_set(list_widest_type_cast(target_dtype) if widest_dtype_ops is None
                     else widest_dtype_ops, "widest_dtype_ops")
    _check_listed(target_dtype, {"target_dtype_ops": target_dtype_ops, "fp32_ops": fp32_ops,
                                 "conditional_fp32_ops": None if conditional_fp32_ops is None
                                 else [rule[0] for rule in conditional_fp32_ops]})
    # follow_ops overrides the defaults, not the lists the caller wrote.
    low = low - follow if target_dtype_ops is None else low
    fp32 = fp32 - follow if fp32_ops is None else fp32
    widest = widest - follow if widest_dtype_ops is None else widest
    if conditional_fp32_ops is None:
        conditions = {op: c for op, c in conditions.items() if op not in follow}
    overlaps = [("target_dtype_ops", "fp32_ops", low & fp32),
                ("target_dtype_ops", "conditional_fp32_ops", low & conditions.keys()),
                ("fp32_ops", "conditional_fp32_ops", fp32 & conditions.keys()),
                ("follow_ops", "target_dtype_ops", follow & low),
                ("follow_ops", "fp32_ops", follow & fp32),
                ("follow_ops", "widest_dtype_ops", follow & widest),
                ("follow_ops", "conditional_fp32_ops", follow & conditions.keys())]
    for first, second, common in overlaps:
        if common:
            raise OptionError(f"operators cannot be in both {first} and {second}: "
                             f"{sorted(common)}")
    excluded = frozenset(str_list([] if excluded_sym_names is None else excluded_sym_names,
                                   "excluded_sym_names"))
    if not isinstance(keep_io_types, bool):
        raise OptionTypeError(f"keep_io_types must be True or False, got {keep_io_types!r}")
    return Policy(target_dtype, low, fp32, widest, conditions, excluded, keep_io_types,
                  follow, _rules_by_op([] if rules is None else rules), _shapes(input_shapes))
