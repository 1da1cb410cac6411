"""``from mxamp import amp``: the same names as ``from mxnet.contrib.amp import amp``."""
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP

# lists and convert_bucketing_module are module attributes there, outside __all__
from ..convert import convert_bucketing_module, convert_model, convert_symbol  # noqa: F401
from ..gluon import convert_hybrid_block
from ..policy import (list_conditional_fp32_ops, list_fp32_ops, list_loss_output_functions,
                     list_lp16_fp32_ops, list_lp16_ops, list_lp16_use_fp32_params,
                     list_widest_type_cast)
from . import lists  # noqa: F401
from ..training import init, init_trainer, scale_loss, unscale

# MXNet's numpy stand-in for bfloat16, as the reference module exposes it.
bfloat16 = _DTYPE_MX_TO_NP[12]

__all__ = ["init", "init_trainer", "scale_loss", "unscale", "convert_model",
           "convert_hybrid_block", "list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops",
           "list_conditional_fp32_ops", "list_widest_type_cast", "list_loss_output_functions",
           "list_lp16_use_fp32_params", "convert_symbol"]
