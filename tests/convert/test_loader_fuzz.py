"""Fuzzing the symbol loader: a small model's -symbol.json, mutated by
hypothesis (node and output indices out of range, keys missing or of the
wrong type, nodes that are not objects, duplicate names, cycles, huge
attributes), goes through ``load_symbol_json``, ``convert_model`` and
``mxamp convert``. Each outcome must be a model that type-checks or one
clear error (ValueError / TypeError; one 'Error:' line and status 1 from
the command), never a crash or a traceback. The cases run in a worker
subprocess, so a segmentation fault fails the test with its case instead
of ending pytest.

CI runs a fixed-seed profile of 60 cases; the long profile is

    MXAMP_FUZZ_EXAMPLES=3000 python -m pytest -q tests/convert/test_loader_fuzz.py
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("MXAMP_FUZZ_EXAMPLES", "60"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def base_model():
    """FullyConnected, BatchNorm (auxiliary states), a two-output split and
    its two outputs added: every kind of entry a mutation can break."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    parts = mx.sym.split(mx.sym.BatchNorm(fc, name="bn"), num_outputs=2, axis=1, name="split")
    sym = mx.sym.relu(mx.sym.elemwise_add(parts[0], parts[1], name="add"), name="relu")
    shapes, _, aux_shapes = sym.infer_shape(data=(2, 3))
    params = {f"arg:{n}": mx.nd.random.uniform(shape=s)
              for n, s in zip(sym.list_arguments(), shapes) if n != "data"}
    params.update((f"aux:{n}", mx.nd.random.uniform(0.5, 1, shape=s))
                  for n, s in zip(sym.list_auxiliary_states(), aux_shapes))
    return json.loads(sym.tojson()), params


# Reads one mutated symbol JSON per line; answers one JSON line per case:
# what each of the three entry points did, or "bad" with the traceback.
WORKER = r'''
import json, os, sys, tempfile, traceback
import mxnet as mx
from click.testing import CliRunner
import mxamp
from mxamp.graph import infer_entry_types, load_symbol_json
from mxamp.tools.cli import main

params_file = sys.argv[1]
saved = mx.nd.load(params_file)
args = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
aux = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
work = tempfile.mkdtemp()

def outcome(call):
    try:
        call()
        return "ok"
    except (ValueError, TypeError) as err:
        lines = str(err).splitlines()
        if len(lines) != 1:
            raise AssertionError(f"{type(err).__name__} of {len(lines)} lines: {err}")
        return f"error: {err}"

def convert(text):
    sym = load_symbol_json(text)
    inputs = set(sym.list_inputs())
    out, out_args, out_aux = mxamp.convert_model(
        sym, {k: v for k, v in args.items() if k in inputs},
        {k: v for k, v in aux.items() if k in inputs}, target_dtype="bfloat16")
    data = [n for n in out.list_inputs() if n not in out_args and n not in out_aux]
    infer_entry_types(out, {n: 0 for n in data})  # the converted model type-checks

def command(text):
    prefix = os.path.join(work, "m")
    with open(prefix + "-symbol.json", "w") as f:
        f.write(text)
    mx.nd.save(prefix + "-0000.params", saved)
    result = CliRunner().invoke(main, ["convert", prefix, "--dtype", "bfloat16", "--shape",
                                       "data:2,3", "--overwrite"])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    lines = result.stderr.splitlines()
    if result.exit_code not in (0, 1) or (result.exit_code == 1 and (
            len(lines) != 1 or not lines[0].startswith("Error: "))):
        raise AssertionError(f"exit status {result.exit_code}, stderr {result.stderr!r}")
    if result.exit_code:
        raise ValueError(lines[0])

for line in sys.stdin:
    text = json.loads(line)
    try:
        report = {"load": outcome(lambda: load_symbol_json(text)),
                  "convert_model": outcome(lambda: convert(text)),
                  "mxamp convert": outcome(lambda: command(text))}
    except BaseException:
        report = {"bad": traceback.format_exc()}
    print(json.dumps(report), flush=True)
'''


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    graph, params = base_model()
    params_file = str(tmp_path_factory.mktemp("fuzz") / "params")
    mx.nd.save(params_file, params)
    process = subprocess.Popen([sys.executable, "-c", WORKER, params_file], text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": ROOT})
    yield graph, process
    process.stdin.close()
    process.wait(timeout=60)


def run_case(process, text):
    process.stdin.write(json.dumps(text) + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if not line:
        status = process.wait(timeout=60)
        pytest.fail(f"the worker died (status {status}, signal {-status if status < 0 else None}) "
                    f"on {text[:2000]}")
    return json.loads(line)


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40), st.text(max_size=5),
                      st.lists(st.integers(-2, 12), max_size=4), st.just({}),
                      st.just({"x": 1}))
NODE_KEYS = st.sampled_from(["op", "name", "inputs", "attrs"])
GRAPH_KEYS = st.sampled_from(["nodes", "heads", "arg_nodes", "node_row_ptr", "attrs"])


@st.composite
def mutation(draw, graph):
    """One change to `graph` (in place); returns its description."""
    nodes = graph["nodes"]
    n = draw(st.integers(0, len(nodes) - 1))
    ops = [i for i, node in enumerate(nodes)  # nodes with entries to change
           if isinstance(node, dict) and node.get("op") != "null"
           and isinstance(node.get("inputs"), list) and node["inputs"]
           and all(isinstance(e, list) and len(e) > 1 for e in node["inputs"])]
    kind = draw(st.sampled_from(["node id", "output index", "head", "drop key", "drop graph key",
                                 "mistype", "not an object", "duplicate name", "cycle",
                                 "huge attribute", "attribute text"]))
    node = nodes[n]
    if kind in ("node id", "output index", "cycle") and ops:
        node = nodes[draw(st.sampled_from(ops))]
        entry = node["inputs"][draw(st.integers(0, len(node["inputs"]) - 1))]
        if kind == "node id":
            entry[0] = draw(st.integers(-3, len(nodes) + 3))
        elif kind == "output index":
            entry[1] = draw(st.integers(-2, 6))
        else:
            entry[0] = draw(st.integers(nodes.index(node), len(nodes) - 1))
    elif kind == "head":
        graph["heads"] = [[draw(st.integers(-1, len(nodes))), draw(st.integers(-1, 4)), 0]]
    elif kind == "drop key" and isinstance(node, dict):
        node.pop(draw(NODE_KEYS), None)
    elif kind == "drop graph key":
        graph.pop(draw(GRAPH_KEYS), None)
    elif kind == "mistype" and isinstance(node, dict):
        node[draw(NODE_KEYS)] = draw(ANY_VALUE)
    elif kind == "not an object":
        nodes[n] = draw(ANY_VALUE.filter(lambda v: not isinstance(v, dict)))
    elif kind == "duplicate name" and isinstance(node, dict):
        other = nodes[draw(st.integers(0, len(nodes) - 1))]
        if isinstance(other, dict) and "name" in other:
            node["name"] = other["name"]
    elif kind in ("huge attribute", "attribute text") and ops:
        node = nodes[draw(st.sampled_from(ops))]
        attrs = node["attrs"] = node.get("attrs") if isinstance(node.get("attrs"), dict) else {}
        key = draw(st.sampled_from(sorted(attrs) + ["num_hidden", "eps", "axis", "bogus"]))
        attrs[key] = (draw(st.sampled_from(["9" * 400, "x" * 100_000, "1e308", "-1"]))
                      if kind == "huge attribute" else draw(st.text(max_size=8)))
    return kind


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_mutated_symbol_json_loads_converts_or_fails_clearly(worker, data):
    base, process = worker
    graph = json.loads(json.dumps(base))
    kinds = []
    for _ in range(data.draw(st.integers(1, 3))):
        if not (isinstance(graph.get("nodes"), list) and graph["nodes"]):
            break  # nothing left to mutate
        kinds.append(data.draw(mutation(graph)))
    report = run_case(process, json.dumps(graph))
    assert "bad" not in report, f"{kinds}: {report['bad']}"
