"""Helpers for tests: graph structure in a form independent of node names,
the small float32 network the command-line tests convert, and counts of
the graph's serializations and parses."""
import collections
import json

import mxnet as mx
from mxnet import gluon

from mxamp.backends import onednn

from mxamp.graph import graph_json as nodes_of  # the graph, casts included


def tiny_net(shape=(1, 3, 8, 8)):
    """Conv -> BatchNorm -> relu -> pool -> Dense in float32, hybridized and
    run once on ones of `shape`; named in fresh name counters (conv0, dense0
    whatever ran before in the process)."""
    mx.random.seed(0)
    with mx.name.NameManager():
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(),
                gluon.nn.Activation("relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.ones(shape))
    return net


def structure(sym):
    """The multiset of cast nodes, each described by what it casts, in a form
    independent of the cast nodes' names; plus each operator's inputs and the
    graph outputs described the same way."""
    graph = nodes_of(sym)
    nodes = graph["nodes"]
    memo = {}

    def entry(e):
        nid, idx = e[0], e[1]
        node = nodes[nid]
        if node["op"] == "amp_cast":
            return ("amp_cast", node["attrs"]["dtype"], entry(node["inputs"][0]))
        if node["op"] == "amp_multicast":
            if nid not in memo:
                memo[nid] = tuple(entry(i) for i in node["inputs"])
            return ("amp_multicast", idx, memo[nid])
        return (node["name"], idx)

    casts = collections.Counter()
    ops = {}
    for node in nodes:
        if node["op"] == "amp_cast":
            casts[entry([nodes.index(node), 0])] += 1
        elif node["op"] == "amp_multicast":
            casts[("amp_multicast", tuple(entry(i) for i in node["inputs"]))] += 1
        elif node["op"] != "null":
            ops[node["name"]] = tuple(entry(i) for i in node["inputs"])
    heads = tuple(entry(h) for h in graph["heads"])
    return casts, ops, heads


def pruned(graph):
    """`graph` (JSON form, nodes in topological order) without the nodes its
    heads do not reach, renumbered."""
    nodes = graph["nodes"]
    keep, stack = set(), [h[0] for h in graph["heads"]]
    while stack:
        nid = stack.pop()
        if nid not in keep:
            keep.add(nid)
            stack.extend(e[0] for e in nodes[nid]["inputs"])
    where = {old: new for new, old in enumerate(sorted(keep))}

    def renumber(entries):
        return [[where[e[0]], *e[1:]] for e in entries]
    kept = [{**nodes[i], "inputs": renumber(nodes[i]["inputs"])} for i in sorted(keep)]
    out = {k: v for k, v in graph.items() if k != "node_row_ptr"}
    out.update(nodes=kept, heads=renumber(graph["heads"]),
               arg_nodes=[i for i, n in enumerate(kept) if n["op"] == "null"])
    return out


def count_graph_work(monkeypatch):
    """{kind: n}: each time a whole graph is serialized or parsed from now on
    (until monkeypatch undoes it). A whole graph is MXNet's JSON form of a
    graph, a model's or a region's subgraph: an object with "nodes". Kinds:
    "tojson" (Symbol.tojson), "load_json" (mx.sym.load_json), "dumps" and
    "loads" (json.dumps of such an object, json.loads giving one), and
    "library" (a call of the oneDNN backend's library handed such text)."""
    calls = count_json_calls(monkeypatch)
    calls.update(dumps=0, loads=0, library=0)
    dumps, loads = json.dumps, json.loads

    def counted_dumps(value, *args, **kwargs):
        calls["dumps"] += isinstance(value, dict) and "nodes" in value
        return dumps(value, *args, **kwargs)

    def counted_loads(text, *args, **kwargs):
        value = loads(text, *args, **kwargs)
        calls["loads"] += isinstance(value, dict) and "nodes" in value
        return value
    monkeypatch.setattr(json, "dumps", counted_dumps)
    monkeypatch.setattr(json, "loads", counted_loads)
    library = onednn._library(onednn.load())
    monkeypatch.setattr(onednn, "_library", lambda path: _Counted(library, calls))
    return calls


class _Counted:
    """The backend library's functions, each call handed graph text counted."""

    def __init__(self, library, calls):
        self._library, self._calls = library, calls

    def __getattr__(self, name):
        function = getattr(self._library, name)

        def counted(*args):
            self._calls["library"] += any(isinstance(a, bytes) and b'"nodes"' in a
                                          for a in args)
            return function(*args)
        return counted


def count_json_calls(monkeypatch):
    """{"tojson": n, "load_json": n}: the calls of Symbol.tojson and
    mx.sym.load_json from now on (until monkeypatch undoes them)."""
    calls = {"tojson": 0, "load_json": 0}
    tojson, load_json = mx.sym.Symbol.tojson, mx.sym.load_json

    def counted_tojson(self, *args, **kwargs):
        calls["tojson"] += 1
        return tojson(self, *args, **kwargs)

    def counted_load_json(text):
        calls["load_json"] += 1
        return load_json(text)
    monkeypatch.setattr(mx.sym.Symbol, "tojson", counted_tojson)
    monkeypatch.setattr(mx.sym, "load_json", counted_load_json)
    return calls
