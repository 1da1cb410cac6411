"""Gluon adapters: a hybridized block to a model (symbol and parameters) and
back to a ``SymbolBlock``; convert_hybrid_block; float32 scopes.

``with mxamp.fp32_scope(): self.head = nn.Dense(10)`` marks every block
created in the ``with`` body; :func:`mxamp.keep_fp32` marks blocks that
already exist. :func:`mxamp.convert_hybrid_block` keeps the graph nodes of marked
blocks (found by the block's name prefix, which MXNet gives every node the
block creates) in float32 by adding them to ``excluded_sym_names``.
"""
import contextlib
import dataclasses
import functools
import logging
import os
import threading

import mxnet as mx
from mxnet.gluon import Block, HybridBlock, SymbolBlock

from . import backends
from .convert.api import convert_model_with
from .convert.options import ConversionOptions
from .dtypes import DTYPE_CODES, FLOAT32, LOW_CODES, to_code
from .errors import OptionError, OptionTypeError, memory_for, mxnet_logs_to_logging, wait_for
from .graph import graph_json

log = logging.getLogger(__name__)


class AmpSymbolBlock(SymbolBlock):
    """The ``SymbolBlock`` a conversion returns.

    Its ``export`` keeps the ``amp_cast`` nodes, which MXNet's own default
    drops (the exported model then no longer loads with its low-precision
    parameters).

    Parameters
    ----------
    outputs, inputs, params
        As for ``mxnet.gluon.SymbolBlock``: the converted symbol, its data
        inputs and, optionally, parameters to share.
    """

    def export(self, path, epoch=0, remove_amp_cast=False):
        """Write ``PATH-symbol.json`` and ``PATH-NNNN.params``, each whole.

        Unlike MXNet's export, the parameters are the block's own: MXNet 1.9.1
        reads them from the cached op, which exists only once the block has
        run, and before that writes a params file holding none. Each file is
        written to a temporary name, then renamed, or not at all.

        Parameters
        ----------
        path : str
            The prefix of the two files.
        epoch : int
            The epoch number in the parameters file's name.
        remove_amp_cast : bool
            MXNet's option, False here: the casts stay in the symbol file.
        """
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
    """The model inside a Gluon block that has been hybridized and run once.

    Parameters
    ----------
    block : mxnet.gluon.HybridBlock
        The block.
    purpose : str
        What the caller is doing ("converting it"), for the error messages.

    Returns
    -------
    tuple
        ``(sym, arg_params, aux_params, data_names)``, the parameters copied to
        the CPU.

    Raises
    ------
    RuntimeError
        When the block has no cached graph or uninitialized parameters.
    """
    return _model(block, purpose)[:4]


def _model(block, purpose, copied=True):
    """model_of's answer and the block's parameters ({name: Parameter}),
    collected once: Gluon walks every child block to collect them. Unless
    `copied`, a parameter held in one array on the CPU is given as that
    array itself, for a caller that only reads it."""
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
    arrays = {n: _on_cpu(params[n], copied) for n in needed & params.keys()}
    arg_params = {n: a for n, a in arrays.items() if n not in aux_names}
    aux_params = {n: a for n, a in arrays.items() if n in aux_names}
    return sym, arg_params, aux_params, [i.name for i in inputs], params


def _on_cpu(param, copied):
    """A parameter's value on the CPU: a copy (Parameter._reduce, which
    averages the copies on several devices), or unless `copied` its own
    array, where it has one on the CPU."""
    if not copied and param._stype == "default" and param.list_ctx() == [mx.cpu()]:
        return param.data()
    return param._reduce()


def symbol_block(sym, inputs, arg_params, aux_params, ctx):
    """An :class:`AmpSymbolBlock` of a symbol and its parameters.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        The model.
    inputs : list of mxnet.symbol.Symbol
        Its data inputs.
    arg_params, aux_params : dict of str to mxnet.nd.NDArray
        Its parameters, each kept in its own dtype.
    ctx : mxnet.Context
        Where the parameters live.

    Returns
    -------
    AmpSymbolBlock
    """
    result = AmpSymbolBlock(sym, inputs)
    values = {**arg_params, **aux_params}
    params = result.collect_params()
    for name, param in params.items():
        if name in values:
            param.cast(values[name].dtype)
    params.load_dict(
        {**{f"arg:{k}": v for k, v in arg_params.items()},
         **{f"aux:{k}": v for k, v in aux_params.items()}}, ctx=ctx)
    wait_for([a for p in params.values() for a in p.list_data()])
    return result


@mxnet_logs_to_logging()
def convert_hybrid_block(block, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False, widest_dtype_ops=None,
                         keep_io_types=True, follow_ops=None, rules=None, input_shapes=None,
                         backend=None, target_device=None, measure_kernels=False,
                         backend_compute=None):
    """Convert a hybridized Gluon block to mixed precision.

    The block must have been hybridized and run forward once. Nodes of child
    blocks created inside :func:`mxamp.fp32_scope` (or marked with
    :func:`mxamp.keep_fp32`) stay float32. The block itself is not modified.

    Parameters
    ----------
    block : mxnet.gluon.HybridBlock
        The float32 block.
    target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops : optional
        As in :func:`mxamp.convert_symbol`.
    excluded_sym_names, cast_optional_params, widest_dtype_ops : optional
        As in :func:`mxamp.convert_symbol`.
    ctx : mxnet.Context, optional
        Where the result's parameters live; by default where the block's own
        parameters live (``mxnet.contrib.amp`` defaults to ``gpu(0)``).
    keep_io_types, follow_ops, rules, input_shapes, measure_kernels : optional
        As in :func:`mxamp.convert_symbol`.
    backend, backend_compute : optional
        As in :func:`mxamp.convert_model`: with ``backend="onednn"`` the
        conversion is planned for the oneDNN backend and the result runs its
        regions (on the CPU).
    target_device : mxnet.Context or "any", optional
        (mxamp) The device the result is for: by default `ctx`, whose missing
        kernels keep operators in float32 (named in a WARNING); another
        context to check instead; or ``"any"`` for the full graph, e.g. a
        float16 model for a GPU built on a machine without one (export it and
        load it there).

    Returns
    -------
    AmpSymbolBlock
        A hybridized block of the converted model.
    """
    backends.get(backend)  # an unknown name fails before any work
    # The conversion only reads the parameters (symbol_block copies them);
    # a backend is given copies, which it may read in place.
    with memory_for("reading the block's model"):
        sym, arg_params, aux_params, data_names, params = _model(block, "converting it",
                                                                 copied=backend is not None)
    ctx = _params_context(params) if ctx is None else ctx
    options = ConversionOptions(
        target_dtype=target_dtype, target_dtype_ops=target_dtype_ops, fp32_ops=fp32_ops,
        conditional_fp32_ops=conditional_fp32_ops,
        excluded_sym_names=excluded_names(block, sym, excluded_sym_names),
        data_names=data_names, cast_optional_params=cast_optional_params,
        widest_dtype_ops=widest_dtype_ops, ctx=_device_ctx(target_device, ctx),
        keep_io_types=keep_io_types, follow_ops=follow_ops, rules=rules,
        input_shapes=input_shapes, backend=backend, measure_kernels=measure_kernels,
        backend_compute=backend_compute)
    converted, arg_params, aux_params = convert_model_with(sym, arg_params, aux_params, options)
    # Inputs are declared in the dtype the converted graph expects.
    in_dtype = FLOAT32 if keep_io_types else DTYPE_CODES[options.target_dtype]
    inputs = [mx.sym.var(n, attr={"__dtype__": str(in_dtype)}) for n in data_names]
    with memory_for("loading the converted model into a block"):
        if backend is not None:
            return _block(converted, inputs, arg_params, aux_params, block, for_backend=True)
        result = _block(converted, inputs, arg_params, aux_params, block, ctx=ctx)
    # What apply_backend_block needs to plan the conversion for a backend.
    result._mxamp_plan = (sym, options)
    return result


def _params_context(params):
    """Where the first initialized of `params` lives (else the current context)."""
    return next((p.list_ctx()[0] for p in params.values() if p._data is not None),
                mx.current_context())


def _device_ctx(target_device, ctx):
    """The ctx a conversion of a block for `target_device` is for: `ctx` by
    default, None for "any"."""
    if target_device is None:
        return ctx
    if not (target_device == "any" or isinstance(target_device, mx.Context)):
        raise OptionError(f"target_device must be None, 'any' or an mxnet.Context, "
                          f"got {target_device!r}")
    return None if target_device == "any" else target_device


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
    """Run a Gluon block on an execution backend.

    A block :func:`mxamp.convert_hybrid_block` made was converted for MXNet's
    own kernels: with `compute` None or ``"bfloat16"`` its float32 graph is
    converted again with the same options, planned for the backend, from
    the block's own parameters (widened to float32, exactly), so that what
    the backend runs is low precision whatever MXNet's kernels cost. Any
    other block is partitioned as it is.

    Parameters
    ----------
    block : mxnet.gluon.HybridBlock
        A ``SymbolBlock`` (such as a conversion returns) or a hybridized block
        that has run forward once. It is not modified.
    compute : str, optional
        What the regions compute in, as for
        :func:`mxamp.backends.onednn.apply_backend`.
    backend : str
        The backend's name (``"onednn"``).

    Returns
    -------
    AmpSymbolBlock
        A hybridized block (static allocation: the regions' packed weights and
        primitives live across calls). Loading its export needs the backend's
        library loaded first (:func:`mxamp.load` does that).
    """
    sym, arg_params, aux_params, data_names = model_of(block, "applying the backend")
    in_attrs = sym.attr_dict()
    inputs = [mx.sym.var(n, attr=in_attrs.get(n)) for n in data_names]
    plan = getattr(block, "_mxamp_plan", None)
    # Only a bfloat16 conversion is planned again: the backend runs no float16.
    if plan is not None and compute in (None, "bfloat16") and \
            plan[1].target_dtype == "bfloat16":
        log.info("apply_backend_block: converting the float32 graph again, planned for the "
                 "%s backend", backend)
        float32_sym, options = plan
        options = dataclasses.replace(options, backend=backend, backend_compute=compute)
        out, arg_params, aux_params = convert_model_with(
            float32_sym, _widened(arg_params), _widened(aux_params), options)
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
    """Mark a block, with all its children, to stay float32 when converted.

    Parameters
    ----------
    block : mxnet.gluon.Block
        The block to mark.

    Returns
    -------
    mxnet.gluon.Block
        `block` itself.

    Raises
    ------
    TypeError
        When `block` is no Gluon block.
    """
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
    """Keep the blocks created inside this context float32.

    Blocks created in the ``with`` body (in this thread) stay float32 when
    their model is converted with :func:`mxamp.convert_hybrid_block`. Block
    construction is observed only while a scope is open; outside one, MXNet's
    ``Block.__init__`` is the original.

    Examples
    --------
    ::

        with mxamp.fp32_scope():
            self.head = nn.Dense(10)
    """
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
    """The names a conversion of `block` keeps in float32.

    Parameters
    ----------
    block : mxnet.gluon.Block
        The block being converted.
    sym : mxnet.symbol.Symbol
        Its graph.
    excluded_sym_names : list of str or None
        The caller's own exclusions (a value of the wrong type is returned as
        it is, for the converter's validation to reject).

    Returns
    -------
    list of str
        `excluded_sym_names`, then the operator nodes of `sym` that marked
        blocks under `block` created.
    """
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
