"""The trainer side of AMP training: a loss scaler attached to a Gluon
Trainer, ``scale_loss`` and ``unscale``."""
import contextlib

import mxnet as mx
from mxnet.gluon import Trainer
from mxnet.optimizer import Optimizer

from ..dtypes import DTYPE_CODES
from . import patch
from .loss_scaler import LossScaler


def _check_trainer(trainer, what):
    if not isinstance(trainer, Trainer):
        hint = " (wrap it: gluon.Trainer(params, optimizer))" \
            if isinstance(trainer, Optimizer) else ""
        raise TypeError(f"{what} takes a mxnet.gluon.Trainer, got "
                        f"{type(trainer).__module__}.{type(trainer).__name__}{hint}")


def get_loss_scaler(trainer):
    """The loss scaler :func:`mxamp.init_trainer` attached to a trainer.

    Parameters
    ----------
    trainer : mxnet.gluon.Trainer

    Returns
    -------
    LossScaler
    """
    return _scaler_of(trainer, "get_loss_scaler")


def _scaler_of(trainer, what):
    _check_trainer(trainer, what)
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    if not isinstance(scaler, LossScaler):
        raise RuntimeError(f"{what}: the trainer has no loss scaler; call "
                           "mxamp.init_trainer(trainer) first")
    return scaler


def init_trainer(optimizer_or_trainer, loss_scaler=None):
    """Attach a loss scaler to a Gluon Trainer.

    Parameters
    ----------
    optimizer_or_trainer : mxnet.gluon.Trainer
        The trainer (named as in the reference, which also refuses a bare
        ``Optimizer``). It must not update on the kvstore, where the update
        happens before an overflow could be checked: when unset, mxamp sets
        ``update_on_kvstore`` to False.
    loss_scaler : LossScaler, optional
        By default, after ``mxamp.init("float16")``: dynamic scaling from
        2**16; after ``mxamp.init("bfloat16")``: a fixed scale of 1 that never
        skips a step (bfloat16 has float32's range).

    Returns
    -------
    LossScaler
        The scaler attached.

    Raises
    ------
    TypeError
        For anything but a Trainer (an Optimizer gets a hint to wrap it).
    ValueError
        For a trainer with ``update_on_kvstore=True``.
    RuntimeError
        Without `loss_scaler` when AMP is off, or when the trainer has a
        scaler already.
    """
    trainer = optimizer_or_trainer
    _check_trainer(trainer, "init_trainer")
    if loss_scaler is None:
        if patch._active is None:
            raise RuntimeError("AMP is not initialized: call mxamp.init() first, or "
                               "pass loss_scaler=LossScaler(...)")
        float16 = patch._active.settings.target == DTYPE_CODES["float16"]
        loss_scaler = LossScaler() if float16 else LossScaler(init_scale=1.0, dynamic=False)
    elif not isinstance(loss_scaler, LossScaler):
        raise TypeError(f"loss_scaler must be an mxamp LossScaler, got {loss_scaler!r}")
    current = getattr(trainer, "_amp_loss_scaler", None)
    if current is not None:
        raise RuntimeError(f"the trainer already has a loss scaler ({current!r})")
    on_kvstore = trainer._update_on_kvstore if trainer._kv_initialized else \
        trainer._kvstore_params["update_on_kvstore"]
    if on_kvstore:
        raise ValueError("AMP cannot skip overflowed steps of a Trainer with "
                         "update_on_kvstore=True; create it with update_on_kvstore=False")
    if not trainer._kv_initialized:
        trainer._kvstore_params["update_on_kvstore"] = False
    trainer._amp_original_scale = trainer._scale
    trainer._amp_loss_scaler = loss_scaler  # read by gluon.Trainer._update
    trainer._amp_applied_scale = 1.0        # factor the current gradients carry
    return loss_scaler


@contextlib.contextmanager
def scale_loss(loss, optimizer_or_trainer):
    """Scale the loss for the backward pass.

    A context manager: it yields the loss (or list of losses) times the
    current loss scale, and the trainer's next ``step`` divides the gradients
    by the same factor. It may also be entered after the ``autograd.record()``
    block that computed the loss.

    Parameters
    ----------
    loss : mxnet.nd.NDArray or list of mxnet.nd.NDArray
        The loss.
    optimizer_or_trainer : mxnet.gluon.Trainer
        A trainer :func:`mxamp.init_trainer` prepared.
    """
    trainer = optimizer_or_trainer
    scale = _scaler_of(trainer, "scale_loss").loss_scale
    trainer._scale = trainer._amp_original_scale / scale
    trainer._amp_applied_scale = scale
    # Recorded even when called after the record() block (a common slip), so
    # backward() on the scaled loss reaches the model's graph.
    with contextlib.ExitStack() as stack:
        if not mx.autograd.is_recording():
            stack.enter_context(mx.autograd.record(train_mode=False))
        scaled = [item * scale for item in loss] if isinstance(loss, (list, tuple)) \
            else loss * scale
    yield scaled


def unscale(optimizer_or_trainer):
    """Divide the current gradients by the loss scale, in place.

    The gradients are then what float32 training has (for clipping or
    inspection), and the next ``step`` does not divide again. A second call
    before the next :func:`mxamp.scale_loss` does nothing.

    Parameters
    ----------
    optimizer_or_trainer : mxnet.gluon.Trainer
        A trainer :func:`mxamp.init_trainer` prepared.
    """
    trainer = optimizer_or_trainer
    _scaler_of(trainer, "unscale")
    factor = 1.0 / trainer._amp_applied_scale
    if factor != 1.0:
        with mx.autograd.pause():
            for param in trainer._params:
                if param.grad_req != "null" and param._grad is not None:
                    for grad in param.list_grad():
                        grad *= factor
    trainer._scale = trainer._amp_original_scale
    trainer._amp_applied_scale = 1.0
