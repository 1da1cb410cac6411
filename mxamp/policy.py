"""Precision policy: the default op lists, their accessors, and validation of
user overrides into one resolved, per-call :class:`Policy`."""
import enum
import types
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP, _DTYPE_NP_TO_MX

from .lists import symbol_bf16, symbol_fp16
from .registry import canonical_op_names

TARGET_DTYPES = ("float16", "bfloat16")
# MXNet's integer dtype codes for the float types AMP casts between.
FLOAT32 = 0
DTYPE_CODES = {"float32": FLOAT32, "float16": 2, "bfloat16": 12}
CASTABLE = frozenset(DTYPE_CODES.values())


def to_code(np_type):
    """MXNet's integer dtype code for a numpy type (-1 when unknown)."""
    return _DTYPE_NP_TO_MX.get(np_type, -1) if np_type is not None else -1


def to_numpy(code):
    return _DTYPE_MX_TO_NP[code]


def dtype_name(code):
    """'float32', 'bfloat16', 'int32'… for an MXNet dtype code; None when unknown."""
    names = {c: n for n, c in DTYPE_CODES.items()}
    if code in names:
        return names[code]
    return np.dtype(to_numpy(code)).name if code >= 0 and code in _DTYPE_MX_TO_NP else None


class OptionError(ValueError, AssertionError):
    """An invalid option value. Also an AssertionError: mxnet.contrib.amp checks
    its options with assert, and code written for it catches that."""


class OptionTypeError(TypeError, AssertionError):
    """An option of the wrong type (an AssertionError too, as OptionError)."""


class Category(enum.Enum):
    """What a node does with the dtype of its float inputs."""
    LOW = "low precision"      # cast float inputs to the target dtype
    FP32 = "float32"           # cast float inputs to float32
    WIDEST = "widest"          # run in the widest float dtype among the inputs
    CONDITIONAL = "conditional float32"  # float32 when an attribute matches
    NEUTRAL = "neutral"        # run in whatever dtype arrives
    FOLLOW = "follow"          # low precision only if every float input already is


# What a per-node rule may return (CONDITIONAL is the lists' own mechanism).
RULE_CATEGORIES = (Category.LOW, Category.FP32, Category.FOLLOW, Category.WIDEST,
                   Category.NEUTRAL)


# Per target dtype: the list module and the names of its category lists.
_LISTS = {
    "float16": (symbol_fp16, "FP16_FUNCS", "FP16_FP32_FUNCS"),
    "bfloat16": (symbol_bf16, "BF16_FUNCS", "BF16_FP32_FUNCS"),
}


def normalize_dtype(target_dtype):
    """'float16' / 'bfloat16' from a string or numpy dtype; ValueError otherwise."""
    if isinstance(target_dtype, str):
        name = target_dtype
    else:
        try:
            dtype = np.dtype(target_dtype)
        except TypeError:
            name = repr(target_dtype)
        else:  # MXNet's numpy stand-in for bfloat16 is a record type named so
            name = "bfloat16" if dtype.names == ("bfloat16",) else dtype.name
    if name not in TARGET_DTYPES:
        raise OptionError(f"target_dtype {target_dtype!r} is not supported; "
                         f"allowed: {', '.join(TARGET_DTYPES)}")
    return name


def _lists(target_dtype):
    module, low, neutral = _LISTS[normalize_dtype(target_dtype)]
    return module, low, neutral


def list_lp16_ops(target_dtype):
    """Default ops that run in the target (low precision) dtype."""
    module, low, _ = _lists(target_dtype)
    return list(getattr(module, low))


def list_fp32_ops(target_dtype):
    """Default ops that always run in float32."""
    return list(_lists(target_dtype)[0].FP32_FUNCS)


def list_lp16_fp32_ops(target_dtype):
    """Default ops that run in whichever float dtype they receive."""
    module, _, neutral = _lists(target_dtype)
    return list(getattr(module, neutral))


def list_conditional_fp32_ops(target_dtype):
    """Default (op, attribute, values) rules that switch an op to float32."""
    return list(_lists(target_dtype)[0].CONDITIONAL_FP32_FUNCS)


def list_widest_type_cast(target_dtype):
    """Default ops that run in the widest float dtype among their inputs."""
    return list(_lists(target_dtype)[0].WIDEST_TYPE_CASTS)


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


def _str_list(value, what):
    """A list of strings from a list/tuple/set, or TypeError naming `what`."""
    if not isinstance(value, (list, tuple, set, frozenset)) or \
            not all(isinstance(v, str) for v in value):
        raise OptionTypeError(f"{what} must be a list of str, got {value!r}")
    return list(value)


def _op_set(ops, what):
    """Canonical op names from a user list; ValueError for names MXNet does not know."""
    ops = _str_list(ops, what)
    known = canonical_op_names()
    unknown = sorted(set(ops) - known.keys())
    if unknown:
        raise OptionError(f"{what} names operators MXNet does not know: {unknown}; "
                         "see mxnet.operator.get_all_registered_operators()")
    return frozenset(known[op] for op in ops)


def _conditions(rules):
    """{op: {attr: frozenset(values)}} from (op, attr, [values]) records."""
    if not isinstance(rules, (list, tuple)):
        raise OptionTypeError(f"conditional_fp32_ops must be a list of (op, attribute, [values]) "
                        f"tuples, got {rules!r}")
    known = canonical_op_names()
    conditions = {}
    for rule in rules:
        if not (isinstance(rule, (list, tuple)) and len(rule) == 3
                and isinstance(rule[0], str) and isinstance(rule[1], str)
                and isinstance(rule[2], (list, tuple))
                and all(isinstance(v, str) for v in rule[2])):
            raise OptionTypeError(f"conditional_fp32_ops entries must be (op: str, attribute: str, "
                            f"values: list of str), got {rule!r}")
        if rule[0] not in known:
            raise OptionError(f"conditional_fp32_ops names operator {rule[0]!r}, "
                             "which MXNet does not know")
        attrs = conditions.setdefault(known[rule[0]], {})
        attrs[rule[1]] = attrs.get(rule[1], frozenset()) | frozenset(rule[2])
    return conditions


class ShapesUnknownError(OptionError):
    """A rule read ``NodeInfo.input_shapes`` in a call that knows no shapes."""


@dataclass(frozen=True)
class NodeInfo:
    """Read-only view of one graph node, given to per-node rules.

    ``input_dtypes`` are numpy dtype names of the float32 model's inputs
    (None where unknown). ``input_shapes`` are tuples with None for unknown
    dimensions (None for an input of unknown rank); reading them in a call
    that was given no shapes raises :class:`ShapesUnknownError`.
    """
    name: str
    op: str
    attrs: types.MappingProxyType
    input_dtypes: tuple
    shapes: tuple = field(default=None, repr=False)

    @property
    def input_shapes(self):
        if self.shapes is None:
            raise ShapesUnknownError(
                f"input shapes of node {self.name!r} are unknown: pass input_shapes="
                "{input name: shape} to the conversion (convert_model and "
                "convert_hybrid_block also know their parameters' shapes)")
        return self.shapes


def to_category(value):
    """A rule's result as a Category (or None), from a member or its name."""
    if value is None or any(value is c for c in RULE_CATEGORIES):
        return value
    if isinstance(value, str) and value.upper() in Category.__members__:
        category = Category[value.upper()]
        if category in RULE_CATEGORIES:
            return category
    raise OptionError(f"{value!r} is not a rule category; allowed: None or "
                     f"{', '.join(c.name for c in RULE_CATEGORIES)} (Category members or "
                     "their names)")


@dataclass(frozen=True)
class Rule:
    """A per-call, per-operator precision rule: ``fn(NodeInfo)`` returns a
    category (a :class:`Category` or its name: LOW, FP32, FOLLOW, WIDEST,
    NEUTRAL) or None to defer to lower-priority rules and then the lists.
    Among rules for one operator the higher ``priority`` is asked first."""
    op: str
    fn: Callable
    priority: int = 0

    def __post_init__(self):
        if not isinstance(self.op, str):
            raise OptionTypeError(f"Rule op must be an operator name (str), got {self.op!r}")
        if not callable(self.fn):
            raise OptionTypeError(f"Rule for op {self.op!r}: fn must be callable, got {self.fn!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise OptionTypeError(f"Rule for op {self.op!r}: priority must be an int, "
                            f"got {self.priority!r}")

    def __str__(self):
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"Rule(op={self.op!r}, fn={name}, priority={self.priority})"

    def apply(self, info):
        """The rule's category for a node, with errors naming the rule and the node."""
        where = f"{self} on node {info.name!r} ({info.op})"
        try:
            value = self.fn(info)
        except ShapesUnknownError as err:
            raise ShapesUnknownError(f"{where}: {err}") from None
        except Exception as err:
            raise RuntimeError(f"{where} raised {type(err).__name__}: {err}") from err
        try:
            return to_category(value)
        except ValueError as err:
            raise OptionError(f"{where} returned {err}") from None


def _rules_by_op(rules):
    """{canonical op: rules, highest priority first}; one priority per op at most
    once, so the outcome never depends on the order of the list."""
    if not isinstance(rules, (list, tuple)) or not all(isinstance(r, Rule) for r in rules):
        raise OptionTypeError(f"rules must be a list of mxamp.Rule, got {rules!r}")
    known = canonical_op_names()
    unknown = sorted({r.op for r in rules} - known.keys())
    if unknown:
        raise OptionError(f"rules name operators MXNet does not know: {unknown}; "
                         "see mxnet.operator.get_all_registered_operators()")
    by_op = {}
    for rule in rules:
        by_op.setdefault(known[rule.op], []).append(rule)
    for op, group in by_op.items():
        group.sort(key=lambda r: -r.priority)
        ties = [str(r) for r in group if [g.priority for g in group].count(r.priority) > 1]
        if ties:
            raise OptionError(f"rules for op {op!r} share a priority: {ties}; give each a "
                             "different priority")
    return {op: tuple(group) for op, group in by_op.items()}


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
        for attr, values in self.conditions.get(op, {}).items():
            if attrs.get(attr) in values:
                return Category.CONDITIONAL
        return Category.NEUTRAL


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
    excluded = frozenset(_str_list([] if excluded_sym_names is None else excluded_sym_names,
                                   "excluded_sym_names"))
    if not isinstance(keep_io_types, bool):
        raise OptionTypeError(f"keep_io_types must be True or False, got {keep_io_types!r}")
    return Policy(target_dtype, low, fp32, widest, conditions, excluded, keep_io_types,
                  follow, _rules_by_op([] if rules is None else rules), _shapes(input_shapes))
