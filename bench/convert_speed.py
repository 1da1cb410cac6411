"""Conversion time, side by side: mxamp.convert_hybrid_block against the
reference, mxnet.contrib.amp.convert_hybrid_block (ctx=mx.cpu()).

    python bench/convert_speed.py [--models resnet50_v1 mobilenetv2_1.0] [--dtype bfloat16]
                                  [--rounds 7] [--first-rounds 3] [--zoo N] [--json OUT]

Each network is a GluonCV zoo network built with pretrained=False,
initialized (net.initialize()), hybridized and run forward once on one image
of its input size (mxamp.tools.zoo.input_shape) before it is converted. Three
measurements, each timed by the CPU time of the process (time.process_time:
on a machine other jobs share it moves far less than wall-clock, also
printed):

  again   both libraries in this process, each warmed by one conversion
          first, then --rounds rounds of one conversion each, the order
          alternating from round to round (reference, mxamp; mxamp,
          reference; ...)
  first   the first conversion in a fresh process: --first-rounds rounds of
          one child process per library, alternating which runs first; a
          child running the reference never imports mxamp
  zoo     with --zoo N: N classification networks of the zoo (every other
          one of mxamp.tools.zoo.model_names('classification') in name
          order, up to N) converted in one fresh process by both libraries,
          network by network, the order alternating (mxamp first for the
          first network, so that the process's first-call costs fall on
          it); the totals over the networks both converted

Ratios are mxamp's time over the reference's: the ratio of the medians and
the median of each round's ratio (its pair ran back to back).
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

TOOLS = ("reference", "mxamp")
DEFAULT_MODELS = ("resnet50_v1", "mobilenetv2_1.0")


def network(name, shape):
    """The zoo network `name`, initialized, hybridized and run once on an
    input of `shape`."""
    import mxnet as mx
    from gluoncv import model_zoo
    net = model_zoo.get_model(name, pretrained=False)
    net.initialize()
    net.hybridize()
    net(mx.nd.ones(shape)).wait_to_read()
    return net


def input_shape(name):
    """The input shape mxamp's zoo batch builds `name` for (batch 1)."""
    from mxamp.tools.zoo import input_shape as shape_of
    return list(shape_of(name))


def converter(tool, dtype):
    """A function converting a block with `tool`."""
    import mxnet as mx
    if tool == "reference":
        from mxnet.contrib import amp
        return lambda net: amp.convert_hybrid_block(net, target_dtype=dtype, ctx=mx.cpu())
    import mxamp
    return lambda net: mxamp.convert_hybrid_block(net, target_dtype=dtype)


def timed(convert, net):
    """The CPU and wall-clock seconds of one conversion of `net` when the
    call returned ('cpu', 'wall') and once the copies it left MXNet's engine
    to make were done ('cpu_done', 'wall_done')."""
    import mxnet as mx
    cpu, wall = time.process_time(), time.perf_counter()
    convert(net)
    times = {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}
    mx.nd.waitall()
    return {**times, "cpu_done": time.process_time() - cpu,
            "wall_done": time.perf_counter() - wall}


def child_first(spec):
    """One library's first conversion in this fresh process."""
    net = network(spec["model"], spec["shape"])
    convert = converter(spec["tool"], spec["dtype"])  # imports the library
    return timed(convert, net)


def child_zoo(spec):
    """Both libraries over the zoo networks, network by network."""
    converts = {tool: converter(tool, spec["dtype"]) for tool in TOOLS}
    results = []
    for k, (name, shape) in enumerate(spec["networks"]):
        row = {"model": name}
        try:
            net = network(name, shape)
        except Exception as err:  # noqa: BLE001 - a network that does not build is skipped
            results.append({**row, "error": f"build: {err}".splitlines()[0]})
            continue
        for tool in (TOOLS[::-1] if k % 2 == 0 else TOOLS):
            try:
                row[tool] = timed(converts[tool], net)
            except Exception as err:  # noqa: BLE001 - recorded, the batch goes on
                row[tool] = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
        results.append(row)
    return results


def child(spec):
    """A child process's measurement, printed as one JSON line."""
    warnings.simplefilter("ignore")
    work = child_first if spec["kind"] == "first" else child_zoo
    print(json.dumps(work(spec)))


def in_child(spec):
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                          capture_output=True, text=True, cwd=Path(__file__).parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("{", "["))]
    if done.returncode or not lines:
        raise RuntimeError(f"the {spec['kind']} child failed: "
                           f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(lines[-1])


def again(name, dtype, rounds):
    """Both libraries' conversions of `name` in this process, interleaved."""
    net = network(name, input_shape(name))
    converts = {tool: converter(tool, dtype) for tool in TOOLS}
    for tool in TOOLS:
        converts[tool](net)  # the process's first conversion is not this measurement
    times = {tool: [] for tool in TOOLS}
    for n in range(rounds):
        for tool in (TOOLS if n % 2 == 0 else TOOLS[::-1]):
            times[tool].append(timed(converts[tool], net))
    return times


def first(name, dtype, rounds):
    """Each library's first conversion of `name`, one fresh process each."""
    times = {tool: [] for tool in TOOLS}
    for n in range(rounds):
        for tool in (TOOLS if n % 2 == 0 else TOOLS[::-1]):
            times[tool].append(in_child({"kind": "first", "model": name, "tool": tool,
                                         "shape": input_shape(name), "dtype": dtype}))
    return times


CLOCKS = ("cpu", "cpu_done", "wall", "wall_done")


def summary(times):
    """Medians and mxamp / reference ratios per clock."""
    result = {}
    for clock in CLOCKS:
        ref, ours = ([t[clock] for t in times[tool]] for tool in TOOLS)
        result[clock] = {"reference": statistics.median(ref), "mxamp": statistics.median(ours),
                         "ratio_of_medians": statistics.median(ours) / statistics.median(ref),
                         "median_ratio": statistics.median(a / b for a, b in zip(ours, ref))}
    return result


def print_row(label, result):
    cells = "".join(f"{result[c]['reference']:>8.3f}{result[c]['mxamp']:>8.3f}"
                    f"{result[c]['ratio_of_medians']:>7.2f}x" for c in ("cpu", "cpu_done"))
    walls = "".join(f"{result[c]['ratio_of_medians']:>7.2f}x" for c in ("wall", "wall_done"))
    print(f"{label:<27}{cells}{result['cpu']['median_ratio']:>7.2f}x{walls}", flush=True)


def zoo_batch(count, dtype):
    """The zoo batch's rows and totals over the networks both converted."""
    from mxamp.tools.zoo import model_names
    names = model_names("classification")[::2][:count]
    rows = in_child({"kind": "zoo", "networks": [(n, input_shape(n)) for n in names],
                     "dtype": dtype})
    done = [r for r in rows if all(isinstance(r.get(t), dict) and "cpu" in r[t] for t in TOOLS)]
    totals = {tool: {clock: sum(r[tool][clock] for r in done) for clock in CLOCKS}
              for tool in TOOLS}
    return {"rows": rows, "converted": len(done), "totals": totals,
            "failed": [r for r in rows if r not in done]}


HEADER = (f"{'':<27}{'ref':>8}{'mxamp':>8}{'ratio':>8}{'ref':>8}{'mxamp':>8}{'ratio':>8}"
          f"{'med.r':>8}{'wall':>8}{'wall':>8}\n"
          f"{'':<27}{'--- CPU s, call returned ---':>24}{'--- CPU s, copies done ---':>24}"
          f"{'call':>8}{'call':>8}{'done':>8}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        help="GluonCV zoo names (default: %(default)s)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--rounds", type=int, default=7,
                        help="conversions of each library in one process (default 7)")
    parser.add_argument("--first-rounds", type=int, default=3,
                        help="fresh processes per library for the first call (default 3; 0: "
                             "skip)")
    parser.add_argument("--zoo", type=int, default=0,
                        help="also convert a zoo batch of this many networks (0: skip)")
    parser.add_argument("--json", help="also write every measurement to this JSON file")
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.rounds < 1 or args.first_rounds < 0 or args.zoo < 0:
        parser.error("--rounds must be at least 1, --first-rounds and --zoo at least 0")
    warnings.simplefilter("ignore")
    from benchlib import cpu_description, machine
    print(f"CPU: {cpu_description()}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; "
          f"target {args.dtype}; seconds per conversion, medians (cpu: process CPU time)")
    print(HEADER)
    results = {}
    for name in args.models:
        results[name] = {"again": again(name, args.dtype, args.rounds)}
        print_row(f"{name} again ({args.rounds})", summary(results[name]["again"]))
        if args.first_rounds:
            results[name]["first"] = first(name, args.dtype, args.first_rounds)
            print_row(f"{name} first ({args.first_rounds})", summary(results[name]["first"]))
    zoo = None
    if args.zoo:
        zoo = zoo_batch(args.zoo, args.dtype)
        ref, ours = (zoo["totals"][t] for t in TOOLS)
        cells = "".join(f"{ref[c]:>8.2f}{ours[c]:>8.2f}{ours[c] / ref[c]:>7.2f}x"
                        for c in ("cpu", "cpu_done"))
        print(f"{'zoo, ' + str(zoo['converted']) + ' networks (totals)':<27}{cells}{'':>8}"
              f"{ours['wall'] / ref['wall']:>7.2f}x{ours['wall_done'] / ref['wall_done']:>7.2f}x")
        for row in zoo["failed"]:
            print(f"   not in the totals: {row}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": machine(), "dtype": args.dtype, "rounds": args.rounds,
             "first_rounds": args.first_rounds,
             "models": {name: {**r, **{f"{k}_summary": summary(v) for k, v in r.items()}}
                        for name, r in results.items()},
             "zoo": zoo}, indent=1))


if __name__ == "__main__":
    main()
