"""The wire format between the decision walk and the C++ pass
(src/operator/amp_pass.cc parses it): one cast code per operator input and
per graph output, sent as options of ``Symbol.optimize_for``."""
from mxnet.base import MXNetError

from .. import native

KEEP, LOW, FP32, MULTI = ".", "l", "f", "m"


def run_pass(sym, graph, decisions, target_dtype):
    """`sym` with the casts `decisions` asks for inserted by the C++ pass;
    `graph` is its JSON form, whose node indices the decisions use."""
    # One line per node: "<index> <codes> <name>"; the pass checks the name.
    lines = "\n".join(f"{nid} {codes} {graph['nodes'][nid]['name']}"
                      for nid, codes in sorted(decisions.nodes.items()))
    native.load()
    try:
        return sym.optimize_for(native.PASS_NAME, skip_infer=True, target_dtype=target_dtype,
                                decisions=lines, outputs=decisions.outputs)
    except MXNetError as err:
        raise RuntimeError(f"mxamp's graph pass failed: {err}") from None
