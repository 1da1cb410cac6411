"""The oneDNN backend's time on large graphs: CPU seconds of one step on a
graph of about N nodes, on one thread, each step in a fresh process.

    OMP_NUM_THREADS=1 python bench/partition_time.py [--graph chain|ladder|ladder-sin-cos]
                                                     [--nodes 1000 3000 10000]
                                                     [--steps apply_backend convert quantize]

chain (the default) is a FullyConnected + relu chain of N nodes (N / 2
layers of 8 units). ladder is N / 6 steps, each a FullyConnected, a relu and
an elemwise_add that also reads the last step's output through a `sin` left
outside the backend (six nodes a step with the weight and bias, where every
region MXNet's rules start would form a cycle); ladder-sin-cos reads it
through a `sin` and then a `cos` (N / 7 steps). apply_backend is
`apply_backend(compute="float32")`; convert is
`convert_model(target_dtype="bfloat16", backend="onednn")`; quantize is
`quantize_model(calib_mode="naive")` on two examples. Each line gives the
nodes (the chain's operators; a ladder's nodes, its variables included),
the step, its CPU seconds (time.process_time: on a shared machine it moves
far less than wall-clock) and the regions of its result.
"""
import argparse
import json
import subprocess
import sys
import time

STEPS = ("apply_backend", "convert", "quantize")
GRAPHS = ("chain", "ladder", "ladder-sin-cos")


def _weights(params, name):
    import mxnet as mx
    params[f"{name}_weight"] = mx.nd.random.uniform(-0.3, 0.3, (8, 8))
    params[f"{name}_bias"] = mx.nd.zeros(8)


def chain(n):
    """The chain of n nodes and its parameters."""
    import mxnet as mx
    x = mx.sym.var("data")
    params = {}
    for i in range(n // 2):
        x = mx.sym.FullyConnected(x, num_hidden=8, name=f"fc{i}")
        x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
        _weights(params, f"fc{i}")
    return x, params


def ladder(n, outside=("sin",)):
    """The ladder of n // (5 + len(outside)) steps, each reading the last
    through the operators `outside` (left on MXNet) and its parameters."""
    import mxnet as mx
    x = mx.sym.var("data")
    params = {}
    for i in range(n // (5 + len(outside))):
        step = mx.sym.Activation(mx.sym.FullyConnected(x, num_hidden=8, name=f"fc{i}"),
                                 act_type="relu", name=f"relu{i}")
        around = x
        for op in outside:
            around = getattr(mx.sym, op)(around, name=f"{op}{i}")
        x = mx.sym.elemwise_add(step, around, name=f"add{i}")
        _weights(params, f"fc{i}")
    return x, params


def graph(kind, n):
    """The graph `kind` of about n nodes, its parameters and the nodes to
    report."""
    if kind == "chain":
        return (*chain(n), n)
    sym, params = ladder(n, ("sin",) if kind == "ladder" else ("sin", "cos"))
    return sym, params, len(json.loads(sym.tojson())["nodes"])


def run_step(kind, n, step):
    """One step on the graph `kind` of n nodes, in this process: prints its
    line."""
    import mxnet as mx
    import mxamp
    from mxamp import quantization
    sym, params, nodes = graph(kind, n)
    onednn = mxamp.backends.get("onednn")
    onednn.load()
    data = mx.io.NDArrayIter(mx.nd.ones((2, 8)), batch_size=2)
    steps = {
        "apply_backend": lambda: onednn.apply_backend(sym, params, {}, compute="float32"),
        "convert": lambda: mxamp.convert_model(sym, params, {}, target_dtype="bfloat16",
                                               backend="onednn"),
        "quantize": lambda: quantization.quantize_model(
            sym, params, {}, label_names=(), calib_mode="naive", calib_data=data),
    }
    start = time.process_time()
    out = steps[step]()[0]
    print(nodes, step, f"{time.process_time() - start:.2f}", len(onednn.regions(out)),
          flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", choices=GRAPHS, default="chain")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_step(args.child[0], int(args.child[1]), args.child[2])
        return
    print("nodes step cpu_seconds regions")
    for n in args.nodes:
        for step in args.steps:
            subprocess.run([sys.executable, __file__, "--child", args.graph, str(n), step],
                           check=True)


if __name__ == "__main__":
    main()
