"""The oneDNN backend's time on large graphs: CPU seconds of one step on a
FullyConnected + relu chain of N nodes (N / 2 layers of 8 units), on one
thread, each step in a fresh process.

    OMP_NUM_THREADS=1 python bench/partition_time.py [--nodes 1000 3000 10000]
                                                     [--steps apply_backend convert quantize]

apply_backend is `apply_backend(compute="float32")`; convert is
`convert_model(target_dtype="bfloat16", backend="onednn")`; quantize is
`quantize_model(calib_mode="naive")` on two examples. Each line gives the
nodes, the step, its CPU seconds (time.process_time: on a shared machine it
moves far less than wall-clock) and the regions of its result.
"""
import argparse
import subprocess
import sys
import time

STEPS = ("apply_backend", "convert", "quantize")


def chain(n):
    """The chain of n nodes and its parameters."""
    import mxnet as mx
    x = mx.sym.var("data")
    params = {}
    for i in range(n // 2):
        x = mx.sym.FullyConnected(x, num_hidden=8, name=f"fc{i}")
        x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
        params[f"fc{i}_weight"] = mx.nd.random.uniform(-0.3, 0.3, (8, 8))
        params[f"fc{i}_bias"] = mx.nd.zeros(8)
    return x, params


def run_step(n, step):
    """One step on the chain of n nodes, in this process: prints its line."""
    import mxnet as mx
    import mxamp
    from mxamp import quantization
    sym, params = chain(n)
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
    print(n, step, f"{time.process_time() - start:.2f}", len(onednn.regions(out)), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_step(int(args.child[0]), args.child[1])
        return
    print("nodes step cpu_seconds regions")
    for n in args.nodes:
        for step in args.steps:
            subprocess.run([sys.executable, __file__, "--child", str(n), step], check=True)


if __name__ == "__main__":
    main()
