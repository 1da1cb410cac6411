"""Helpers for tests: graph structure in a form independent of node names."""
import collections

from mxamp.graph import graph_json as nodes_of  # the graph, casts included


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
