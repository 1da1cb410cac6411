"""The wire format between the decision walk and the C++ pass
(src/operator/amp_pass.cc follows it), sent as two string options of
``Symbol.optimize_for``:

``decisions``
    One line per operator node that gets a cast: ``<node index> <op> <codes>``,
    separated by single spaces. The index is the node's position in the
    symbol's JSON ``nodes`` list; a node inside a control-flow body (a node's
    ``subgraphs``) has a path instead, ``<node>/<subgraph>/<node>`` with one
    more ``/<subgraph>/<node>`` per level of nesting. The op is the node's
    operator name, which the pass checks at that place (catching a different
    numbering); ``codes`` has one code per input of the node. A body's casts
    are made inside that body. A line for a body's own outputs has the path
    of the body, ``<node>/<subgraph>`` (nested: one more pair per level),
    the word ``outputs`` for the op, and one code per output of the body.
``outputs``
    One code per graph output.

A code is one character: ``KEEP`` (the entry as it is), ``LOW`` (cast to the
target dtype), ``FP32`` (cast to float32), or ``MULTI`` (all inputs of the node
through one ``amp_multicast``; all of a node's codes or none). Node names
never travel: they may hold any character, a newline or a space included.
"""

from mxnet.base import MXNetError

from .. import native
from ..graph import check_extension_json

KEEP, LOW, FP32, MULTI = ".", "l", "f", "m"
BODY_OUTPUTS = "outputs"  # the op field of a line for a body's outputs


def path_of(key):
    """A decision's node key as a tuple path: a node index, or a tuple
    (node, subgraph, node, ...) for a node inside a control-flow body."""
    return key if isinstance(key, tuple) else (key,)


def node_at(graph, key):
    """The node of `graph` (the symbol's JSON form) a decision key names."""
    path = path_of(key)
    for nid, k in zip(path[:-1:2], path[1::2]):
        graph = graph["nodes"][nid]["subgraphs"][k]
    return graph["nodes"][path[-1]]


def encode(graph, decisions):
    """The ``decisions`` option for `decisions` of `graph`, the symbol's JSON
    form, whose node indices they use."""
    lines = [(path_of(key), node_at(graph, key)["op"], codes)
             for key, codes in decisions.nodes.items()]
    lines += [(path, BODY_OUTPUTS, codes) for path, codes in decisions.body_outputs.items()]
    return "\n".join(f"{'/'.join(map(str, path))} {op} {codes}"
                     for path, op, codes in sorted(lines) if codes.strip(KEEP))


def run_pass(sym, graph, decisions, target_dtype):
    """`sym` with the casts `decisions` asks for inserted by the C++ pass;
    `graph` is its JSON form."""
    check_extension_json(graph, "an extension library pass")
    native.load()
    try:
        return sym.optimize_for(native.PASS_NAME, skip_infer=True, target_dtype=target_dtype,
                                decisions=encode(graph, decisions), outputs=decisions.outputs)
    except MXNetError as err:
        raise RuntimeError(f"mxamp's graph pass failed: {err}") from None
