"""Per-node precision rules: user functions of a read-only view of a node
that return a category, asked before the lists."""
import types
from dataclasses import dataclass, field
from typing import Callable

from ..dtypes import dtype_name
from ..errors import OptionError, OptionTypeError
from ..graph import infer_entry_shapes
from ..registry import check_op_names
from .categories import RULE_CATEGORIES, Category


class ShapesUnknownError(OptionError):
    """A rule read ``NodeInfo.input_shapes`` in a call that knows no shapes.

    Pass ``input_shapes={input name: shape}`` to the conversion
    (:func:`mxamp.convert_model` and :func:`mxamp.convert_hybrid_block` also
    know their parameters' shapes). A :class:`mxamp.OptionError`.
    """


@dataclass(frozen=True)
class NodeInfo:
    """Read-only view of one graph node, given to per-node rules.

    Attributes
    ----------
    name : str
        The node's name.
    op : str
        Its operator.
    attrs : mapping of str to str
        Its attributes, as strings (as in the graph's JSON).
    input_dtypes : tuple
        The numpy dtype name of each input in the float32 model
        (``"float32"``, ``"int32"``), None where unknown.
    shapes : tuple or None
        The input shapes the call knows, None when it knows none; rules read
        them as `input_shapes`.
    """
    name: str
    op: str
    attrs: types.MappingProxyType
    input_dtypes: tuple
    shapes: tuple = field(default=None, repr=False)

    @property
    def input_shapes(self):
        """One tuple per input, None for an unknown dimension (None for an input of unknown rank).

        Raises :class:`ShapesUnknownError` in a call that was given no shapes.
        """
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
    """A per-call, per-operator precision rule.

    For each node of operator `op` (aliases resolved: a rule for
    ``Convolution`` also sees ``_npx_convolution`` nodes), the rules are asked
    from the highest priority down; the first that returns a category decides,
    and None defers to the next rule and finally to the lists.

    Parameters
    ----------
    op : str
        The operator the rule is for.
    fn : callable
        ``fn(NodeInfo)`` returns a :class:`Category` (or its name: ``"LOW"``,
        ``"FP32"``, ``"FOLLOW"``, ``"WIDEST"``, ``"NEUTRAL"``) or None.
    priority : int
        Rules for one operator are asked highest first; two rules for one
        operator may not share a priority.

    Raises
    ------
    mxamp.OptionTypeError
        When made with a non-callable `fn` or a `priority` that is not an int.
    """
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
        """The rule's category for one node.

        Parameters
        ----------
        info : NodeInfo
            The node.

        Returns
        -------
        Category or None

        Raises
        ------
        RuntimeError
            When `fn` raises (chained to its exception), naming the rule and the
            node; :class:`mxamp.OptionError` when it returns no category.
        """
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
    by_op = {}
    for rule, op in zip(rules, check_op_names([r.op for r in rules], "rules")):
        by_op.setdefault(op, []).append(rule)
    for op, group in by_op.items():
        group.sort(key=lambda r: -r.priority)
        ties = [str(r) for r in group if [g.priority for g in group].count(r.priority) > 1]
        if ties:
            raise OptionError(f"rules for op {op!r} share a priority: {ties}; give each a "
                             "different priority")
    return {op: tuple(group) for op, group in by_op.items()}


def rule_categories(graph, policy, entry_types):
    """{node id: Category} for the nodes a user rule decides, asking each
    operator's rules from the highest priority down until one answers."""
    shapes = None if policy.input_shapes is None else \
        infer_entry_shapes(graph, policy.input_shapes)
    result = {}
    for nid, node in enumerate(graph["nodes"]):
        if node["op"] not in policy.rules:
            continue
        inputs = [tuple(e[:2]) for e in node["inputs"]]
        info = NodeInfo(node["name"], node["op"],
                        types.MappingProxyType(dict(node.get("attrs", {}))),
                        tuple(dtype_name(entry_types.get(e, -1)) for e in inputs),
                        None if shapes is None else tuple(shapes.get(e) for e in inputs))
        for rule in policy.rules[node["op"]]:
            category = rule.apply(info)
            if category is not None:
                result[nid] = category
                break
    return result
