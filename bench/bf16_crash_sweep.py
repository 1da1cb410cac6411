"""Which operators crash MXNet 1.9.1's CPU kernels in bfloat16: asks the
kernel probe about every registered operator, each operator in a subprocess
of its own, and lists those whose subprocess dies by a signal or whose heap
glibc finds corrupted.

    python bench/bf16_crash_sweep.py [OP ...] [--workers N] [--json OUT]

Every operator is swept, whatever its default category: with user lists
(`fp32_ops=[]`, `target_dtype_ops=[...]`) a conversion can probe any of
them. Each is asked as conversion asks it (mxamp.convert.probe.run_kernel,
the probe's own shape guesses): with default attributes, each act_type /
pool_type, and the attributes the nodes of three networks carry (see
benchlib.network_nodes), with 1-3 inputs wherever MXNet's type inference
takes bfloat16. A subprocess first finds the float32 shapes, then runs the
bfloat16 kernel (twice more where it ran), and says before each step which
it is taking: a death after "bfloat16" is bfloat16's. glibc's heap checks
are on (libc_malloc_debug, glibc.malloc.check=3), so an overwrite aborts at
the next free instead of by chance. The operators found belong in
mxamp.convert.probe.CORRUPTING, those dying before any bfloat16 run in
probe.UNRUNNABLE; the exit status says whether any was found.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
MALLOC_DEBUG = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"
# What glibc prints when it finds its heap damaged (then it aborts).
HEAP_MESSAGES = re.compile(r"double free|corrupt|free\(\)|malloc|munmap_chunk|realloc\(\)|"
                           r"fastbin|tcache")
TIMEOUT = 300  # seconds for one operator's subprocess


def configs():
    """{op: [(attrs pairs, number of inputs)]}: the questions to ask each operator."""
    import benchlib
    from kernel_speed import EXTRA_ATTRS, KIND_ATTRS, KINDS
    from mxamp.registry import canonical_op_names

    wanted = set()
    for op in set(canonical_op_names().values()):
        kinds = [((KIND_ATTRS[op], kind),) for kind in KINDS.get(op, ())] or [()]
        wanted |= {(op, tuple(sorted(EXTRA_ATTRS.get(op, ()) + kind)), n)
                   for kind in kinds for n in (1, 2, 3)}
    wanted |= benchlib.network_nodes()
    found = {}
    for op, attrs, n in sorted(wanted):
        found.setdefault(op, []).append((attrs, n))
    return found


def child():
    """Asks the probe the questions given on stdin where MXNet's type
    inference takes bfloat16, saying before each step which it takes (type
    inference crashes MXNet for some operators too)."""
    import mxnet as mx

    from mxamp.convert import probe
    from mxamp.dtypes import DTYPE_CODES
    from mxamp.graph import node_types
    for i, (op, attrs, n) in enumerate(json.load(sys.stdin)):
        attrs = tuple(map(tuple, attrs))
        print(f"types {i}", flush=True)
        info = node_types(op, attrs, (-1,) * n, DTYPE_CODES["bfloat16"])
        if info is None:
            print(f"answer {i} untyped", flush=True)
            continue
        in_types = tuple(info[0])
        print(f"float32 {i}", flush=True)
        shapes = probe._fitting_shapes(op, attrs, n, mx.cpu(), 2)
        print(f"bfloat16 {i}", flush=True)
        answer = probe.run_kernel(op, attrs, in_types, "bfloat16", mx.cpu())
        if answer and shapes is not None:  # again, where heap damage shows late
            sym = probe.single_op(op, attrs, n)
            for _ in range(2):
                probe.runs(sym, shapes, probe._low_types(sym, in_types, "bfloat16"), mx.cpu())
        print(f"answer {i} {answer}", flush=True)


def ask(op, questions):
    """The outcome of one operator's subprocess: {"op", "outcome", ...};
    outcome "ok", "error" (a Python error: its last line), or where it died
    by a signal or a corrupted heap ("float32" / "bfloat16") with the
    question, its exit status and glibc's message."""
    # glibc writes its fatal messages to the terminal unless told to use stderr.
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.check=3", LIBC_FATAL_STDERR_="1")
    if os.path.exists(MALLOC_DEBUG):
        env["LD_PRELOAD"] = MALLOC_DEBUG
    request = json.dumps([(op, attrs, n) for attrs, n in questions])
    try:
        done = subprocess.run([sys.executable, __file__, "--child"], input=request, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"op": op, "outcome": "timeout"}
    steps = [line.split() for line in done.stdout.splitlines()]
    heap = HEAP_MESSAGES.findall(done.stderr)
    if done.returncode == 0 and not heap:
        return {"op": op, "outcome": "ok", "answers": [s[2] for s in steps if s[0] == "answer"]}
    if done.returncode > 0 and not heap:  # an exception, not a death
        return {"op": op, "outcome": "error", "message": done.stderr.strip().splitlines()[-1:]}
    # Where it died: the last step it announced ("exit": after its last answer).
    stage, index = steps[-1][:2] if steps else ("import", 0)
    return {"op": op, "outcome": "exit" if stage == "answer" else stage,
            "question": questions[int(index)] if questions else None,
            "status": done.returncode,
            "glibc": done.stderr.strip().splitlines()[-1:] if heap else []}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ops", nargs="*", help="only these operators (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every operator's outcome here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child()
    sys.path.insert(0, str(HERE))
    questions = configs()
    ops = args.ops or sorted(questions)
    print(f"{len(ops)} operators, {sum(len(questions.get(op, ())) for op in ops)} questions",
          file=sys.stderr)
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        outcomes = list(pool.map(lambda op: ask(op, questions.get(op, [])), ops))
    for o in outcomes:
        if o["outcome"] == "error":
            print(f"{o['op']}: raised {' '.join(o['message'])}")
    died = [o for o in outcomes if o["outcome"] not in ("ok", "error")]
    for o in died:
        print(f"{o['op']}: died in {o['outcome']} (status {o.get('status')}) "
              f"{o.get('question')} {' '.join(o.get('glibc', []))}")
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1) + "\n")
    crashed = sorted(o["op"] for o in died if o["outcome"] == "bfloat16")
    print(f"bfloat16 crashes: {crashed}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
