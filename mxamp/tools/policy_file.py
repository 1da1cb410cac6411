"""A conversion policy read from a JSON or TOML file (``mxamp convert /
zoo --config FILE``), for scripted batches: the operator lists, FOLLOW ops,
exclusions, storage options and attribute rules, as convert_model keyword
arguments. Example (TOML)::

    fp32_ops = ["softmax", "SoftmaxOutput"]     # replaces the default list
    follow_ops = ["Pooling"]
    excluded_sym_names = ["resnetv10_dense0_fwd"]
    cast_optional_params = true

    [[rules]]                                   # Convolutions with 32 groups
    op = "Convolution"                          # stay float32
    attrs = {num_group = "32"}
    category = "FP32"
    priority = 10
"""
import json
import os
import tomllib
from dataclasses import dataclass

from ..errors import OptionError, OptionTypeError
from ..policy.rules import Rule, to_category

LISTS = ("target_dtype_ops", "fp32_ops", "widest_dtype_ops", "follow_ops",
         "excluded_sym_names", "conditional_fp32_ops")
FLAGS = ("cast_optional_params", "keep_io_types")
RULE_KEYS = ("op", "attrs", "category", "priority")


@dataclass(frozen=True)
class AttrMatch:
    """A rule's function: `category` for a node whose attributes have every
    given value (compared as MXNet's attribute strings), else None."""
    attrs: tuple  # ((name, value), ...)
    category: str

    def __call__(self, node):
        matched = all(node.attrs.get(k) == v for k, v in self.attrs)
        return self.category if matched else None


def read(path):
    """convert_model keyword arguments from a .json or .toml file."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".json", ".toml"):
        raise OptionError(f"policy file {path!r}: name it .json or .toml")
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f) if ext == ".toml" else json.load(f)
        except ValueError as err:  # JSON's, TOML's and UTF-8's errors all are
            raise OptionError(f"policy file {path!r} does not parse: {err}") from None
    return options(data, path)


def options(data, where):
    if not isinstance(data, dict):
        raise OptionTypeError(f"{where}: the policy must be a table of options")
    unknown = sorted(set(data) - {*LISTS, *FLAGS, "rules"})
    if unknown:
        raise OptionError(f"{where}: unknown keys {unknown}; allowed: "
                          f"{', '.join((*LISTS, *FLAGS, 'rules'))}")
    result = {}
    for key in LISTS:
        if key in data:
            if not isinstance(data[key], list):
                raise OptionTypeError(f"{where}: {key} must be a list, got {data[key]!r}")
            result[key] = [tuple(v) if isinstance(v, list) else v for v in data[key]]
    for key in FLAGS:
        if key in data:
            if not isinstance(data[key], bool):
                raise OptionTypeError(f"{where}: {key} must be true or false")
            result[key] = data[key]
    if "rules" in data:
        result["rules"] = [_rule(r, where) for r in data["rules"]]
    return result


def _rule(record, where):
    if not isinstance(record, dict) or set(record) - set(RULE_KEYS) or \
            not {"op", "category"} <= set(record):
        raise OptionError(f"{where}: a rule is a table with op, category and optionally "
                          f"attrs and priority; got {record!r}")
    attrs = record.get("attrs", {})
    if not isinstance(attrs, dict):
        raise OptionTypeError(f"{where}: rule attrs must be a table, got {attrs!r}")
    category = to_category(record["category"]).name
    match = AttrMatch(tuple(sorted((k, str(v)) for k, v in attrs.items())), category)
    return Rule(record["op"], match, record.get("priority", 0))
