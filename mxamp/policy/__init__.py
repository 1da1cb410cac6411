"""Precision policy: categories and what each does, the default lists
(data), per-node rules, and their resolution with the user's options into
one per-call Policy."""
from .categories import BEHAVIOUR, RULE_CATEGORIES, Behaviour, Cast, Category
from .defaults import (list_conditional_fp32_ops, list_fp16_fp32_ops, list_fp16_ops,
                       list_fp32_ops, list_loss_output_functions, list_lp16_fp32_ops,
                       list_lp16_ops, list_lp16_use_fp32_params, list_widest_type_cast)
from .resolve import Policy, resolve
from .rules import NodeInfo, Rule, ShapesUnknownError, rule_categories, to_category

__all__ = ["Category", "Cast", "Behaviour", "BEHAVIOUR", "RULE_CATEGORIES", "Policy",
           "resolve", "NodeInfo", "Rule", "ShapesUnknownError", "rule_categories",
           "to_category", "list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops",
           "list_conditional_fp32_ops", "list_widest_type_cast", "list_loss_output_functions",
           "list_lp16_use_fp32_params", "list_fp16_ops", "list_fp16_fp32_ops"]
