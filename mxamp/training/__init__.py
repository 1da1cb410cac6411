"""Mixed-precision training: the ``init`` / ``init_trainer`` / ``scale_loss``
/ ``unscale`` API of ``mxnet.contrib.amp`` (1.9.1). ``patch`` wraps MXNet's
operator functions; ``trainer`` scales the loss; ``loss_scaler`` holds the
scale."""
from .loss_scaler import LossScaler
from .patch import (NO_BF16_BACKWARD, amp_scope, deinit, init, register_fp32_function,
                    register_lp16_function, register_widest_function)
from .trainer import get_loss_scaler, init_trainer, scale_loss, unscale

__all__ = ["LossScaler", "NO_BF16_BACKWARD", "amp_scope", "deinit", "init",
           "register_fp32_function", "register_lp16_function", "register_widest_function",
           "get_loss_scaler", "init_trainer", "scale_loss", "unscale"]
