"""Keeping parts of a Gluon model in float32 from inside the model's code.

``with mxamp.fp32_scope(): self.head = nn.Dense(10)`` marks every block
created in the ``with`` body; :func:`mxamp.keep_fp32` marks blocks that
already exist. :func:`mxamp.convert_hybrid_block` keeps the graph nodes of
marked blocks (found by the block's name prefix, which MXNet gives every node
the block creates) in float32 by adding them to ``excluded_sym_names``.
"""
import contextlib
import functools
import json
import logging
import threading

from mxnet.gluon import Block

log = logging.getLogger(__name__)

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
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    names = [n["name"] for n in nodes if n["op"] != "null" and n["name"].startswith(prefixes)]
    log.info("float32 scope keeps %d nodes of %s in float32", len(names), list(prefixes))
    given = [] if excluded_sym_names is None else list(excluded_sym_names)
    return given + [n for n in names if n not in given]
