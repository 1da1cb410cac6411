"""Gluon adapters: a hybridized block to a model (symbol and parameters) and
back to a ``SymbolBlock``; convert_hybrid_block; float32 scopes.

``with mxamp.fp32_scope(): self.head = nn.Dense(10)`` marks every block
created in the ``with`` body; :func:`mxamp.keep_fp32` marks blocks that
already exist. :func:`convert_hybrid_block` keeps the graph nodes of marked
blocks (found by the block's name prefix, which MXNet gives every node the
block creates) in float32 by adding them to ``excluded_sym_names``.
"""
import contextlib
import functools
import logging
import os
import threading

import mxnet as mx
from mxnet.gluon import Block, HybridBlock, SymbolBlock

from . import backends
from .convert import convert_model
from .dtypes import DTYPE_CODES, FLOAT32, LOW_CODES, normalize_dtype, to_code
from .errors import OptionError, OptionTypeError, mxnet_logs_to_logging
from .graph import graph_json

log = logging.getLogger(__name__)


class AmpSymbolBlock(SymbolBlock):
    """The converted block. ``export`` keeps the amp_cast nodes by default:
    MXNet's default drops them, and the exported model then no longer loads
    with its low-precision parameters."""

    def export(self, path, epoch=0, remove_amp_cast=False):
        """MXNet's export, but the parameters are the block's own: MXNet 1.9.1
        reads them from the cached op, which exists only once the block has
        run, and before that writes a params file holding none. Each file is
        written whole (to a temporary name, then renamed) or not at all."""
        sym = self._cached_graph[1]
        args, aux = set(sym.list_arguments()), set(sym.list_auxiliary_states())
        params = {f"{'arg' if p.name in args else 'aux'}:{p.name}": p._reduce()
                  for p in self.collect_params().values() if p.name in args | aux}
        save = mx.npx.save if mx.util.is_np_array() else mx.nd.save
        files = {f"{path}-symbol.json": lambda f: sym.save(f, remove_amp_cast=remove_amp_cast),
                 f"{path}-{epoch:04d}.params": lambda f: save(f, params)}
        try:
            for name, write in files.items():
                write(name + ".partial")
            for name in files:
                os.replace(name + ".partial", name)
        finally:
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(name + ".partial")


def model_of(block, purpose):
    """(symbol, arg_params, aux_params, input names) of a Gluon block that has
    been hybridized and run forward once, its parameters copied to the CPU;
    `purpose` ("converting it" ...) completes the error messages."""
    if not isinstance(block, HybridBlock):
        raise OptionTypeError(f"block must be a gluon HybridBlock, got {type(block).__name__}")
    if not block._cached_graph:
        raise RuntimeError(f"block {block.name!r} has no cached graph: call block.hybridize() "
                           f"and run one forward pass before {purpose}")
    inputs, sym = block._cached_graph
    params = {p.name: p for p in block.collect_params().values()}
    needed = set(sym.list_inputs()) - {i.name for i in inputs}
    uninitialized = sorted(n for n in needed & params.keys() if params[n]._data is None)
    if uninitialized:
        raise RuntimeError(f"block {block.name!r} has uninitialized parameters {uninitialized}: "
                           f"initialize the block or load its parameters before {purpose}")
    aux_names = set(sym.list_auxiliary_states())
    arg_params = {n: params[n]._reduce() for n in needed - aux_names if n in params}
    aux_params = {n: params[n]._reduce() for n in needed & aux_names if n in params}
    return sym, arg_params, aux_params, [i.name for i in inputs]


def symbol_block(sym, inputs, arg_params, aux_params, ctx):
    """An :class:`AmpSymbolBlock` of `sym` holding the given parameters, each
    in its own dtype, on `ctx`."""
    result = AmpSymbolBlock(sym, inputs)
    values = {**arg_params, **aux_params}
    for name, param in result.collect_params().items():
        if name in values:
            param.cast(values[name].dtype)
    result.collect_params().load_dict(
        {**{f"arg:{k}": v for k, v in arg_params.items()},
         **{f"aux:{k}": v for k, v in aux_params.items()}}, ctx=ctx)
    return result


@mxnet_logs_to_logging()
def convert_hybrid_block(block, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False, widest_dtype_ops=None,
                         keep_io_types=True, follow_ops=None, rules=None, input_shapes=None,
                         backend=None, target_device=None, measure_kernels=False,
                         backend_compute=None):
    """Converts a hybridized Gluon block into a mixed precision ``SymbolBlock``
    (an :class:`AmpSymbolBlock`, whose ``export`` keeps the casts).

    The block must have been hybridized and run forward once. Parameters are
    placed on `ctx`, by default the context of the block's own parameters.
    ``target_device`` (mxamp) is the device the result is for: by default
    `ctx`, and operators without a target-dtype kernel there stay float32
    (logged as a WARNING); another Context to check instead; or ``'any'`` for
    the full graph, e.g. a float16 model for a GPU built on a CPU-only machine
    (export it and load it there).
    Nodes of child blocks created inside :func:`mxamp.fp32_scope` (or marked
    with :func:`mxamp.keep_fp32`) stay float32. ``follow_ops``, ``rules``,
    ``input_shapes`` ({input name: shape}), ``measure_kernels``,
    ``backend_compute`` and ``backend`` as in :func:`convert_model`: with
    ``backend='onednn'`` the
    conversion is planned for the backend and the result runs its regions
    (on the CPU). The block itself is not modified.
    """
    backends.get(backend)  # an unknown name fails before any work
    sym, arg_params, aux_params, data_names = model_of(block, "converting it")
    excluded_sym_names = excluded_names(block, sym, excluded_sym_names)
    if ctx is None:
        ctx = next((p.list_ctx()[0] for p in block.collect_params().values()
                    if p._data is not None), mx.current_context())
    if target_device is None:
        target_device = ctx
    elif not (target_device == "any" or isinstance(target_device, mx.Context)):
        raise OptionError(f"target_device must be None, 'any' or an mxnet.Context, "
                          f"got {target_device!r}")
    options = dict(target_dtype=target_dtype, target_dtype_ops=target_dtype_ops,
                   fp32_ops=fp32_ops, conditional_fp32_ops=conditional_fp32_ops,
                   excluded_sym_names=excluded_sym_names,
                   cast_optional_params=cast_optional_params, data_names=data_names,
                   widest_dtype_ops=widest_dtype_ops,
                   ctx=None if target_device == "any" else target_device,
                   keep_io_types=keep_io_types, follow_ops=follow_ops, rules=rules,
                   input_shapes=input_shapes, measure_kernels=measure_kernels)
    converted, arg_params, aux_params = convert_model(
        sym, arg_params, aux_params, backend=backend, backend_compute=backend_compute, **options)
    # Inputs are declared in the dtype the converted graph expects.
    in_dtype = FLOAT32 if keep_io_types else DTYPE_CODES[normalize_dtype(target_dtype)]
    inputs = [mx.sym.var(n, attr={"__dtype__": str(in_dtype)}) for n in data_names]
    if backend is not None:
        return _block(converted, inputs, arg_params, aux_params, block, for_backend=True)
    result = _block(converted, inputs, arg_params, aux_params, block, ctx=ctx)
    # What apply_backend_block needs to plan the conversion for a backend.
    result._mxamp_plan = (sym, options)
    return result


def _block(sym, inputs, arg_params, aux_params, like, ctx=None, for_backend=False):
    """The hybridized :class:`AmpSymbolBlock` of a converted or partitioned
    model, returning outputs nested as block `like` does."""
    result = symbol_block(sym, inputs, arg_params, aux_params, mx.cpu() if for_backend else ctx)
    result._out_format = like._out_format
    if for_backend:
        # Static allocation keeps the regions' states (packed weights, plans)
        # across calls; without it MXNet recreates them on every forward.
        result.hybridize(static_alloc=True, static_shape=True)
    else:
        result.hybridize()
    return result


@mxnet_logs_to_logging()
def apply_backend_block(block, compute=None, backend="onednn"):
    """``apply_backend`` for a Gluon block: returns a new hybridized
    ``SymbolBlock`` (whose ``export`` keeps amp_cast nodes). `block` is a
    ``SymbolBlock`` (such as the one ``mxamp.convert_hybrid_block`` returns)
    or a hybridized ``HybridBlock`` that has run forward once. `compute` as
    for ``apply_backend``.

    A block from ``convert_hybrid_block`` was converted for MXNet's own
    kernels; with `compute` None or ``"bfloat16"`` its float32 graph is
    converted again with the same options, planned for the backend (see
    ``convert_model``'s ``backend`` and ``backend_compute``, which `compute`
    is), from the block's own parameters (widened to float32, exactly), so
    that what the backend runs is low precision whatever MXNet's kernels
    cost. Any other block is partitioned as it is."""
    sym, arg_params, aux_params, data_names = model_of(block, "applying the backend")
    in_attrs = sym.attr_dict()
    inputs = [mx.sym.var(n, attr=in_attrs.get(n)) for n in data_names]
    plan = getattr(block, "_mxamp_plan", None)
    # Only a bfloat16 conversion is planned again: the backend runs no float16.
    if plan is not None and compute in (None, "bfloat16") and \
            normalize_dtype(plan[1]["target_dtype"]) == "bfloat16":
        log.info("apply_backend_block: converting the float32 graph again, planned for the "
                 "%s backend", backend)
        float32_sym, options = plan
        out, arg_params, aux_params = convert_model(
            float32_sym, _widened(arg_params), _widened(aux_params), backend=backend,
            backend_compute=compute, **options)
    else:
        out, arg_params, aux_params = backends.get(backend).apply_backend(
            sym, arg_params, aux_params, compute)
    return _block(out, inputs, arg_params, aux_params, block, for_backend=True)


def _widened(params):
    """`params` with low-precision floats as float32 (exact)."""
    return {n: mx.nd.amp_cast(a, dtype="float32") if to_code(a.dtype) in LOW_CODES else a
            for n, a in params.items()}


# --- float32 scopes ----------------------------------------------------------

MARK = "_mxamp_fp32"  # the block attribute the converter looks for


_local = threading.local()  # per thread: how many scopes are open


_lock = threading.Lock()


_hook = {"scopes": 0, "init": None}  # open scopes in all threads; Block's own __init__


def keep_fp32(block):
    """Marks `block` (with all its children) to stay float32; returns it."""
    if not isinstance(block, Block):
        raise TypeError(f"keep_fp32 takes a gluon Block, got {type(block).__name__}")
    setattr(block, MARK, True)
    return block


def _marking_init(init):
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if getattr(_local, "depth", 0):
            setattr(self, MARK, True)
    return wrapper


@contextlib.contextmanager
def fp32_scope():
    """Blocks created inside this context (in this thread) stay float32 when
    their model is converted with :func:`mxamp.convert_hybrid_block`.

    Block construction is observed only while a scope is open; outside one,
    MXNet's ``Block.__init__`` is the original."""
    with _lock:
        if _hook["scopes"] == 0:
            _hook["init"] = Block.__init__
            Block.__init__ = _marking_init(Block.__init__)
        _hook["scopes"] += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
        with _lock:
            _hook["scopes"] -= 1
            if _hook["scopes"] == 0:
                Block.__init__ = _hook["init"]


def _marked_blocks(block, marked=False, seen=None):
    """Blocks under `block` that are marked or inside a marked block. Each has
    its own prefix: a child created outside its parent's name_scope does not
    share the parent's."""
    seen = set() if seen is None else seen
    if id(block) in seen:
        return []
    seen.add(id(block))
    marked = marked or getattr(block, MARK, False)
    below = [b for child in block._children.values() for b in _marked_blocks(child, marked, seen)]
    return ([block] if marked else []) + below


def excluded_names(block, sym, excluded_sym_names):
    """`excluded_sym_names` plus the operator nodes of `sym` created by marked
    blocks under `block`. A value of the wrong type is returned as it is, for
    the converter's own validation to reject."""
    marked = _marked_blocks(block)
    if not marked or not (excluded_sym_names is None
                          or isinstance(excluded_sym_names, (list, tuple, set, frozenset))):
        return excluded_sym_names
    unnamed = [b.name for b in marked if not b.prefix]
    if unnamed:
        raise ValueError(f"blocks {unnamed} are marked float32 but have an empty prefix, so "
                         "their graph nodes cannot be told apart; give them a prefix")
    prefixes = tuple(sorted(b.prefix for b in marked))
    nodes = graph_json(sym)["nodes"]
    names = [n["name"] for n in nodes if n["op"] != "null" and n["name"].startswith(prefixes)]
    log.info("float32 scope keeps %d nodes of %s in float32", len(names), list(prefixes))
    given = [] if excluded_sym_names is None else list(excluded_sym_names)
    return given + [n for n in names if n not in given]
