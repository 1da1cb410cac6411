"""The decision pass: walks a symbol's graph in topological order and
decides, per operator input and per graph output, whether to keep the entry or
cast it. The C++ pass only applies these decisions. User rules are evaluated
here, before the walk, into per-node categories. With
``cast_optional_params`` the walk repeats until the set of parameters stored
in low precision is consistent with their consumers (see ``_Walker.run``).
What the walk knows of each entry is held by one :class:`_Entry`.

Control-flow bodies (``_foreach``, ``_while_loop``, ``_cond``) are walked by
the same policy, each by a walker of its own (see ``_Walker.control_flow``):
loop state and every output keep float32 across the node's boundary, and a
loop-invariant input that every body reads only in low precision is cast
once, before the node.

Dtype tracking follows ``mxnet.contrib.amp`` (MXNet 1.9.1) so that the same
lists give the same cast placement, with these differences: entries whose
dtype is known to be non-float are never cast, an operator whose type
inference fails in low precision falls back to float32 instead of aborting,
and ``cast_optional_params`` stores a parameter in low precision only when
every consumer wants it so.
"""
import collections
import dataclasses
import logging
from dataclasses import dataclass, field

from ..dtypes import CASTABLE, DTYPE_CODES, FLOAT32
from ..graph import (CAST_OPS, CONTROL_FLOW_OPS, FLOAT_OR_UNKNOWN, UNTYPABLE, all_nodes,
                     body_symbol, body_variables, carried_inputs, infer_entry_shapes,
                     infer_entry_types, low_slots, node_types, sliced_inputs)
from ..policy import Category, rule_categories
from . import probe
from .wire import FP32, KEEP, LOW, MULTI, path_of

log = logging.getLogger(__name__)


@dataclass
class Decisions:
    """Cast codes per operator node and per graph output. A node inside a
    control-flow body is keyed by its path (node, subgraph, node, ...; see
    wire.path_of), a body by (node, subgraph, ...)."""
    nodes: dict = field(default_factory=dict)        # node id or path -> codes
    outputs: str = ""
    categories: dict = field(default_factory=dict)   # node id -> Category
    fallbacks: dict = field(default_factory=dict)    # node name -> why it stays float32
    low_params: list = field(default_factory=list)   # params stored in low precision
    body_outputs: dict = field(default_factory=dict)     # body path -> codes of its outputs
    body_categories: dict = field(default_factory=dict)  # path of a body's node -> Category

    def add_body(self, body, prefix):
        """Takes in the decisions `body` made for the body at path `prefix`."""
        def under(key):
            return (*prefix, *path_of(key))
        self.nodes.update((under(key), codes) for key, codes in body.nodes.items())
        self.body_outputs[prefix] = body.outputs
        self.body_outputs.update((under(key), codes) for key, codes in body.body_outputs.items())
        for categories in (body.categories, body.body_categories):
            self.body_categories.update((under(key), c) for key, c in categories.items())
        self.fallbacks.update(body.fallbacks)

    def fallback_report(self, graph):
        """{reason: {op: count}}: the nodes kept in float32 against the lists,
        grouped by reason and operator (reported once per operator)."""
        op_of = {n["name"]: n["op"] for _, n in all_nodes(graph)}
        report = collections.defaultdict(collections.Counter)
        for name, reason in self.fallbacks.items():
            report[reason][op_of[name]] += 1
        return {reason: dict(sorted(ops.items())) for reason, ops in sorted(report.items())}


class _Entry:
    """What the walk knows of one entry (a node output), in the manner of
    MXNet 2.0's MappedNodeEntry: the dtype it has itself, where known, and
    the dtypes it is cast to (the pass makes one cast per entry and dtype)."""

    def __init__(self, castable):
        self.own = None          # its dtype code, once known
        self.casts = set()       # dtype codes a cast of it exists in
        self.castable = castable  # a float entry, or one of unknown dtype

    def has(self, dtype):
        """Whether it is available in `dtype`, itself or through a cast."""
        return self.own == dtype or dtype in self.casts

    def as_type(self, dtype):
        """Feeds it in `dtype`: False when it needs no cast (it is of that
        dtype itself, or not a float), else True, remembering the cast."""
        if self.own == dtype or not self.castable:
            return False
        self.casts.add(dtype)
        return True


class _Walker:
    """Walks the graph once per round, holding an :class:`_Entry` per entry."""

    def __init__(self, graph, policy, entry_types, data_names, cast_optional_params, ctx,
                 measure_kernels=False, backend_nodes=frozenset(), path=()):
        self.graph = graph
        self.path = path  # () for the graph, (node, subgraph, ...) for a body
        self.bodies = {}  # (node id, subgraph) -> its body's _Walker
        self.shapes = None  # this graph's entry shapes, once a body's rules need them
        self.reads = {}  # of a body: {variable id: the control-flow node's input it reads}
        self.candidates = frozenset()  # of a body: variables that could arrive low
        self.nodes = graph["nodes"]
        self.heads = graph["heads"]
        self.policy = policy
        self.target = DTYPE_CODES[policy.target_dtype]
        self.wire = {FLOAT32: FP32, self.target: LOW}  # dtype code -> wire code
        self.entry_types = entry_types
        self.n_outputs = {}
        for nid, idx in entry_types:
            self.n_outputs[nid] = max(self.n_outputs.get(nid, 0), idx + 1)
        self.data_names = set(data_names)
        self.cast_optional_params = cast_optional_params
        self.ctx = ctx
        self.measure_kernels = measure_kernels
        self.backend_nodes = backend_nodes
        self.ruled = rule_categories(graph, policy, entry_types)
        self.categories = {nid: self.category(nid, n)
                           for nid, n in enumerate(self.nodes) if n["op"] != "null"}
        self.handlers = {Category.FP32: self.fp32, Category.CONDITIONAL: self.fp32,
                         Category.LOW: self.low, Category.WIDEST: self.widest,
                         Category.NEUTRAL: self.neutral, Category.FOLLOW: self.follow}

    def category(self, nid, node):
        """The policy's category of a node; LOW for one the backend runs in
        the target dtype (`backend_nodes`), unless excluded by name or ruled."""
        name = node["name"]
        if name in self.backend_nodes and name not in self.policy.excluded \
                and nid not in self.ruled:
            return Category.LOW
        return self.policy.category(node["op"], name, node.get("attrs", {}), self.ruled.get(nid))

    def run(self):
        """Walks the graph until the parameters assumed to be stored in low
        precision are exactly those every consumer reads in low precision.

        The cycle: a FOLLOW consumer runs low only if such a parameter is low,
        and the parameter is low only if all its consumers run low. Starting
        from every candidate and dropping the ones a walk refutes reaches the
        largest consistent set, whatever order the nodes are visited in."""
        assumed = self.low_param_candidates() if self.cast_optional_params else frozenset()
        walks = 1
        while True:
            result, confirmed = self.walk(assumed)
            if confirmed == assumed:
                result.low_params = [self.nodes[v]["name"] for v in sorted(assumed)]
                log.debug("decisions reach a fixed point after %d walk(s)", walks)
                return result
            log.debug("walk %d: parameters %s are not read in low precision by every "
                      "consumer; walking again", walks,
                      sorted(self.nodes[v]["name"] for v in assumed - confirmed))
            assumed = confirmed
            walks += 1

    def walk(self, low_params):
        """One topological walk with `low_params` (variable ids) taken as low
        precision; returns the decisions and the params that were read low
        by every consumer."""
        self.entries = {}    # (node id, output index) -> _Entry
        self.low_reads = set()  # (node id, input slot) read in low precision
        self.result = Decisions()
        for nid, node in enumerate(self.nodes):
            if node["op"] != "null":
                self.visit(nid, node)
            elif node["name"] in self.policy.excluded:
                self.entry((nid, 0)).own = FLOAT32
            elif nid in low_params or (self.low_io and node["name"] in self.data_names):
                self.entry((nid, 0)).own = self.target  # stored / fed in low precision
            elif self.path and self.entry_types.get((nid, 0)) == FLOAT32:
                self.entry((nid, 0)).own = FLOAT32  # a body's input the node gives it in float32
        if not self.low_io:
            self.result.outputs = "".join(self.cast_to(FLOAT32, tuple(h[:2])) for h in self.heads)
        else:
            self.result.outputs = KEEP * len(self.heads)
        consumers = self.param_consumers()
        confirmed = frozenset(v for v in low_params
                              if all(use in self.low_reads for use in consumers[v]))
        return self.result, confirmed

    @property
    def low_io(self):
        """Data inputs and outputs in low precision: keep_io_types=False, and
        never for a body, whose inputs and outputs cross a control-flow node."""
        return not self.policy.keep_io_types and not self.path

    def entry(self, e):
        if e not in self.entries:
            self.entries[e] = _Entry(self.entry_types.get(e, -1) in FLOAT_OR_UNKNOWN)
        return self.entries[e]

    def visit(self, nid, node):
        attrs = node.get("attrs", {})
        inputs = [tuple(e[:2]) for e in node["inputs"]]
        category = self.categories[nid]
        handler = self.handlers[category]
        if category is Category.NEUTRAL and node["op"] in CAST_OPS:  # a float32 model's own casts
            handler = self.user_cast
        if self.converts_body(nid):
            handler = self.control_flow
        if self.corrupts(nid, node):
            self.result.fallbacks[node["name"]] = probe.corruption_reason(self.policy.target_dtype)
            handler, category = self.fp32, Category.FP32
        elif node["op"] in UNTYPABLE and category is not Category.FP32:
            # Typing it alone would kill MXNet: it runs in float32, as in the model.
            self.result.fallbacks[node["name"]] = "MXNet cannot infer its types on the node alone"
            handler, category = self.fp32, Category.FP32
        codes, category = handler(nid, node, attrs, inputs, category)
        self.result.categories[nid] = category
        if codes.strip(KEEP):
            self.result.nodes[nid] = codes

    def corrupts(self, nid, node):
        """Whether MXNet would run `node` in the target dtype with a kernel
        that corrupts memory (probe.CORRUPTING) unless it runs in float32:
        whatever the context, even with none (the graph may run on this CPU),
        unless the backend runs it or its category keeps it float32."""
        return probe.corrupts(node["op"], self.policy.target_dtype) \
            and node["name"] not in self.backend_nodes \
            and self.categories[nid] not in (Category.FP32, Category.CONDITIONAL)

    def types(self, node, attrs, inputs, in0):
        return node_types(node["op"], tuple(sorted(attrs.items())), self.codes(inputs), in0)

    def codes(self, inputs):
        return tuple(self.entry_types.get(e, -1) for e in inputs)

    def record_outputs(self, nid, out_types):
        for idx, dtype in enumerate(out_types):
            if dtype in self.wire:
                self.entry((nid, idx)).own = dtype

    def cast_to(self, dtype, entry):
        """The wire code feeding `entry` in `dtype` (a cast, or KEEP)."""
        return self.wire[dtype] if self.entry(entry).as_type(dtype) else KEEP

    def has(self, entry, dtype):
        return entry in self.entries and self.entries[entry].has(dtype)

    def is_variable(self, entry):
        return self.nodes[entry[0]]["op"] == "null"

    def is_param(self, entry):
        """A parameter (not a data input) that may be stored in low precision."""
        name = self.nodes[entry[0]]["name"]
        return self.is_variable(entry) and name not in self.data_names \
            and name not in self.policy.excluded

    def fp32(self, nid, node, attrs, inputs, category):
        mutable = frozenset()
        if category is not Category.FP32:
            info = self.types(node, attrs, inputs, -1)
            mutable = info[2] if info else frozenset()
        for idx in range(self.num_outputs(nid)):
            self.entry((nid, idx)).own = FLOAT32
        codes = []
        for i, e in enumerate(inputs):
            # The reference leaves variables of plain float32 ops uncast (and
            # casts those of conditional ones: kept for parity).
            skip = i in mutable or (category is not Category.CONDITIONAL and self.is_variable(e)
                                    and not self.has(e, FLOAT32)
                                    and self.dtype_of(e) == FLOAT32)
            codes.append(KEEP if skip else self.cast_to(FLOAT32, e))
        return "".join(codes), category

    def low(self, nid, node, attrs, inputs, category):
        info = self.types(node, attrs, inputs, self.target)
        if info is None:
            self.result.fallbacks[node["name"]] = "type inference rejects the target dtype"
            return self.fp32(nid, node, attrs, inputs, Category.FP32)
        in_types, out_types, mutable = info
        if self.lacks_kernel(node, attrs, in_types, timed=False):
            return self.fp32(nid, node, attrs, inputs, Category.FP32)
        self.record_outputs(nid, out_types)
        wanted = low_slots(in_types, mutable, self.codes(inputs), self.target)
        self.low_reads.update((nid, i) for i in wanted)
        # Other inputs (e.g. BatchNorm's statistics) stay as they are unless
        # a low-precision copy exists anyway.
        return "".join(self.cast_to(self.target, e) if i in wanted or self.has(e, self.target)
                       else KEEP for i, e in enumerate(inputs)), category

    def lacks_kernel(self, node, attrs, in_types, timed=True):
        """True (and the fallback noted) when the conversion is for a device
        that has no kernel for `node` with these input dtypes (-1: target),
        or, if `timed`, one slower than float32 (probe.SLOWER).
        Operators the lists put in low precision are not timed (they are
        asked for; MXNet's are oneDNN kernels, fast in low precision); those
        that run low only because their inputs arrive low are. Nodes the
        backend runs (`backend_nodes`) are neither: MXNet's kernel never runs."""
        if self.ctx is None or node["name"] in self.backend_nodes:
            return False
        dtype, measure = self.policy.target_dtype, self.measure_kernels
        question = (node["op"], tuple(sorted(attrs.items())), tuple(in_types), dtype, self.ctx)
        if probe.has_kernel(*question) is False:
            reason = f"no {dtype} kernel on {self.ctx}"
        elif timed and (probe.slowdown(*question, measure=measure) or 0) > probe.SLOWER:
            reason = f"{dtype} kernel on {self.ctx} slower than float32, " \
                f"{probe.speed_source(measure)}"
        else:
            return False
        self.result.fallbacks[node["name"]] = reason
        return True

    def follow(self, nid, node, attrs, inputs, category):
        """Low precision, with no cast, if every input it would want in the
        target dtype already is; otherwise float32."""
        info = self.types(node, attrs, inputs, self.target)
        if info is not None:
            in_types, out_types, mutable = info
            wanted = low_slots(in_types, mutable, self.codes(inputs), self.target)
            if wanted and all(self.dtype_of(inputs[i]) == self.target for i in wanted) \
                    and not self.lacks_kernel(node, attrs, in_types):
                self.record_outputs(nid, out_types)
                self.low_reads.update((nid, i) for i in wanted)
                return KEEP * len(inputs), category
        return self.fp32(nid, node, attrs, inputs, category)

    def widest(self, nid, node, attrs, inputs, category):
        if not inputs:
            return "", category
        dtype = FLOAT32 if any(self.has(e, FLOAT32) for e in inputs) else self.target
        # Where all inputs could arrive low, the device needs a kernel for it.
        if dtype == self.target and self.lacks_kernel(node, attrs, [self.target] * len(inputs)):
            dtype = FLOAT32
        elif not all(self.has(e, FLOAT32) or self.has(e, self.target) for e in inputs):
            return MULTI * len(inputs), category
        self.record_outputs(nid, [dtype] * self.num_outputs(nid))
        return "".join(self.cast_to(dtype, e) for e in inputs), category

    def neutral(self, nid, node, attrs, inputs, category):
        if not inputs:
            return "", category
        in0 = self.dtype_of(inputs[0])
        if in0 is None:
            return KEEP * len(inputs), category
        info = self.types(node, attrs, inputs, in0)
        if info is None or any(t in CASTABLE and self.dtype_of(e) not in (None, t)
                               for e, t in zip(inputs[1:], info[0][1:])):
            pulled = self.pull_params(nid, node, attrs, inputs) if in0 == self.target else None
            if pulled is not None:
                return pulled, category
            # The inputs' dtypes disagree where the op needs them equal and
            # not only in parameters: run it in float32. The reference leaves
            # such graphs inconsistent.
            self.result.fallbacks[node["name"]] = "its inputs' dtypes disagree"
            return self.fp32(nid, node, attrs, inputs, Category.FP32)
        if in0 == self.target and self.lacks_kernel(node, attrs, info[0]):
            return self.fp32(nid, node, attrs, inputs, Category.FP32)
        if not self.is_variable(inputs[0]) or self.path:  # a body's variables have known dtypes
            self.record_outputs(nid, info[1])
        if in0 == self.target and not self.is_param(inputs[0]):  # parameters stored low are read so
            self.low_reads.update((nid, i) for i, e in enumerate(inputs)
                                  if self.is_param(e) and self.dtype_of(e) == self.target)
        return KEEP * len(inputs), category

    def pull_params(self, nid, node, attrs, inputs):
        """Codes running a neutral node low when its other float inputs
        arrive low and only parameters are float32 (a dtype-neutral
        FullyConnected after a low Convolution): the parameters are cast, or
        stored, low as the reference does. None when it cannot run so."""
        if not all(self.is_param(e) or not self.entry(e).castable
                   or self.dtype_of(e) == self.target for e in inputs):
            return None
        info = self.types(node, attrs, inputs, self.target)
        if info is None or self.lacks_kernel(node, attrs, info[0]):
            return None
        in_types, out_types, mutable = info
        wanted = low_slots(in_types, mutable, self.codes(inputs), self.target)
        self.record_outputs(nid, out_types)
        codes = []
        for i, e in enumerate(inputs):
            # A parameter the op wants in another dtype (BatchNorm's gamma) gets that one.
            dtype = self.target if i in wanted else in_types[i]
            if self.is_param(e) and dtype in self.wire and self.dtype_of(e) != dtype:
                self.low_reads.update([(nid, i)] if dtype == self.target else [])
                codes.append(self.cast_to(dtype, e))
            else:
                codes.append(KEEP)
        return "".join(codes)

    def converts_body(self, nid):
        """Whether node `nid` is a control-flow node whose bodies are walked
        (excluding it by name keeps its bodies float32)."""
        node = self.nodes[nid]
        return node["op"] in CONTROL_FLOW_OPS and bool(node.get("subgraphs")) \
            and node["name"] not in self.policy.excluded

    def control_flow(self, nid, node, attrs, inputs, category):
        """A loop or condition, whose bodies are walked by the same policy.

        Loop state and the node's outputs stay float32 on both sides of the
        node (MXNet 1.9.1 fails on bfloat16 _foreach state; one dtype for
        every state also keeps it the same from one iteration to the next):
        a body casts around its low-precision operators inside. An input that
        is not loop state and that every body reads only in low precision is
        cast once here, before the node, instead of in every iteration
        (hoisted); found as cast_optional_params finds parameters (see run),
        dropping the inputs a walk of the bodies refutes."""
        bodies = [self.body(nid, k) for k in range(len(node["subgraphs"]))]
        carried = carried_inputs(node)

        def readers(j):  # (body, variable id) of each body variable reading input j
            return [(body, v) for body in bodies for v, read in body.reads.items() if read == j]
        hoisted = frozenset(
            j for j, e in enumerate(inputs)
            if j not in carried and self.entry_types.get(e) == FLOAT32
            and not (self.is_variable(e) and self.nodes[e[0]]["name"] in self.policy.excluded)
            and all(v in body.candidates for body, v in readers(j)))
        while True:
            walks = {body: body.walk(frozenset(v for v, j in body.reads.items() if j in hoisted))
                     for body in bodies}
            confirmed = frozenset(j for j in hoisted
                                  if all(v in walks[body][1] for body, v in readers(j)))
            if confirmed == hoisted:
                break
            hoisted = confirmed
        for k, body in enumerate(bodies):
            self.result.add_body(walks[body][0], (nid, k))
        self.low_reads.update((nid, j) for j in hoisted)
        for idx in range(self.num_outputs(nid)):
            self.entry((nid, idx)).own = FLOAT32
        # Inputs not known to be low are float32, as in the float32 model.
        return "".join(self.cast_to(self.target, e) if j in hoisted
                       else self.cast_to(FLOAT32, e) if self.dtype_of(e) == self.target
                       else KEEP for j, e in enumerate(inputs)), category

    def body(self, nid, k):
        """The walker of subgraph `k` of control-flow node `nid`, made on
        first use: its entries' float32 dtypes from MXNet's type inference of
        the body, given the dtypes of the node's inputs."""
        if (nid, k) not in self.bodies:
            node = self.nodes[nid]
            graph = node["subgraphs"][k]
            reads = body_variables(node, k)  # variable id -> node input
            inputs = [tuple(e[:2]) for e in node["inputs"]]
            names = {v: graph["nodes"][v]["name"] for v in reads}
            known = {names[v]: self.entry_types.get(inputs[j], -1) for v, j in reads.items()}
            types = infer_entry_types(body_symbol(graph), known)
            carried = carried_inputs(node)
            body = _Walker(graph, self.body_policy(node, names, reads), types,
                           [names[v] for v, j in reads.items() if j in carried], False, self.ctx,
                           self.measure_kernels, path=(*self.path, nid, k))
            body.reads = reads
            body.candidates = body.low_param_candidates()
            self.bodies[(nid, k)] = body
        return self.bodies[(nid, k)]

    def body_policy(self, node, names, reads):
        """The policy for a body of control-flow `node`: this one, with the
        shapes rules see given for the body's variables (one slice of
        _foreach's data) where this graph's shapes are known."""
        if self.policy.input_shapes is None:
            return self.policy
        if self.shapes is None:
            self.shapes = infer_entry_shapes(self.graph, self.policy.input_shapes)
        sliced = sliced_inputs(node)
        known = {}
        for v, j in reads.items():
            shape = self.shapes.get(tuple(node["inputs"][j][:2]))
            if shape and None not in shape:
                known[names[v]] = shape[1:] if j in sliced else shape
        return dataclasses.replace(self.policy, input_shapes=known)

    def user_cast(self, nid, node, attrs, inputs, category):
        """A cast the float32 model holds itself: kept as it is. Its output
        dtype is known, and a parameter it casts to the target dtype (or feeds
        into an all-low amp_multicast) may be stored low instead."""
        if node["op"] == "amp_cast":
            dtype = DTYPE_CODES.get(attrs.get("dtype"))
            if dtype == self.target:
                self.low_reads.add((nid, 0))
            self.record_outputs(nid, [dtype])
        else:
            dtypes = {self.dtype_of(e) for e in inputs}
            if dtypes == {self.target}:
                self.low_reads.update((nid, i) for i in range(len(inputs)))
            if None not in dtypes:
                widest = self.target if dtypes == {self.target} else FLOAT32
                self.record_outputs(nid, [widest] * self.num_outputs(nid))
        return KEEP * len(inputs), category

    def reads_low(self, nid):
        """Whether node `nid` may read a parameter stored in the target dtype."""
        node = self.nodes[nid]
        if self.categories[nid] in (Category.LOW, Category.FOLLOW) or self.converts_body(nid):
            return True
        if self.categories[nid] is not Category.NEUTRAL:
            return False
        if node["op"] not in CAST_OPS:  # it may pull the parameter to its data's dtype
            return True
        return node["op"] == "amp_multicast" or (
            node["op"] == "amp_cast"
            and DTYPE_CODES.get(node.get("attrs", {}).get("dtype")) == self.target)

    def dtype_of(self, entry):
        """The dtype an entry itself has, where known (variables are float32
        unless declared otherwise). A cast of the entry elsewhere does not
        count: a neutral op reads the entry, not the cast (the reference
        confuses the two and mislabels what follows)."""
        own = self.entries[entry].own if entry in self.entries else None
        if own is None and self.is_variable(entry):
            declared = self.entry_types.get(entry, -1)
            return FLOAT32 if declared < 0 else declared
        return own

    def num_outputs(self, nid):
        return self.n_outputs.get(nid, 1)

    def param_consumers(self):
        """{variable id: [(node id, slot), ...]} for parameters (non-data variables)."""
        uses = {}
        for nid, node in enumerate(self.nodes):
            for slot, e in enumerate(node["inputs"]):
                src = self.nodes[e[0]]
                if src["op"] == "null" and src["name"] not in self.data_names:
                    uses.setdefault(e[0], []).append((nid, slot))
        return uses

    def low_param_candidates(self):
        """Parameters that could be stored in low precision: every consumer may
        read them so (see reads_low), and the parameter is no graph output."""
        heads = {h[0] for h in self.heads}
        return frozenset(
            vid for vid, uses in self.param_consumers().items()
            if vid not in heads and self.nodes[vid]["name"] not in self.policy.excluded
            and all(self.reads_low(nid) for nid, _ in uses))


def decide(graph, policy, entry_types, data_names, cast_optional_params=False, ctx=None,
           measure_kernels=False, backend_nodes=frozenset()):
    """Cast decisions for a graph in MXNet's JSON form (see :class:`Decisions`).
    With a context, low-precision ops without a kernel there stay float32, and
    so do those whose kernel is too slow there (`measure_kernels`: timed
    here, not taken from the shipped speed data). The nodes named in
    `backend_nodes` run in the target dtype (a backend runs them, not
    MXNet), unless excluded by name or ruled otherwise."""
    return _Walker(graph, policy, entry_types, data_names, cast_optional_params, ctx,
                   measure_kernels, backend_nodes).run()
