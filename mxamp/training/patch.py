"""Operator patching for AMP training.

:func:`init` replaces the operator functions of ``mx.nd`` and ``mx.sym`` (and
their ``op``, ``_internal``, ``contrib``, ``linalg``, ``sparse``, ``image``
and ``random`` namespaces) with wrappers that cast float inputs as the
conversion does (same lists, same per-operator decisions); :func:`deinit`
puts the original functions back. Gluon blocks call these functions at run
time, so blocks that have not yet built a graph train in mixed precision
without changes.

An operator of the low-precision list runs in float32 instead when MXNet's
type inference rejects the target dtype for it, or when the device has no
kernel for it in that dtype (asked once per operator, attributes and context
by ``mxamp.convert.probe``). NDArray calls are checked on the context of their
inputs; Symbol calls (hybridized blocks) on ``init``'s ``ctx``.
"""
import contextlib
import ctypes
import functools
import gc
import inspect
import logging
from dataclasses import dataclass

import mxnet as mx
from mxnet.base import _LIB, OpHandle, _Null, c_str, check_call
from mxnet.gluon import HybridBlock
from mxnet.ndarray import NDArray
from mxnet.symbol import Symbol

from ..convert import probe
from ..errors import mxnet_logs_to_logging
from ..dtypes import CASTABLE, DTYPE_CODES, FLOAT32, to_code, to_numpy
from ..graph import FLOAT_OR_UNKNOWN, low_slots, node_types
from ..policy import BEHAVIOUR, Cast, Category, Policy, resolve
from ..registry import canonical_op_names

log = logging.getLogger(__name__)

# Taken before any patching, so casts never go through a wrapper.
_ND_CAST = mx.nd.amp_cast
_SYM_CAST = mx.sym.amp_cast
_SYM_MULTICAST = mx.sym.amp_multicast

#: Operators of the default bfloat16 list that stay float32 in training, with
#: the reason: their gradient has no bfloat16 kernel in MXNet 1.9.1 on the CPU.
NO_BF16_BACKWARD = {
    "Deconvolution": "its bfloat16 backward crashes the process (segfault)",
    "_npx_deconvolution": "same kernel as Deconvolution",
    "_sg_mkldnn_conv": "fused inference-only subgraph op, no backward",
    "_sg_mkldnn_fully_connected": "fused inference-only subgraph op, no backward",
}

# Call arguments of a generated operator function that are not operator attributes.
_NOT_ATTRIBUTES = frozenset({"out", "name", "attr", "ctx"})


def _namespaces(root):
    return (root, root.op, root._internal, root.contrib, root.linalg, root.sparse,
            root.image, root.random)


# --- which generated function runs which operator --------------------------

@functools.lru_cache(maxsize=None)
def _ops_by_handle():
    """{operator handle value: canonical op name} over every registered name."""
    handles = {}
    for name, canonical in canonical_op_names().items():
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
        handles[handle.value] = canonical
    return handles


def _op_of(func):
    """The canonical operator an MXNet-generated function invokes, else None.
    Generated functions are compiled from a string and hold their operator's
    handle as a constant."""
    code = getattr(func, "__code__", None)
    if code is None or code.co_filename != "<string>":
        return None
    handles = _ops_by_handle()
    ops = {handles[c] for c in code.co_consts
           if isinstance(c, int) and not isinstance(c, bool) and c in handles}
    return ops.pop() if len(ops) == 1 else None


@functools.lru_cache(maxsize=None)
def _op_functions():
    """(namespace, attribute, op, is_symbol) for every generated operator
    function; read once, before any patching."""
    found = []
    for is_symbol, root in ((False, mx.nd), (True, mx.sym)):
        for space in _namespaces(root):
            for attr, value in vars(space).items():
                op = _op_of(value)
                if op is not None:
                    found.append((space, attr, op, is_symbol))
    return tuple(found)


# --- per-call decisions ---------------------------------------------------------

def _code_of(x):
    """MXNet dtype code of an NDArray, -1 for a Symbol (not known yet)."""
    return to_code(x.dtype) if isinstance(x, NDArray) else -1


def _cast(x, code, name=None):
    """`x` cast to dtype `code`: dense float NDArrays of another float dtype
    (amp_cast has no sparse kernel) and Symbols (amp_cast passes non-float
    symbols through at run time)."""
    if isinstance(x, NDArray):
        current = to_code(x.dtype)
        castable = current in CASTABLE and current != code and x.stype == "default"
        return _ND_CAST(x, dtype=to_numpy(code)) if castable else x
    if isinstance(x, Symbol):
        return _SYM_CAST(x, dtype=to_numpy(code), name=name)
    return x


@functools.lru_cache(maxsize=4096)
@mxnet_logs_to_logging()  # the kernel probe binds a graph
def _low_slots(op, attrs, codes, target, ctx):
    """Input indices to cast to `target` for a low-precision op, as the
    conversion decides them (e.g. not BatchNorm's statistics); None when the
    op has to run in float32: type inference rejects `target`, or `ctx` has
    no kernel for it. Symbols' codes are unknown (-1) when built."""
    info = node_types(op, attrs, codes, target)
    if info is None:
        log.info("AMP: %s stays float32: type inference rejects %s", op, _dtype_name(target))
        return None
    in_types, _, mutable = info
    if ctx is not None and probe.has_kernel(op, attrs, tuple(in_types), _dtype_name(target),
                                            ctx) is False:
        log.info("AMP: %s stays float32: no %s kernel on %s", op, _dtype_name(target), ctx)
        return None
    return low_slots(in_types, mutable, codes, target)


def _dtype_name(code):
    return next(name for name, c in DTYPE_CODES.items() if c == code)


@dataclass(frozen=True)
class _Settings:
    """What init() resolved: the policy and the context Symbols are checked on."""
    policy: Policy
    symbol_ctx: object

    @property
    def target(self):
        return DTYPE_CODES[self.policy.target_dtype]

    def cast(self, op, attrs=()):
        """What a call of `op` with `attrs` (sorted items) casts its float inputs to."""
        return BEHAVIOUR[self.policy.category(op, "", dict(attrs))].cast

    def plan(self, op, attrs, codes, ctx, keep=frozenset()):
        """Per input of one call: the dtype code to cast it to, or None.
        `keep`: input indices never cast (auxiliary states). Ops whose
        inputs go to the widest dtype have their own wrapper (_widest)."""
        cast = self.cast(op, attrs)
        if cast is Cast.TARGET:
            wanted = _low_slots(op, attrs, tuple(codes), self.target, ctx)
            if wanted is not None:
                return [self.target if i in wanted else None for i in range(len(codes))]
            cast = Cast.FLOAT32  # it cannot run in the target dtype
        if cast is Cast.NONE:
            return [None] * len(codes)
        return [FLOAT32 if i not in keep and c in FLOAT_OR_UNKNOWN else None
                for i, c in enumerate(codes)]


# --- wrappers ---------------------------------------------------------------------

class _Call:
    """One call of a generated operator function: its NDArray / Symbol
    arguments in the operator's input order and its attributes as strings."""

    def __init__(self, signature, args, kwargs):
        self.bound = signature.bind(*args, **kwargs)
        self.slots, attrs = [], {}
        for pname, value in self.bound.arguments.items():
            kind = signature.parameters[pname].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                self.slots += [(pname, i) for i in range(len(value))]
                if value:  # the generated function adds the count the same way
                    attrs.setdefault("num_args", str(len(value)))
                continue
            items = value.items() if kind is inspect.Parameter.VAR_KEYWORD else [(pname, value)]
            for key, item in items:
                if isinstance(item, (NDArray, Symbol)):
                    self.slots.append((pname, None if key == pname else key))
                elif key not in _NOT_ATTRIBUTES and item is not None and item is not _Null:
                    attrs[key] = str(item)
        self.attrs = tuple(sorted(attrs.items()))

    def inputs(self):
        return [self._get(slot) for slot in self.slots]

    def _get(self, slot):
        pname, sub = slot
        value = self.bound.arguments[pname]
        return value if sub is None else value[sub]

    def replace(self, values):
        """Puts `values` (one per input) in place of the inputs."""
        for (pname, sub), value in zip(self.slots, values):
            if sub is None:
                self.bound.arguments[pname] = value
            elif isinstance(sub, int):
                items = list(self.bound.arguments[pname])
                items[sub] = value
                self.bound.arguments[pname] = tuple(items)
            else:
                self.bound.arguments[pname][sub] = value

    def run(self, func):
        return func(*self.bound.args, **self.bound.kwargs)


def _ndarray_op(func, op, settings):
    signature = inspect.signature(func)

    @functools.wraps(func)
    def amp_function(*args, **kwargs):
        call = _Call(signature, args, kwargs)
        inputs = call.inputs()
        if inputs:
            ctx = inputs[0].context
            plan = settings.plan(op, call.attrs, [_code_of(x) for x in inputs], ctx)
            call.replace([x if code is None else _cast(x, code) for x, code in zip(inputs, plan)])
        return call.run(func)
    return amp_function


def _symbol_op(func, op, settings):
    """Builds the node first, so inputs the function creates itself (weight and
    bias variables) are cast too, then rebuilds it on cast inputs."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def amp_function(*args, **kwargs):
        attrs = _Call(signature, args, kwargs).attrs
        sym = func(*args, **kwargs)
        children = sym.get_children()
        if children is None:
            return sym
        children = list(children)
        aux = set(sym.list_auxiliary_states())
        keep = frozenset(i for i, child in enumerate(children) if child.name in aux)
        plan = settings.plan(op, attrs, [-1] * len(children), settings.symbol_ctx, keep)
        if all(code is None for code in plan):
            return sym
        inputs = [child if code is None else
                  _cast(child, code, name=f"{sym.name}_amp_cast{i}")
                  for i, (child, code) in enumerate(zip(children, plan))]
        return sym._gen_atomic_symbol()(*inputs, name=sym.name)
    return amp_function


@functools.lru_cache(maxsize=None)
@mxnet_logs_to_logging()
def _multicast_runs(target, ctx):
    """Whether amp_multicast of a `target` and a float32 input runs in a graph
    on `ctx` (MXNet 1.9.1's CPU build hands float16 to oneDNN, which fails)."""
    sym = probe.single_op("amp_multicast", (("num_outputs", "2"),), 2)
    return probe.runs(sym, {"in0": (2, 2), "in1": (2, 2)}, {"in0": target, "in1": FLOAT32}, ctx)


def _widest(func, settings):
    """Casts float inputs to the widest float type among them: NDArrays at once
    (float32 when they differ), Symbols through one amp_multicast node, or each
    to float32 where amp_multicast cannot run."""
    signature = inspect.signature(func)
    ctx = settings.symbol_ctx

    @functools.wraps(func)
    def amp_function(*args, **kwargs):
        call = _Call(signature, args, kwargs)
        inputs = call.inputs()
        floats = {_code_of(x) for x in inputs if isinstance(x, NDArray)} & CASTABLE
        if len(floats) > 1:
            inputs = [_cast(x, FLOAT32) if isinstance(x, NDArray) else x for x in inputs]
        symbols = [i for i, x in enumerate(inputs) if isinstance(x, Symbol)]
        if len(symbols) > 1:
            multicast = ctx is None or _multicast_runs(settings.target, ctx)
            cast = _SYM_MULTICAST(*[inputs[i] for i in symbols], num_outputs=len(symbols)) \
                if multicast else [_cast(inputs[i], FLOAT32) for i in symbols]
            for k, i in enumerate(symbols):
                inputs[i] = cast[k]
        call.replace(inputs)
        return call.run(func)
    return amp_function


def _cast_all(func, category, settings):
    """For registered user functions: every float NDArray / Symbol argument
    cast as `category` says."""
    cast = BEHAVIOUR[category].cast
    if cast is Cast.WIDEST:
        return _widest(func, settings)
    code = settings.target if cast is Cast.TARGET else FLOAT32

    @functools.wraps(func)
    def amp_function(*args, **kwargs):
        return func(*[_cast(a, code) for a in args],
                    **{k: _cast(v, code) for k, v in kwargs.items()})
    return amp_function


# --- state ----------------------------------------------------------------------

_REGISTERED = {}  # (module, name) -> Category, applied by every init()


@dataclass
class _Active:
    key: tuple             # what init() was called with, resolved
    settings: _Settings
    patches: list          # (namespace, attribute, original function), in patch order


_active = None


def _register(module, name, category):
    func = getattr(module, name, None) if isinstance(name, str) else None
    if not callable(func):
        raise ValueError(f"{getattr(module, '__name__', module)!r} has no function {name!r} "
                         "to register")
    if _active is not None:
        raise RuntimeError(f"cannot register {name!r} while AMP is initialized; register "
                           "functions before mxamp.init() (or call mxamp.deinit() first)")
    known = _REGISTERED.get((module, name))
    if known not in (None, category):
        raise ValueError(f"{name!r} of {module.__name__!r} is already registered as "
                         f"{known.value}")
    _REGISTERED[(module, name)] = category


def register_lp16_function(module, name):
    """Make ``module.name`` cast its float arguments to the target dtype.

    From the next :func:`mxamp.init` on, for code the patch cannot see (a
    function of your own, or an MXNet function outside the patched
    namespaces); :func:`mxamp.deinit` restores it.

    Parameters
    ----------
    module : module or object
        Where the function lives.
    name : str
        Its attribute name there.

    Raises
    ------
    ValueError
        When ``module.name`` is missing or not callable.
    RuntimeError
        When AMP is on.
    """
    _register(module, name, Category.LOW)


def register_fp32_function(module, name):
    """Make ``module.name`` cast its float arguments to float32.

    From the next :func:`mxamp.init` on; :func:`mxamp.deinit` restores it.

    Parameters
    ----------
    module, name
        As for :func:`register_lp16_function`.
    """
    _register(module, name, Category.FP32)


def register_widest_function(module, name):
    """Make ``module.name`` cast its float arguments to the widest float type among them.

    From the next :func:`mxamp.init` on; :func:`mxamp.deinit` restores it.

    Parameters
    ----------
    module, name
        As for :func:`register_lp16_function`.
    """
    _register(module, name, Category.WIDEST)


def _blocks_with_graphs():
    """Names of live hybridized blocks already holding a built graph (and
    SymbolBlocks, whose graph is fixed when they are made)."""
    gc.collect()
    return sorted({obj.name for obj in gc.get_objects()
                   if isinstance(obj, HybridBlock) and obj._cached_graph})


def _policy(target_dtype, target_precision_ops, conditional_fp32_ops, fp32_ops):
    """init()'s options resolved as for conversion; for bfloat16 the ops of
    NO_BF16_BACKWARD are moved to the float32 list."""
    try:
        policy = resolve(target_dtype, target_dtype_ops=target_precision_ops, fp32_ops=fp32_ops,
                         conditional_fp32_ops=conditional_fp32_ops)
    except (TypeError, ValueError) as err:  # named as init's argument is
        raise type(err)(str(err).replace("target_dtype_ops", "target_precision_ops")) from None
    if policy.target_dtype != "bfloat16":
        return policy
    no_backward = policy.low & NO_BF16_BACKWARD.keys()
    if target_precision_ops is not None and no_backward:
        reasons = "; ".join(f"{op}: {NO_BF16_BACKWARD[op]}" for op in sorted(no_backward))
        raise ValueError(f"target_precision_ops lists {sorted(no_backward)}, which cannot "
                         f"train in bfloat16: {reasons}")
    return policy.with_fp32(NO_BF16_BACKWARD.keys())


def _symbol_ctx(ctx):
    """Context Symbol calls are checked on: `ctx`, else the CPU on a machine
    without GPUs (where graphs can only run on the CPU), else none (the full
    lists, as ``convert_symbol`` gives)."""
    if ctx is not None and not isinstance(ctx, mx.Context):
        raise TypeError(f"ctx must be an mxnet.Context (e.g. mx.cpu()) or None, got {ctx!r}")
    if ctx is None and mx.context.num_gpus() == 0:
        return mx.cpu()
    if ctx is not None and ctx.device_type == "gpu" and ctx.device_id >= mx.context.num_gpus():
        return None  # a GPU this machine lacks cannot be asked: the full lists
    return ctx


def init(target_dtype="float16", target_precision_ops=None, conditional_fp32_ops=None,
         fp32_ops=None, ctx=None):
    """Turn on mixed precision for the operators called from now on.

    Replaces the functions of every listed operator in ``mx.nd``, ``mx.sym``
    and their ``op``, ``_internal``, ``contrib``, ``linalg``, ``sparse``,
    ``image`` and ``random`` namespaces by wrappers that cast the inputs as
    conversion does. An operator stays float32 where MXNet's type inference
    rejects the target dtype or the device has no kernel for it (asked once
    per operator, attributes and context). For bfloat16 the operators of
    :data:`mxamp.training.NO_BF16_BACKWARD` stay float32. Call it before the
    model's first forward pass.

    Parameters
    ----------
    target_dtype : str
        ``"float16"`` or ``"bfloat16"``.
    target_precision_ops, conditional_fp32_ops, fp32_ops : list, optional
        Each replaces the default list of its kind, as in
        ``mxnet.contrib.amp.init`` (the same validation as conversion's).
    ctx : mxnet.Context, optional
        (mxamp) The device hybridized blocks will run on: operators without a
        low-precision kernel there stay float32. By default the CPU on a
        machine without GPUs, else no check.

    Raises
    ------
    RuntimeError
        When AMP is on with other settings (call :func:`mxamp.deinit`
        first; the same settings again do nothing), or when hybridized blocks
        already built their graph, which the patch cannot reach (call
        ``.hybridize()`` on them again, or ``init`` before their first
        forward pass).
    """
    _start(target_dtype, target_precision_ops, conditional_fp32_ops, fp32_ops, ctx)


def _start(target_dtype, target_precision_ops, conditional_fp32_ops, fp32_ops, ctx):
    """init(); True when it patched, False when AMP was already on as asked."""
    global _active
    settings = _Settings(_policy(target_dtype, target_precision_ops, conditional_fp32_ops,
                                 fp32_ops), _symbol_ctx(ctx))
    key = (settings, tuple(sorted(_REGISTERED.items(), key=str)))
    if _active is not None:
        if _active.key == key:
            return False
        raise RuntimeError(f"AMP is already initialized with different settings (target_dtype "
                           f"{_active.settings.policy.target_dtype!r}); call mxamp.deinit() "
                           "first")
    stale = _blocks_with_graphs()
    if stale:
        raise RuntimeError(
            f"AMP cannot reach blocks that already built their graph: {stale}. Call init() "
            "before their first forward pass, or call .hybridize() on them again (it drops "
            "the cached graph) before init(); SymbolBlocks keep their loaded graph, so "
            "convert them with mxamp.convert_hybrid_block or delete them")
    patches, wrapped, listed = [], {}, settings.policy.listed_ops
    for space, attr, op, is_symbol in _op_functions():
        if op not in listed:
            continue
        original = vars(space)[attr]
        if id(original) not in wrapped:  # one wrapper per function object
            # Whatever its attributes: the widest list comes before the conditions.
            if settings.cast(op) is Cast.WIDEST:
                wrapped[id(original)] = _widest(original, settings)
            else:
                wrapped[id(original)] = (_symbol_op if is_symbol else _ndarray_op)(
                    original, op, settings)
        patches.append((space, attr, original))
        setattr(space, attr, wrapped[id(original)])
    for (module, name), category in _REGISTERED.items():
        original = getattr(module, name)
        patches.append((module, name, original))
        setattr(module, name, _cast_all(original, category, settings))
    _active = _Active(key, settings, patches)
    log.info("AMP on: %s, %d functions wrapped", settings.policy.target_dtype, len(patches))
    return True


def deinit():
    """Put back every function :func:`mxamp.init` replaced.

    A no-op when AMP is off. Graphs that hybridized blocks built meanwhile
    keep their casts (``.hybridize()`` rebuilds them).
    """
    global _active
    if _active is None:
        return
    for space, attr, original in reversed(_active.patches):
        setattr(space, attr, original)
    _active = None


@contextlib.contextmanager
def amp_scope(target_dtype="float16", target_precision_ops=None, conditional_fp32_ops=None,
              fp32_ops=None, ctx=None):
    """:func:`mxamp.init` for the body of a ``with`` block.

    The original functions are back afterwards, unless AMP was already on
    with these settings before.

    Parameters
    ----------
    target_dtype, target_precision_ops, conditional_fp32_ops, fp32_ops, ctx : optional
        As for :func:`mxamp.init`.
    """
    started = _start(target_dtype, target_precision_ops, conditional_fp32_ops, fp32_ops, ctx)
    try:
        yield
    finally:
        if started:
            deinit()
