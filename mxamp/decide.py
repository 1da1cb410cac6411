"""The decision pass: walks a symbol's graph once in topological order and
decides, per operator input and per graph output, whether to keep the entry or
cast it. The C++ pass only applies these decisions.

Dtype tracking follows ``mxnet.contrib.amp`` (MXNet 1.9.1) so that the same
lists give the same cast placement, with these differences: entries whose
dtype is known to be non-float are never cast, an operator whose type
inference fails in low precision falls back to float32 instead of aborting,
and ``cast_optional_params`` stores a parameter in low precision only when
every consumer wants it so.
"""
import ctypes
import functools
import json
from dataclasses import dataclass, field

from mxnet.base import _LIB, MXNetError, c_array, c_str_array, check_call, mx_uint

from . import probe
from .policy import CASTABLE, DTYPE_CODES, FLOAT32, Category

KEEP, LOW, FP32, MULTI = ".", "l", "f", "m"
SELF, CAST = "self", "cast"  # an entry is of a dtype itself, or through a cast


def _infer_output_codes(sym, known):
    """Output dtype codes of `sym` given {input name: code}, by MXNet's partial
    type inference (called directly: the Python wrapper drops bfloat16)."""
    keys = sorted(known)
    counts = [mx_uint() for _ in range(3)]
    data = [ctypes.POINTER(ctypes.c_int)() for _ in range(3)]
    complete = ctypes.c_int()
    check_call(_LIB.MXSymbolInferTypePartial(
        sym.handle, mx_uint(len(keys)), c_str_array(keys),
        c_array(ctypes.c_int, [known[k] for k in keys]),
        ctypes.byref(counts[0]), ctypes.byref(data[0]), ctypes.byref(counts[1]),
        ctypes.byref(data[1]), ctypes.byref(counts[2]), ctypes.byref(data[2]),
        ctypes.byref(complete)))
    return [data[1][i] for i in range(counts[1].value)]


def infer_entry_types(sym, known):
    """{(node id, output index): dtype code} for every entry of `sym`, given
    {input name: dtype code}; -1 where MXNet cannot tell."""
    internals = sym.get_internals()
    heads = json.loads(internals.tojson(remove_amp_cast=False))["heads"]
    inputs = set(sym.list_inputs())
    known = {k: v for k, v in known.items() if k in inputs and v >= 0}
    try:
        out_types = _infer_output_codes(internals, known)
    except MXNetError as err:
        raise ValueError(f"MXNet's type inference fails on the symbol: {err}") from None
    return {(h[0], h[1]): t for h, t in zip(heads, out_types)}


@functools.lru_cache(maxsize=4096)
def op_types(op, attrs, n_inputs, in0, fixed=()):
    """Runs MXNet's own type inference on one node with input 0 of dtype `in0`
    and the inputs in `fixed` ((index, code) pairs) of known dtypes.

    Returns (input dtypes, output dtypes, mutable input indices), or None when
    inference rejects that dtype. `attrs` is a sorted tuple of items.
    """
    names = [f"in{i}" for i in range(n_inputs)]
    try:
        sym = probe.single_op(op, attrs, n_inputs)
        aux = sym.list_auxiliary_states()
        known = {f"in{i}": code for i, code in fixed}
        if n_inputs and in0 >= 0:
            known["in0"] = in0
        types = infer_entry_types(sym, known)
    except (MXNetError, ValueError):
        return None
    in_types = [types[(i, 0)] for i in range(n_inputs)]
    out_types = [t for (nid, _), t in sorted(types.items()) if nid == n_inputs]
    return in_types, out_types, frozenset(names.index(a) for a in aux)


@dataclass
class Decisions:
    """Cast codes per operator node (by node id) and per graph output."""
    nodes: dict = field(default_factory=dict)
    outputs: str = ""
    categories: dict = field(default_factory=dict)   # node id -> Category
    fallbacks: dict = field(default_factory=dict)    # node name -> why it stays float32
    low_params: list = field(default_factory=list)   # params stored in low precision


class _Walker:
    """Tracks which entries are known to be float32 / low precision."""

    def __init__(self, graph, policy, entry_types, data_names, cast_optional_params, ctx):
        self.nodes = graph["nodes"]
        self.heads = graph["heads"]
        self.policy = policy
        self.target = DTYPE_CODES[policy.target_dtype]
        self.entry_types = entry_types
        self.n_outputs = {}
        for nid, idx in entry_types:
            self.n_outputs[nid] = max(self.n_outputs.get(nid, 0), idx + 1)
        self.data_names = set(data_names)
        self.cast_optional_params = cast_optional_params
        self.ctx = ctx
        self.known = {FP32: {}, LOW: {}}  # code -> {entry: SELF | CAST}
        self.result = Decisions()

    def run(self):
        for nid, node in enumerate(self.nodes):
            if node["op"] == "null":
                if node["name"] in self.policy.excluded:
                    self.known[FP32][(nid, 0)] = SELF
                elif not self.policy.keep_io_types and node["name"] in self.data_names:
                    self.known[LOW][(nid, 0)] = SELF  # the caller feeds low precision
                continue
            self.visit(nid, node)
        if self.policy.keep_io_types:
            self.result.outputs = "".join(self.cast_to(FP32, tuple(h[:2])) for h in self.heads)
        else:
            self.result.outputs = KEEP * len(self.heads)
        if self.cast_optional_params:
            self.keep_low_params()
        return self.result

    def visit(self, nid, node):
        attrs = node.get("attrs", {})
        inputs = [tuple(e[:2]) for e in node["inputs"]]
        category = self.policy.category(node["op"], node["name"], attrs)
        handler = {Category.FP32: self.fp32, Category.CONDITIONAL: self.fp32,
                   Category.LOW: self.low, Category.WIDEST: self.widest,
                   Category.NEUTRAL: self.neutral}[category]
        codes, category = handler(nid, node, attrs, inputs, category)
        self.result.categories[nid] = category
        if codes.strip(KEEP):
            self.result.nodes[nid] = codes

    def types(self, node, attrs, inputs, in0):
        # Non-float inputs are passed on: some ops (take, one_hot…) need them.
        fixed = tuple((i, self.entry_types[e]) for i, e in enumerate(inputs)
                      if i and self.entry_types.get(e, -1) not in CASTABLE | {-1})
        return op_types(node["op"], tuple(sorted(attrs.items())), len(inputs), in0, fixed)

    def record_outputs(self, nid, out_types):
        for idx, dtype in enumerate(out_types):
            if dtype == self.target:
                self.known[LOW][(nid, idx)] = SELF
            elif dtype == FLOAT32:
                self.known[FP32][(nid, idx)] = SELF

    def cast_to(self, code, entry):
        """Code for feeding `entry` in dtype `code`; remembers casts it creates."""
        state = self.known[code].get(entry)
        if state == SELF:
            return KEEP
        if self.entry_types.get(entry, -1) not in CASTABLE | {-1}:
            return KEEP  # never cast integer or other non-float entries
        self.known[code][entry] = CAST
        return code

    def is_variable(self, entry):
        return self.nodes[entry[0]]["op"] == "null"

    def fp32(self, nid, node, attrs, inputs, category):
        mutable = frozenset()
        if category is Category.CONDITIONAL:
            info = self.types(node, attrs, inputs, -1)
            mutable = info[2] if info else frozenset()
        for idx in range(self.num_outputs(nid)):
            self.known[FP32][(nid, idx)] = SELF
        codes = []
        for i, e in enumerate(inputs):
            # The reference leaves variables of plain float32 ops uncast.
            skip = i in mutable or (category is Category.FP32 and self.is_variable(e)
                                    and e not in self.known[FP32]
                                    and self.dtype_of(e) == FLOAT32)
            codes.append(KEEP if skip else self.cast_to(FP32, e))
        return "".join(codes), category

    def low(self, nid, node, attrs, inputs, category):
        info = self.types(node, attrs, inputs, self.target)
        if info is None:
            self.result.fallbacks[node["name"]] = "type inference rejects the target dtype"
            return self.fp32(nid, node, attrs, inputs, Category.FP32)
        in_types, out_types, mutable = info
        if self.ctx is not None and probe.has_kernel(
                node["op"], tuple(sorted(attrs.items())), tuple(in_types),
                self.policy.target_dtype, self.ctx) is False:
            self.result.fallbacks[node["name"]] = f"no {self.policy.target_dtype} kernel on {self.ctx}"
            return self.fp32(nid, node, attrs, inputs, Category.FP32)
        self.record_outputs(nid, out_types)
        codes = []
        for i, e in enumerate(inputs):
            if e in self.known[LOW] or (i not in mutable and in_types[i] in (self.target, -1)):
                codes.append(self.cast_to(LOW, e))
            else:
                codes.append(KEEP)  # e.g. BatchNorm's statistics stay float32
        return "".join(codes), category

    def widest(self, nid, node, attrs, inputs, category):
        if not inputs:
            return "", category
        known = [e in self.known[LOW] or e in self.known[FP32] for e in inputs]
        if not all(known):
            return MULTI * len(inputs), category
        code = FP32 if any(e in self.known[FP32] for e in inputs) else LOW
        dtype = FLOAT32 if code == FP32 else self.target
        self.record_outputs(nid, [dtype] * self.num_outputs(nid))
        return "".join(self.cast_to(code, e) for e in inputs), category

    def neutral(self, nid, node, attrs, inputs, category):
        if not inputs:
            return "", category
        in0 = self.dtype_of(inputs[0])
        if in0 is None:
            return KEEP * len(inputs), category
        info = self.types(node, attrs, inputs, in0)
        if info is None or any(t in CASTABLE and self.dtype_of(e) not in (None, t)
                               for e, t in zip(inputs[1:], info[0][1:])):
            # The inputs' dtypes disagree where the op needs them equal (e.g. a
            # low-precision input next to a float32 weight): run it in float32.
            # The reference leaves such graphs inconsistent.
            self.result.fallbacks[node["name"]] = "its inputs' dtypes disagree"
            return self.fp32(nid, node, attrs, inputs, Category.FP32)
        if not self.is_variable(inputs[0]):
            self.record_outputs(nid, info[1])
        return KEEP * len(inputs), category

    def dtype_of(self, entry):
        """The dtype an entry itself has, where known (variables are float32
        unless declared otherwise). A cast of the entry elsewhere does not
        count: a neutral op reads the entry, not the cast (the reference
        confuses the two and mislabels what follows)."""
        if self.known[LOW].get(entry) == SELF:
            return self.target
        if self.known[FP32].get(entry) == SELF:
            return FLOAT32
        if self.is_variable(entry):
            declared = self.entry_types.get(entry, -1)
            return FLOAT32 if declared < 0 else declared
        return None

    def num_outputs(self, nid):
        return self.n_outputs.get(nid, 1)

    def keep_low_params(self):
        """Drops the runtime cast of params whose every consumer casts them to
        low precision: the param itself is stored in low precision instead."""
        uses = {}
        for nid, node in enumerate(self.nodes):
            for slot, e in enumerate(node["inputs"]):
                src = self.nodes[e[0]]
                if src["op"] == "null" and src["name"] not in self.data_names:
                    codes = self.result.nodes.get(nid, KEEP * len(node["inputs"]))
                    uses.setdefault(e[0], []).append((nid, slot, codes[slot]))
        heads = {h[0] for h in self.heads}
        for vid, consumers in sorted(uses.items()):
            if vid in heads or any(code != LOW for _, _, code in consumers):
                continue
            for nid, slot, _ in consumers:
                codes = self.result.nodes[nid]
                self.result.nodes[nid] = codes[:slot] + KEEP + codes[slot + 1:]
            self.result.low_params.append(self.nodes[vid]["name"])


def decide(graph, policy, entry_types, data_names, cast_optional_params=False, ctx=None):
    """Cast decisions for a graph in MXNet's JSON form (see :class:`Decisions`).
    With a context, low-precision ops without a kernel there stay float32."""
    return _Walker(graph, policy, entry_types, data_names, cast_optional_params, ctx).run()
