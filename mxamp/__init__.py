"""mxamp: automatic mixed precision (float16 / bfloat16) for MXNet and Gluon models."""
from .convert import (convert_bucketing_module, convert_hybrid_block, convert_model,
                      convert_symbol, summarize)
from .policy import (Category, NodeInfo, Rule, ShapesUnknownError, list_conditional_fp32_ops,
                     list_fp16_fp32_ops, list_fp16_ops, list_fp32_ops,
                     list_loss_output_functions, list_lp16_fp32_ops, list_lp16_ops,
                     list_lp16_use_fp32_params, OptionError, OptionTypeError,
                     list_widest_type_cast)
from .loss_scaler import LossScaler
from .scope import fp32_scope, keep_fp32
from .training import (amp_scope, deinit, get_loss_scaler, init, init_trainer,
                       register_fp32_function, register_lp16_function, register_widest_function,
                       scale_loss, unscale)
from .tuning import TuneResult, tune
from . import amp, lists

__version__ = "0.1.0"

__all__ = ["convert_symbol", "convert_model", "convert_hybrid_block", "convert_bucketing_module",
           "summarize", "list_lp16_use_fp32_params", "OptionError", "OptionTypeError", "amp",
           "list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops", "list_conditional_fp32_ops",
           "list_widest_type_cast", "list_loss_output_functions", "list_fp16_ops",
           "list_fp16_fp32_ops", "lists", "Rule", "Category", "NodeInfo", "ShapesUnknownError",
           "fp32_scope", "keep_fp32", "tune", "TuneResult", "LossScaler", "amp_scope", "deinit",
           "get_loss_scaler", "init", "init_trainer", "register_fp32_function",
           "register_lp16_function", "register_widest_function", "scale_loss", "unscale"]
