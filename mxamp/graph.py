"""MXNet graphs in their JSON form: reading and writing them, checking them,
cast nodes and their names, inserting nodes, and MXNet's type and shape
inference on them. Every other module goes through here to see a graph."""
import collections
import ctypes
import functools
import json
import re

import mxnet as mx
from mxnet.base import (_LIB, MXNetError, SymbolHandle, c_array, c_str_array, check_call,
                        mx_uint)

from .dtypes import CASTABLE
from .errors import OptionTypeError, mxnet_message

CAST_OPS = ("amp_cast", "amp_multicast")
# Control characters JSON writes as \u escapes, which MXNet's reader rejects.
_UNREADABLE = re.compile("[\x00-\x07\x0b\x0e-\x1f]")
FLOAT_OR_UNKNOWN = CASTABLE | {-1}  # codes a cast may apply to (-1: not known yet)


def graph_json(sym, casts=True):
    """A symbol's graph in MXNet's JSON form, casts included unless `casts`
    is False (MXNet's own serializer drops them by default)."""
    return _read(sym.tojson(remove_amp_cast=not casts))


def _read(text):
    # strict=False: node names may hold control characters
    return json.loads(text, strict=False)


def internal_name(outputs, node_name, index=0):
    """The name ``get_internals().list_outputs()`` (`outputs`) gives output
    `index` of node `node_name`: <name>_output for a node of one output,
    <name>_output<index> otherwise; None when `outputs` has neither."""
    single = f"{node_name}_output"
    if single in outputs:
        return single
    name = f"{single}{index}"
    return name if name in outputs else None


def internal_outputs(sym, names):
    """The internal outputs of `sym` named `names` (as
    ``get_internals().list_outputs()`` names them), found in one pass:
    MXNet's ``internals[name]`` lists every output again for each name."""
    internals = sym.get_internals()
    index = {}
    for i, name in enumerate(internals.list_outputs()):
        index[name] = None if name in index else i  # None: more than one output so named
    missing = [n for n in names if index.get(n) is None]
    if missing:
        raise ValueError(f"no single internal output named {missing[0]!r}")
    return [internals[index[n]] for n in names]


def to_symbol(graph):
    """The symbol of a graph in MXNet's JSON form."""
    # MXNet's JSON reader takes UTF-8 but not \u escapes
    return mx.sym.load_json(json.dumps(graph, ensure_ascii=False))


class Graph:
    """A symbol with its graph in MXNet's JSON form, read once (when a stage
    first asks) and handed from stage to stage (quantization: exclusion,
    calibration, annotation, partitioning) so that no stage serializes the
    symbol again. Stages read ``json`` (nodes by index) and give MXNet
    ``symbol``. Both describe one graph: edit them together (:meth:`marked`),
    or edit a copy of the JSON and build its symbol once
    (``Graph(to_symbol(json), json)``). ``text`` is MXNet's JSON text the
    graph was read from (None for a graph given as JSON), which the backend
    library reads as it is."""

    def __init__(self, symbol, json=None):
        self.symbol = symbol
        self._json, self.text = json, None
        self._outputs = self._first = None
        self._extension_checked = False

    @classmethod
    def of(cls, value):
        """`value` if it is a Graph, else the Graph of the symbol `value`."""
        return value if isinstance(value, cls) else cls(value)

    @property
    def json(self):
        """The graph in MXNet's JSON form, read from the symbol when first asked for."""
        if self._json is None:
            self.text = self.symbol.tojson(remove_amp_cast=False)
            self._json = _read(self.text)
        return self._json

    @property
    def nodes(self):
        return self.json["nodes"]

    def check_extension(self, what):
        """:func:`check_extension_json` of this graph, once: from the text it
        was read from where there is one (MXNet escapes strings as JSON
        does), so the graph is not written again."""
        if not self._extension_checked:
            check_extension_json(self.json, what, self.text)
            self._extension_checked = True

    def entries(self):
        """The (node index, output index) of each output of
        ``symbol.get_internals()``, in order, without writing their JSON:
        MXNet lists every node's outputs together, in the JSON's node order,
        each output naming its node. Where an operator is followed by a node
        of its name (whose outputs could be the operator's), the internals'
        JSON says."""
        internals = self.symbol.get_internals()
        owners = [_output(internals, k).name for k in range(len(internals.list_outputs()))]
        found = _entries_of(self.nodes, owners)
        return found or [tuple(h[:2]) for h in graph_json(internals)["heads"]]

    def outputs(self):
        """{name: node index} of the internal outputs
        ``symbol.get_internals().list_outputs()`` names, in that order."""
        self._index_outputs()
        return self._outputs

    def marked(self, attrs):
        """A new Graph whose nodes also carry `attrs` ({node index: {key:
        str value}}): MXNet copies the symbol and the JSON's nodes are
        copied, so this graph and the caller's symbol stay as they are."""
        self._index_outputs()
        symbol = self.symbol.__copy__()
        internals = symbol.get_internals()
        nodes = list(self.nodes)
        for nid, extra in attrs.items():
            _output(internals, self._first[nid])._set_attr(**extra)
            nodes[nid] = {**nodes[nid], "attrs": {**nodes[nid].get("attrs", {}), **extra}}
        graph = Graph(symbol, {**self.json, "nodes": nodes})
        # Checked already unless a mark ends in a backslash.
        graph._extension_checked = (self._extension_checked
                                   and not _ending_in_backslash(list(attrs.values())))
        return graph

    def _index_outputs(self):
        if self._outputs is not None:
            return
        index = {}
        for nid, node in enumerate(self.nodes):
            index.setdefault(node["name"], nid)
        internals = self.symbol.get_internals()
        self._outputs, self._first = {}, {}
        for k, name in enumerate(internals.list_outputs()):
            nid = index[_output(internals, k).name]  # a one-output symbol has its node's name
            self._outputs.setdefault(name, nid)
            self._first.setdefault(nid, k)


def _entries_of(nodes, owners):
    """(node index, output index) of each internal output, given the name of
    the node each one is of (`owners`); None where that does not tell (an
    operator followed by a node of its name, or outputs left over)."""
    if any(a["op"] != "null" and a["name"] == b["name"] for a, b in zip(nodes, nodes[1:])):
        return None
    found = []
    for nid, node in enumerate(nodes):
        count = 1  # a variable's one output; an operator's run of its own
        while node["op"] != "null" and len(found) + count < len(owners) \
                and owners[len(found) + count] == node["name"]:
            count += 1
        found.extend((nid, i) for i in range(count))
    return found if len(found) == len(owners) else None


def _output(sym, index):
    """Output `index` of `sym` as a symbol (``sym[index]`` lists every output
    name to check the index)."""
    handle = SymbolHandle()
    check_call(_LIB.MXSymbolGetOutput(sym.handle, mx_uint(index), ctypes.byref(handle)))
    return mx.sym.Symbol(handle)


def input_symbols(sym):
    """Each input of `sym` as a symbol sharing its node (MXNet 1.9.1's Symbol
    has no get_inputs), not always in the order of ``sym.list_inputs()``."""
    count, handles = ctypes.c_int(0), ctypes.POINTER(SymbolHandle)()
    check_call(_LIB.MXSymbolGetInputSymbols(sym.handle, ctypes.byref(handles),
                                            ctypes.byref(count)))
    return [mx.sym.Symbol(ctypes.cast(handles[k], SymbolHandle)) for k in range(count.value)]


def input_names(graph):
    """The names of a JSON graph's inputs in the order ``list_inputs()``
    gives them (MXNet's depth-first order from the heads: a node after its
    inputs, then its control dependencies), without building its symbol."""
    nodes, names, seen = graph["nodes"], [], set()
    for head in graph["heads"]:
        stack = [(head[0], False)]
        while stack:
            nid, expanded = stack.pop()
            if nid in seen:
                continue
            node = nodes[nid]
            if expanded:
                seen.add(nid)
                if node["op"] == "null":
                    names.append(node["name"])
                continue
            stack.append((nid, True))
            deps = [e[0] for e in node["inputs"]] + node.get("control_deps", [])
            stack.extend((d, False) for d in reversed(deps) if d not in seen)
    return names


def entry_name(node_name, index):
    """How casts name the entry they read: the node's name, with `_<index>`
    for outputs other than the first (amp_pass.cc, CastInserter::EntryName)."""
    return node_name if index == 0 else f"{node_name}_{index}"


def cast_name(node_name, index, dtype):
    """The name of the cast of output `index` of node `node_name` to `dtype`.
    The C++ passes (amp_pass.cc, the oneDNN backend's finish.cc) and every
    Python rewriter name casts by this one rule, so a cast's name says what
    it casts whoever inserted it (each then makes it unique in the graph:
    :meth:`Inserter.add`)."""
    return f"{entry_name(node_name, index)}_amp_cast_{dtype}"


def passed_from(nodes, entry):
    """The entry that `entry`, an output of a cast node, carries: its input k
    for output k (amp_multicast has an output per input; amp_cast's one
    output is its input), as the C++ passes' ``passed_from``
    (src/operator/onednn/table.h)."""
    return nodes[entry[0]]["inputs"][entry[1]]


def cast_node(nodes, entry, dtype):
    """An amp_cast node reading `entry` ((node index, output index) into
    `nodes`) as `dtype`, named by :func:`cast_name`."""
    name = cast_name(nodes[entry[0]]["name"], entry[1], dtype)
    return {"op": "amp_cast", "name": name, "attrs": {"dtype": dtype},
            "inputs": [[entry[0], entry[1], 0]]}


class Inserter:
    """The one way mxamp's Python rewriters add nodes to a graph in MXNet's
    JSON form. ``add`` returns a new node's index and ``cast`` a new cast's
    entry; the graph's nodes and heads (edited in place by the rewriter) and
    other new nodes may read them. ``apply`` returns the new graph, its
    nodes in an order MXNet accepts."""

    def __init__(self, graph):
        self.graph = graph
        self.nodes = dict(enumerate(graph["nodes"]))  # index -> node, new ones included
        self.names = {n["name"] for n in graph["nodes"]}
        # One cast per entry and dtype, as in the C++ pass: casts already in
        # the graph count, so a rewriter never duplicates one (nor its name).
        self.added = {("amp_cast", *n["inputs"][0][:2], n["attrs"]["dtype"]): i
                      for i, n in self.nodes.items() if n["op"] == "amp_cast"}

    def add(self, node, key=None):
        """Adds `node`; returns its index. Nodes added with the same `key`
        are one node: the first. A name a node has already gets `_1`, `_2`...
        as in the C++ pass: two nodes of one name confuse lookup by name."""
        if key in self.added:  # never None
            return self.added[key]
        name, n = node["name"], 0
        while name in self.names:
            n += 1
            name = f"{node['name']}_{n}"
        self.names.add(name)
        index = len(self.nodes)
        self.nodes[index] = {**node, "name": name}
        if key is not None:
            self.added[key] = index
        return index

    def cast(self, entry, dtype):
        """The entry ([node index, 0, 0]) of `entry` cast to `dtype`: a new
        cast, or the one the graph or an earlier call made."""
        key = ("amp_cast", entry[0], entry[1], dtype)
        return [self.add(cast_node(self.nodes, entry, dtype), key), 0, 0]

    def apply(self):
        """The graph, renumbered, with every node after its inputs: the
        graph's own nodes keep their order (as far as new inputs allow) and a
        new node comes just before its first reader."""
        order = _topological(self.nodes)
        where = {old: new for new, old in enumerate(order)}

        def renumber(entries):
            return [[where[e[0]], *e[1:]] for e in entries]
        nodes = [{**self.nodes[i], "inputs": renumber(self.nodes[i]["inputs"])} for i in order]
        graph = {k: v for k, v in self.graph.items() if k != "node_row_ptr"}  # stale now
        graph["nodes"] = nodes
        graph["arg_nodes"] = [i for i, n in enumerate(nodes) if n["op"] == "null"]
        graph["heads"] = renumber(self.graph["heads"])
        return graph


def _topological(nodes):
    """The indices of `nodes` ({index: node}) with every node after its
    inputs, by depth-first search from each node in turn."""
    order, placed, opened = [], set(), set()
    for root in nodes:
        stack = [root]
        while stack:
            i = stack[-1]
            if i in placed:
                stack.pop()
                continue
            waiting = [e[0] for e in nodes[i]["inputs"] if e[0] not in placed]
            if not waiting:
                placed.add(i)
                order.append(i)
                stack.pop()
            elif i in opened:  # all its inputs were visited, yet one waits: a cycle
                raise ValueError(f"node {nodes[i]['name']!r} depends on its own output")
            else:
                opened.add(i)
                stack.extend(waiting)
    return order


def check_params(params, what):
    """A TypeError naming `what` unless `params` is a dict of str to NDArray."""
    if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, mx.nd.NDArray) for k, v in params.items()):
        raise OptionTypeError(f"{what} must be a dict of str to mxnet.nd.NDArray, "
                              f"got {type(params).__name__}")


def _short(value, limit=60):
    """`value`'s repr, cut to `limit` characters (fuzzed or corrupt files can
    hold megabytes where a name belongs)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _is_entry(entry):
    return (isinstance(entry, list) and len(entry) in (2, 3)
            and all(type(v) is int for v in entry))  # bool is an int, not a node id


def _is_str_dict(value):
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _check_node(node, nid, count, where):
    """The fields of node `nid` MXNet's JSON reader needs, of the types it
    reads: it crashes or says little on anything else."""
    def fail(reason):
        raise ValueError(f"{where} is not a valid MXNet graph: node {nid} {reason}")
    if not isinstance(node, dict):
        fail(f"is {_short(node)}, not an object with 'op', 'name' and 'inputs'")
    for key in ("op", "name", "inputs"):
        if key not in node:
            fail(f"has no {key!r}")
    if not isinstance(node["op"], str) or not isinstance(node["name"], str):
        fail(f"has 'op' {_short(node['op'])} and 'name' {_short(node['name'])}; both must be "
             "strings")
    if not isinstance(node["inputs"], list):
        fail(f"({_short(node['name'])}) has 'inputs' {_short(node['inputs'])}, not a list")
    for key in ("attrs", "attr", "param"):
        if key in node and not _is_str_dict(node[key]):
            fail(f"({_short(node['name'])}) has {key!r} {_short(node[key])}, not an object of "
                 "strings")
    deps = node.get("control_deps", [])
    if not isinstance(deps, list) or not all(type(d) is int and 0 <= d < count for d in deps):
        fail(f"({_short(node['name'])}) has 'control_deps' {_short(deps)}, not a list of node ids")
    subgraphs = node.get("subgraphs", [])
    if not isinstance(subgraphs, list):
        fail(f"({_short(node['name'])}) has 'subgraphs' {_short(subgraphs)}, not a list")
    if _UNREADABLE.search(node["name"]):
        raise ValueError(f"{where}: node name {_short(node['name'])} holds a control character; "
                         "MXNet's JSON reader cannot read it back (tab, newline, carriage "
                         "return, backspace and form feed are fine): rename the node")


@functools.lru_cache(maxsize=4096)
def _op_outputs(node_json, n_inputs):
    """How many outputs a node (its JSON without name and inputs) has with
    `n_inputs` inputs, as MXNet lists them; None when MXNet rejects the node
    (loading the whole graph then says why)."""
    nodes = [{"op": "null", "name": f"in{i}", "inputs": []} for i in range(n_inputs)]
    nodes.append({**json.loads(node_json), "name": "node",
                  "inputs": [[i, 0, 0] for i in range(n_inputs)]})
    try:
        sym = mx.sym.load_json(json.dumps({"nodes": nodes, "arg_nodes": list(range(n_inputs)),
                                           "heads": [[n_inputs, 0, 0]],
                                           "attrs": {"mxnet_version": ["int", 10901]}}))
        return len(sym.get_internals().list_outputs()) - n_inputs
    except MXNetError:
        return None


def _outputs(node):
    """The number of outputs `node` has (None: not known)."""
    if node["op"] == "null":
        return 1
    key = {k: v for k, v in node.items() if k not in ("name", "inputs", "control_deps")}
    return _op_outputs(json.dumps(key, sort_keys=True), len(node["inputs"]))


def _check_entry(entry, nodes, what, where):
    """An entry ([node id, output index, version]) names an existing output:
    MXNet reads past the end of a node's outputs and crashes."""
    def fail(reason):
        raise ValueError(f"{where} is not a valid MXNet graph: {what} {reason}")
    if not _is_entry(entry):
        fail(f"reads {_short(entry)}, not [node id, output index, version] (integers)")
    nid, index = entry[:2]
    if not 0 <= nid < len(nodes):
        fail(f"reads node {nid}, which does not exist (the graph has {len(nodes)} nodes)")
    if index == 0:
        return  # every node has an output 0
    count = _outputs(nodes[nid])
    if index < 0 or count is not None and index >= count:
        fail(f"reads output {index} of node {_short(nodes[nid]['name'])} ({nodes[nid]['op']}), "
             f"which has {count if count is not None else 'no such'} output(s)")


def check_graph(graph, where="the graph"):
    """Checks a symbol's JSON graph for what MXNet itself does not catch on
    loading (it crashes or gives an unclear error on these): malformed
    nodes, entries that name no node or no output of their node, two inputs
    of one name, cycles, and names MXNet's JSON reader cannot read back, in
    the main graph and in every control-flow subgraph."""
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ValueError(f"{where} is not a valid MXNet graph: it has no 'nodes' list")
    nodes = graph["nodes"]
    for nid, node in enumerate(nodes):
        _check_node(node, nid, len(nodes), where)
    seen = {}
    for nid, node in enumerate(nodes):
        if node["op"] == "null" and seen.setdefault(node["name"], nid) != nid:
            raise ValueError(f"{where} is not a valid MXNet graph: nodes {seen[node['name']]} "
                             f"and {nid} are both the input "
                             f"{_short(node['name'])}; MXNet cannot bind two inputs of one name: "
                             "rename one")
    for node in nodes:
        for k, subgraph in enumerate(node.get("subgraphs", [])):
            check_graph(subgraph, f"subgraph {k} of node {_short(node['name'])} in {where}")
    for node in nodes:
        for entry in node["inputs"]:
            _check_entry(entry, nodes, f"node {_short(node['name'])}", where)
    heads = graph.get("heads")
    if not isinstance(heads, list) or not heads:
        raise ValueError(f"{where} is not a valid MXNet graph: 'heads' is {_short(heads)}, "
                         "not a list of the graph's outputs")
    for k, entry in enumerate(heads):
        _check_entry(entry, nodes, f"graph output {k}", where)
    arg_nodes = graph.get("arg_nodes")
    if not isinstance(arg_nodes, list) or not all(
            type(i) is int and 0 <= i < len(nodes) for i in arg_nodes):
        raise ValueError(f"{where} is not a valid MXNet graph: 'arg_nodes' is "
                         f"{_short(arg_nodes)}, not a list of node ids")
    _check_acyclic([[e[0] for e in n["inputs"]] for n in nodes], nodes, where)


# In JSON text, a string that ends in a backslash ends in an even run of
# backslashes (each one written twice) before its closing quote.
_ENDS_IN_BACKSLASH = re.compile(r'(?<!\\)(?:\\\\)+"')


def check_extension_json(graph, what, text=None):
    """Refuses a graph (JSON form) that MXNet 1.9.1 cannot hand to an
    extension library's pass or partitioner (`what`, for the message): its
    lib_api.cc reads JSON taking the backslash that ends a string for one
    escaping the closing quote, and then misreads the rest or loops forever.
    `text`: the graph's JSON text, where the caller has it."""
    text = json.dumps(graph, ensure_ascii=False) if text is None else text
    # Every match holds a backslash written twice before a quote: a plain
    # substring search rules most graphs out far faster than the pattern.
    if '\\\\"' in text and _ENDS_IN_BACKSLASH.search(text):
        bad = _ending_in_backslash(graph)
        raise ValueError(f"MXNet cannot hand a graph to {what} when a node name or attribute "
                         f"ends in a backslash: {bad}; rename them")


def _ending_in_backslash(value):
    """The strs of a JSON value (keys included) that end in a backslash, sorted."""
    return sorted({s for s in _strings(value) if s.endswith("\\")})


def _strings(value):
    """Every str in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _check_acyclic(reads, nodes, where):
    """Kahn's algorithm: nodes left over once every acyclic part is peeled
    off lie on a cycle. `reads` holds the node ids each node reads."""
    pending = [len(set(ids)) for ids in reads]
    readers = collections.defaultdict(set)
    for nid, ids in enumerate(reads):
        for i in ids:
            readers[i].add(nid)
    ready = [nid for nid, n in enumerate(pending) if n == 0]
    while ready:
        for reader in readers[ready.pop()]:
            pending[reader] -= 1
            if pending[reader] == 0:
                ready.append(reader)
    cyclic = [nodes[nid]["name"] for nid, n in enumerate(pending) if n > 0]
    if cyclic:
        raise ValueError(f"{where} is not a valid MXNet graph: the nodes "
                         f"{_short(cyclic, 200)} form a cycle")


def load_symbol_json(text, where="the symbol JSON"):
    """A symbol from JSON text, with clear errors for malformed or cyclic graphs."""
    def fail(reason):
        raise ValueError(f"{where} is not an MXNet symbol: {reason}") from None
    try:
        graph = json.loads(text)
    except ValueError as err:
        fail(err)
    check_graph(graph, where)
    try:
        return to_symbol(graph)  # MXNet's reader takes no \u escapes, which JSON allows
    except MXNetError as err:
        fail(mxnet_message(err))


def summarize(sym):
    """Count the cast nodes of a symbol, by kind.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol or dict
        A converted symbol (or its JSON graph).

    Returns
    -------
    dict of str to int
        ``{"amp_cast:float16": n, "amp_multicast": m, ...}`` for the outer
        graph (``mxamp.graph.body_summaries`` counts those of its control-flow
        bodies).
    """
    return _cast_counts(_json_of(sym)["nodes"])


def _json_of(sym):
    """A symbol's JSON graph; a JSON graph as it is."""
    return sym if isinstance(sym, dict) else graph_json(sym)


def _cast_counts(nodes):
    counts = collections.Counter()
    for node in nodes:
        if node["op"] == "amp_cast":
            counts["amp_cast:" + node["attrs"]["dtype"]] += 1
        elif node["op"] == "amp_multicast":
            counts["amp_multicast"] += 1
    return dict(sorted(counts.items()))


def body_summaries(sym):
    """:func:`summarize` per control-flow body of a symbol (or its JSON
    graph), nested ones included: {"subgraph k of <node name>" (nested:
    joined by " in "): counts}."""
    result = {}

    def visit(graph, where):
        for node in graph["nodes"]:
            for k, body in enumerate(node.get("subgraphs", [])):
                name = f"subgraph {k} of {node['name']}{where}"
                result[name] = _cast_counts(body["nodes"])
                visit(body, f" in {name}")
    visit(_json_of(sym), "")
    return result


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


def infer_entry_types(sym, known, entries=None):
    """{(node id, output index): dtype code} for every entry of `sym`, given
    {input name: dtype code}; -1 where MXNet cannot tell. `entries`: those of
    the internals (:meth:`Graph.entries`), where the caller has them."""
    internals = sym.get_internals()
    heads = graph_json(internals)["heads"] if entries is None else entries
    inputs = set(sym.list_inputs())
    known = {k: v for k, v in known.items() if k in inputs and v >= 0}
    try:
        out_types = _infer_output_codes(internals, known)
    except MXNetError as err:
        raise ValueError(f"MXNet's type inference fails on the symbol: {err}") from None
    return {(h[0], h[1]): t for h, t in zip(heads, out_types)}


def infer_shapes(sym, known, what):
    """``sym.infer_shape_partial(**known)``, with a ValueError naming `what`
    (where the shapes came from) when they name no input or do not fit."""
    unknown = sorted(set(known) - set(sym.list_inputs()))
    if unknown:
        raise ValueError(f"{what} names {unknown}, which are not inputs of the graph; "
                         f"its inputs are {sorted(sym.list_inputs())}")
    try:
        return sym.infer_shape_partial(**known)
    except MXNetError as err:
        raise ValueError(f"the shapes of {sorted(known)} do not fit the graph: "
                         f"{mxnet_message(err)}") from None


def check_param_shapes(sym, params, data_shapes, where, shapes_from):
    """Checks the shapes of `params` ({name: NDArray}) against those MXNet
    infers for `sym` from the data inputs' shapes ({name: shape}): MXNet
    takes any array until it binds. (Inference from the parameters' own
    shapes is no check: MXNet's partial inference guesses wrong inside
    control-flow bodies.) `where` names the parameters' source in the
    errors, `shapes_from` the data shapes'."""
    args, _, aux = infer_shapes(sym, data_shapes, shapes_from)
    needed = dict(zip(sym.list_arguments() + sym.list_auxiliary_states(), args + aux))
    for name, shape in needed.items():
        if name in params and shape and 0 not in shape and params[name].shape != shape:
            raise ValueError(f"parameter {name!r} has shape {params[name].shape} in {where}, "
                             f"but the graph needs {shape} for the data shapes of "
                             f"{shapes_from}")


def infer_entry_shapes(graph, known):
    """{(node id, output index): shape} for every entry of a graph in MXNet's
    JSON form, given {input name: shape}; None marks unknown dimensions, and
    an entry of unknown rank has shape None."""
    internals = body_symbol(graph).get_internals()  # a control-flow body too
    heads = graph_json(internals)["heads"]
    _, out_shapes, _ = infer_shapes(internals, known, "input_shapes")
    # MXNet 1.x marks an unknown rank with () and an unknown dimension with 0.
    return {(h[0], h[1]): tuple(d or None for d in s) if s else None
            for h, s in zip(heads, out_shapes)}


def single_op(op, attrs, n_inputs):
    """A symbol of one `op` node fed by variables in0, in1, ..."""
    nodes = [{"op": "null", "name": f"in{i}", "inputs": []} for i in range(n_inputs)]
    nodes.append({"op": op, "name": "node", "attrs": dict(attrs),
                  "inputs": [[i, 0, 0] for i in range(n_inputs)]})
    return to_symbol({
        "nodes": nodes, "arg_nodes": list(range(n_inputs)), "heads": [[n_inputs, 0, 0]],
        "attrs": {"mxnet_version": ["int", 10901]}})


# Operators whose type inference kills MXNet 1.9.1 when run on the node
# alone (a segfault): a fused node needs the subgraph it carries.
UNTYPABLE = frozenset({"_sg_mkldnn_fully_connected"})


@functools.lru_cache(maxsize=4096)
def op_types(op, attrs, n_inputs, in0, fixed=()):
    """Runs MXNet's own type inference on one node with input 0 of dtype `in0`
    and the inputs in `fixed` ((index, code) pairs) of known dtypes.

    Returns (input dtypes, output dtypes, mutable input indices), or None when
    inference rejects that dtype, and for :data:`UNTYPABLE` operators. `attrs`
    is a sorted tuple of items.
    """
    if op in UNTYPABLE:
        return None
    names = [f"in{i}" for i in range(n_inputs)]
    try:
        sym = single_op(op, attrs, n_inputs)
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


def node_types(op, attrs, codes, in0):
    """:func:`op_types` for a node whose inputs have the dtype codes `codes`
    (-1: unknown), input 0 taken as `in0`. Non-float inputs are passed on:
    some ops (take, one_hot...) need them."""
    fixed = tuple((i, c) for i, c in enumerate(codes) if i and c not in FLOAT_OR_UNKNOWN)
    return op_types(op, attrs, len(codes), in0, fixed)


def low_slots(in_types, mutable, codes, target):
    """Input slots a node running in `target` wants in that dtype, given its
    :func:`op_types` input dtypes and mutable inputs and its inputs' codes:
    float (or unknown) inputs that type inference puts in `target` or leaves
    open; mutable ones (BatchNorm's statistics) stay as they are."""
    return frozenset(i for i, t in enumerate(in_types)
                     if i not in mutable and t in (target, -1) and codes[i] in FLOAT_OR_UNKNOWN)


# Control-flow operators: their bodies are the node's "subgraphs", each of
# which reads some of the node's inputs through its own variables.
CONTROL_FLOW_OPS = ("_foreach", "_while_loop", "_cond")
# The attribute naming, per subgraph, which node input each body variable
# reads (_foreach has one body and three attributes: see body_inputs).
_INPUT_LOCS = {"_while_loop": ("cond_input_locs", "func_input_locs"),
               "_cond": ("cond_input_locs", "then_input_locs", "else_input_locs")}


def _locs(node, key):
    """A control-flow node's list attribute `key` ("[0, 2]" or "(0,2)") as ints."""
    return [int(v) for v in re.findall(r"-?\d+", node.get("attrs", {}).get(key, ""))]


def body_inputs(node, k):
    """For subgraph `k` of a control-flow `node`: the node input that each
    of the body's variables (in the body's node order, which is the order
    MXNet binds them in) reads."""
    if node["op"] == "_foreach":
        # The node's inputs are its data, states, then the rest; these give
        # each one's position among the body's variables.
        places = _locs(node, "in_data_locs") + _locs(node, "in_state_locs") + \
            _locs(node, "remain_locs")
        reader = {place: j for j, place in enumerate(places)}
        return [reader.get(place, -1) for place in range(len(places))]
    return _locs(node, _INPUT_LOCS[node["op"]][k])


def carried_inputs(node):
    """The inputs of a control-flow `node` that are loop state: each
    iteration's body output replaces them for the next."""
    if node["op"] == "_foreach":
        first = len(_locs(node, "in_data_locs"))
        return frozenset(range(first, first + len(_locs(node, "in_state_locs"))))
    if node["op"] == "_while_loop":
        func = _locs(node, "func_input_locs")
        return frozenset(func[p] for p in _locs(node, "func_var_locs") if 0 <= p < len(func))
    return frozenset()


def sliced_inputs(node):
    """The inputs a control-flow `node` hands its body one slice (along axis
    0) per iteration: _foreach's data."""
    if node["op"] == "_foreach":
        return frozenset(range(len(_locs(node, "in_data_locs"))))
    return frozenset()


def body_variables(node, k):
    """{body variable's node id: the node input it reads} for subgraph `k`
    of a control-flow `node`; a ValueError when the node's attributes do
    not account for every variable."""
    body = node["subgraphs"][k]
    ids = [bid for bid, n in enumerate(body["nodes"]) if n["op"] == "null"]
    reads = body_inputs(node, k)
    if len(reads) != len(ids) or not all(0 <= j < len(node["inputs"]) for j in reads):
        raise ValueError(f"control-flow node {_short(node['name'])} ({node['op']}): its "
                         f"attributes map its {len(node['inputs'])} inputs to {reads}, which "
                         f"do not match the {len(ids)} variables of its subgraph {k}")
    return dict(zip(ids, reads))


def all_nodes(graph, prefix=()):
    """(path, node) for every node of a graph in MXNet's JSON form and of
    its control-flow bodies, nested ones included; a path is (node index,)
    in the graph and (node, subgraph, node, ...) inside a body."""
    for nid, node in enumerate(graph["nodes"]):
        yield (*prefix, nid), node
        for k, body in enumerate(node.get("subgraphs", [])):
            yield from all_nodes(body, (*prefix, nid, k))


def body_symbol(body):
    """The symbol of a control-flow body (a subgraph in MXNet's JSON form),
    or of a graph. A body has no version attribute, and MXNet's reader
    "upgrades" a graph without one: it gives a nested control-flow node an
    input per count of its num_args, one more than it has."""
    return to_symbol({"attrs": {"mxnet_version": ["int", 10901]}, **body})
