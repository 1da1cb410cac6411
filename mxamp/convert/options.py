"""The options of a conversion, as the drop-in functions take them, checked
once: :class:`ConversionOptions`."""
from dataclasses import dataclass, field

import mxnet as mx

from .. import backends
from ..errors import OptionError, OptionTypeError
from ..policy import Policy, resolve

# What a backend's regions may be told to compute in (None: the backend decides).
BACKEND_COMPUTE = (None, "bfloat16", "float32")


@dataclass(frozen=True)
class ConversionOptions:
    """The options of one conversion, checked when built.

    :func:`mxamp.convert_symbol`, :func:`mxamp.convert_model`,
    :func:`mxamp.convert_hybrid_block` and
    :func:`mxamp.convert_bucketing_module` each build one from their
    arguments and hand it down. The fields are those arguments, as given
    (`target_dtype` by its full name); what depends on the model (data
    names that are no inputs, missing parameters) is checked by the
    conversion.

    Attributes
    ----------
    target_dtype : str
        ``"float16"`` or ``"bfloat16"``.
    target_dtype_ops, fp32_ops, conditional_fp32_ops, widest_dtype_ops : list, optional
        The caller's lists (None: the defaults).
    excluded_sym_names : list of str, optional
        Node names kept in float32.
    data_names : list of str, optional
        The data inputs (None: the entry point's default).
    cast_optional_params, keep_io_types, measure_kernels : bool
        As for :func:`mxamp.convert_symbol`.
    ctx : mxnet.Context, optional
        The device the graph is for.
    follow_ops, rules, input_shapes : optional
        As for :func:`mxamp.convert_symbol`.
    backend, backend_compute : str, optional
        As for :func:`mxamp.convert_model`.
    policy : mxamp.policy.Policy
        The lists resolved with the defaults (not compared).

    Raises
    ------
    mxamp.OptionError, mxamp.OptionTypeError
        For an invalid option, naming it and what is allowed.
    """
    target_dtype: str = "float16"
    target_dtype_ops: list = None
    fp32_ops: list = None
    conditional_fp32_ops: list = None
    excluded_sym_names: list = None
    data_names: list = None
    cast_optional_params: bool = False
    widest_dtype_ops: list = None
    ctx: mx.Context = None
    keep_io_types: bool = True
    follow_ops: list = None
    rules: list = None
    input_shapes: dict = None
    backend: str = None
    measure_kernels: bool = False
    backend_compute: str = None
    policy: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        backends.check(self.backend)
        policy = resolve(self.target_dtype, self.target_dtype_ops, self.fp32_ops,
                         self.conditional_fp32_ops, self.excluded_sym_names,
                         self.widest_dtype_ops, self.keep_io_types, follow_ops=self.follow_ops,
                         rules=self.rules, input_shapes=self.input_shapes)
        # frozen: the derived fields are set past the dataclass' own __setattr__
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "target_dtype", policy.target_dtype)
        self._check_backend()
        self._check_data_names()
        self._check_device_and_flags()
        backends.get(self.backend)  # last: loading may build the library

    @property
    def backend_module(self):
        """The backend's module, its library loaded (None without a backend)."""
        return backends.get(self.backend)

    def _check_backend(self):
        if self.backend_compute not in BACKEND_COMPUTE:
            raise OptionError(f"backend_compute must be one of {BACKEND_COMPUTE}, "
                              f"got {self.backend_compute!r}")
        if self.backend_compute is not None and self.backend is None:
            raise OptionError("backend_compute is what a backend's regions compute in: it "
                              "needs backend='onednn'")
        if self.backend is not None and self.target_dtype != "bfloat16":
            raise OptionError(f"backend {self.backend!r} runs bfloat16 models; got "
                              f"target_dtype={self.target_dtype!r}: convert with "
                              "target_dtype='bfloat16', or without backend")

    def _check_data_names(self):
        names = self.data_names
        if names is not None and not (isinstance(names, (list, tuple))
                                      and all(isinstance(n, str) for n in names)):
            raise OptionTypeError(f"data_names must be a list of str, got {names!r}")

    def _check_device_and_flags(self):
        if self.ctx is not None and not isinstance(self.ctx, mx.Context):
            raise OptionTypeError(f"ctx must be an mxnet.Context (e.g. mx.cpu()) or None, "
                                  f"got {self.ctx!r}")
        for name in ("cast_optional_params", "measure_kernels"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise OptionTypeError(f"{name} must be True or False, got {value!r}")
