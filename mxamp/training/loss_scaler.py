"""Dynamic loss scaling for mixed-precision training with a Gluon Trainer.

MXNet 1.9.1's ``gluon.Trainer._update`` asks ``trainer._amp_loss_scaler``
(when set) whether the gradients overflowed and skips the update if they did;
:class:`LossScaler` is the object it asks.
"""
import logging
import math

import mxnet as mx

log = logging.getLogger(__name__)

# multi_all_finite takes at most this many arrays per call.
_CHUNK = 200


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class LossScaler:
    """The loss scale of one trainer.

    Parameters
    ----------
    init_scale : float
        The first scale.
    scale_window : int
        With `dynamic`, the scale doubles after this many clean steps in a
        row (not above `max_scale`).
    min_scale, max_scale : float
        Its bounds.
    dynamic : bool
        True: every ``trainer.step`` checks all gradients on every context;
        a step whose gradients hold an inf or NaN is skipped (parameters and
        optimizer state unchanged) and the scale halves (not below
        `min_scale`). False: the scale stays at `init_scale` and nothing is
        checked or skipped (bfloat16's default, with scale 1).
    """

    def __init__(self, init_scale=2.0 ** 16, scale_window=2000, min_scale=1.0,
                 max_scale=2.0 ** 24, dynamic=True):
        self._scale = _positive("init_scale", init_scale)
        self._min = _positive("min_scale", min_scale)
        self._max = _positive("max_scale", max_scale)
        if not self._min <= self._scale <= self._max:
            raise ValueError(f"need min_scale <= init_scale <= max_scale, got {min_scale!r}, "
                             f"{init_scale!r}, {max_scale!r}")
        if isinstance(scale_window, bool) or not isinstance(scale_window, int) \
                or scale_window < 1:
            raise ValueError(f"scale_window must be a positive int, got {scale_window!r}")
        if not isinstance(dynamic, bool):
            raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
        self._window = scale_window
        self._dynamic = dynamic
        self._clean_steps = 0

    def __repr__(self):
        return (f"LossScaler(loss_scale={self._scale}, dynamic={self._dynamic}, "
                f"scale_window={self._window}, min_scale={self._min}, max_scale={self._max})")

    @property
    def loss_scale(self):
        """The scale the next :func:`mxamp.scale_loss` multiplies the loss by (read-only)."""
        return self._scale

    @property
    def dynamic(self):
        """Whether the scale adapts and overflowed steps are skipped (read-only)."""
        return self._dynamic

    def has_overflow(self, params):
        """Check the gradients and update the scale for the next step.

        The trainer calls it at every step.

        Parameters
        ----------
        params : list of mxnet.gluon.Parameter
            The trainer's parameters.

        Returns
        -------
        bool
            True when a gradient is not finite: the trainer then skips the step.
        """
        if not self._dynamic:
            return False
        finite = _all_finite([g for p in params if p.grad_req != "null" and p._grad is not None
                              for g in p.list_grad()])
        if finite:
            self._clean_steps += 1
            if self._clean_steps == self._window:
                self._clean_steps = 0
                self._scale = min(self._max, self._scale * 2)
                log.info("AMP: no overflow in %d steps, loss scale now %g", self._window,
                         self._scale)
            return False
        self._clean_steps = 0
        if self._scale == self._min:
            log.warning("AMP: gradients overflow at the minimum loss scale %g; step skipped",
                        self._min)
        self._scale = max(self._min, self._scale / 2)
        log.info("AMP: gradient overflow, step skipped, loss scale now %g", self._scale)
        return True


def _all_finite(grads):
    """One flag per context, filled by multi_all_finite over chunks of gradients."""
    by_ctx = {}
    for grad in grads:
        by_ctx.setdefault(grad.context, []).append(grad.data if grad.stype == "row_sparse"
                                                   else grad)
    flags = []
    with mx.autograd.pause():
        for ctx, arrays in by_ctx.items():
            flag = mx.nd.ones((1,), ctx=ctx)
            for start in range(0, len(arrays), _CHUNK):
                chunk = arrays[start:start + _CHUNK]
                mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False,
                                       out=flag)
            flags.append(flag)
    return all(bool(flag.asscalar()) for flag in flags)
