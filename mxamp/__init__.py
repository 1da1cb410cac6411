"""mxamp: mixed precision (float16 / bfloat16) and INT8 for MXNet 1.9.1 and Gluon models.

A drop-in for ``mxnet.contrib.amp`` (the conversion and training
functions, under the same names) with mxamp's own additions: a oneDNN 3
execution backend (:mod:`mxamp.backends.onednn`), INT8 quantization
(:mod:`mxamp.quantization`), :func:`optimize`, which picks the fastest
way to run a model on this CPU, and :func:`load`, which loads whatever
mxamp writes.
"""
# Layers, each importing only those above it: version, process_wide,
# address_space, errors, cpu, dtypes, registry, graph -> native -> policy ->
# backends -> convert -> gluon -> verify -> quantization -> training -> tools
# (docs/architecture.md).
from . import address_space
address_space.share_malloc_arenas()  # before MXNet starts its threads
from . import cpu
cpu.enable_mxnet_amx()  # before anything runs a kernel of MXNet's (its oneDNN fixes its ISA then)
from .convert import convert_bucketing_module, convert_model, convert_symbol
from .errors import OptionError, OptionTypeError
from .gluon import convert_hybrid_block, fp32_scope, keep_fp32
from .graph import summarize
from .policy import (Category, NodeInfo, Rule, ShapesUnknownError, list_conditional_fp32_ops,
                     list_fp16_fp32_ops, list_fp16_ops, list_fp32_ops,
                     list_loss_output_functions, list_lp16_fp32_ops, list_lp16_ops,
                     list_lp16_use_fp32_params, list_widest_type_cast)
from .training import (LossScaler, amp_scope, deinit, get_loss_scaler, init, init_trainer,
                       register_fp32_function, register_lp16_function, register_widest_function,
                       scale_loss, unscale)
from .verify import TuneResult, tune
from .tools.optimize import OptimizeResult, optimize
from .tools.loading import load
from . import amp
from .amp import lists
from .version import __version__

__all__ = ["cpu", "load", "optimize", "OptimizeResult", "convert_symbol", "convert_model",
           "convert_hybrid_block", "convert_bucketing_module",
           "summarize", "list_lp16_use_fp32_params", "OptionError", "OptionTypeError", "amp",
           "list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops", "list_conditional_fp32_ops",
           "list_widest_type_cast", "list_loss_output_functions", "list_fp16_ops",
           "list_fp16_fp32_ops", "lists", "Rule", "Category", "NodeInfo", "ShapesUnknownError",
           "fp32_scope", "keep_fp32", "tune", "TuneResult", "LossScaler", "amp_scope", "deinit",
           "get_loss_scaler", "init", "init_trainer", "register_fp32_function",
           "register_lp16_function", "register_widest_function", "scale_loss", "unscale"]
