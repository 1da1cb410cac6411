"""mxamp's INT8 models in processes that set no thread count, as a user's
script runs them: regions on one thread per core (the default,
mxamp.backends.onednn.region_threads) against the count MXNet gives its own
operators, half the CPUs on x86 (to leave out hyper-threads). The children
get none of mxamp.backends.onednn.THREAD_VARIABLES from this process's
environment.

    python bench/default_threads.py [--models resnet50 mobilenetv2 bert]
                                    [--batches 1 16] [--layers 12] [--runs 7]
                                    [--warmup 2] [--burst 10]

Each network (random weights, bench/benchlib.py) is quantized by mxamp
(naive, 2 calibration batches) and exported once per batch, then loaded in
two serving children, neither with OMP_NUM_THREADS: one as is, one with
MXNET_OMP_MAX_THREADS set to MXNet's own default count (regions then keep
MXNet's count, as before). Their calls are timed interleaved round by round
(wall-clock, `--burst` calls each per round). Prints the CPU, the threads
each child's regions run on, both medians and the speed-up. Where MXNet's
count already is one per core (a CPU with two hyper-threads per core) the
two children are the same and the ratio is noise.
"""
import argparse
import os
import sys
import tempfile


def serve():
    """A serving child: loads an export and times its calls (onnx_anchor's
    protocol). It imports no benchlib, which sets OMP_NUM_THREADS."""
    import mxnet as mx
    import numpy as np

    import mxamp.backends
    import onnx_anchor
    from mxamp.dtypes import as_numpy, to_ndarray

    answers = onnx_anchor.answering()
    onednn = mxamp.backends.get("onednn")
    state = {}

    def load(prefix, input):
        block = mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"],
                                             f"{prefix}-0000.params", ctx=mx.cpu())
        block.hybridize(static_alloc=True, static_shape=True)
        x = to_ndarray(np.load(input))
        state["run"] = lambda: as_numpy(block(x))
        state["run"]()
        return {"threads": onednn.region_threads()}

    onnx_anchor.serve({"load": load,
                       "time": lambda calls: onnx_anchor.timed_call(state["run"], calls)},
                      answers)


def compared(served, children, mxnet_count, args):
    """The export `served` loaded in each child (name -> environment), their
    calls timed interleaved; the variants, named with their regions' threads
    (`mxnet_count` where the child keeps MXNet's)."""
    import benchlib as bl

    running, variants = [], []
    try:
        for name, env in children.items():
            child = bl.AnchorProcess(sys.executable, (__file__, "--serve"), env=env, threads=None)
            running.append(child)
            threads = child.ask(cmd="load", prefix=served, input=f"{served}-x.npy")["threads"]
            threads = threads or mxnet_count
            variants.append(bl.Variant(f"{name} ({threads} thread{'s' * (threads > 1)})"))
            variants[-1].served = lambda calls, child=child: child.ask(cmd="time", calls=calls)
        bl.time_interleaved(variants, args.warmup, args.runs, burst=args.burst)
        return variants
    finally:
        for child in running:
            child.close()


def main():
    import benchlib as bl
    from mxamp.backends.onednn import THREAD_VARIABLES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(bl.MODEL_KEYS), choices=bl.MODEL_KEYS)
    parser.add_argument("--batches", type=int, nargs="+",
                        help="default: 1, then the network's bench batch")
    parser.add_argument("--layers", type=int, default=bl.ENCODER_LAYERS)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--burst", type=int, default=10)
    args = parser.parse_args()
    # MXNet's own default: half the CPUs this process may run on (x86)
    mxnet_count = max(len(os.sched_getaffinity(0)) // 2, 1)
    environment = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    children = {"one per core": environment,
                "MXNet's count": {**environment, "MXNET_OMP_MAX_THREADS": str(mxnet_count)}}
    print(bl.cpu_description())
    print(f"runs {args.runs} after {args.warmup} warm-up, a burst of {args.burst} calls per "
          "child per round; median ms per call, wall-clock")
    models = bl.models(args.layers)
    with tempfile.TemporaryDirectory() as work:
        for key in args.models:
            model = models[key]
            prefix = bl.export_model(model, key, work, calibrate_batchnorm=True)
            for batch in args.batches or (1, model.batch):
                served = f"{work}/{key}-{batch}-int8"
                x = model.make_input(batch)
                quantized = bl.mxamp_int8(bl.imported(prefix),
                                          [model.make_input(batch, seed=s + 1) for s in (0, 1)])
                quantized(x)
                quantized.export(served)
                bl.np.save(f"{served}-x.npy", x.asnumpy())
                variants = compared(served, children, mxnet_count, args)
                ours, theirs = (bl.median(v) * 1e3 for v in variants)
                print(f"{model.title}, batch {batch}: " + "; ".join(
                    f"{v.name} {bl.median(v) * 1e3:.2f}" for v in variants) +
                    f"; {theirs / ours:.2f}x")


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main()
