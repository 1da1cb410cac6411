"""What oneDNN runs, from its log (ONEDNN_VERBOSE=1), for the tests that
check a region's primitives: the test runs a child Python with `run`; the
child marks the calls it logs with `marked` or `call`; `run` returns the
primitive (exec) lines of each, split at commas, and `kind`, `types` and
`layout` read the fields tests compare.

A line: onednn_verbose,exec,cpu,KIND,IMPLEMENTATION,PROP_KIND,
MEMORY_DESCRIPTORS (space separated, 'src_s8::blocked:acbd::f0'),
ATTRIBUTES,AUXILIARY,PROBLEM,TIME.
"""
import contextlib
import ctypes
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
# What the child keeps from the test's environment in any case: CI reruns
# the CPU-sensitive tests under these limits.
ISA_LIMITS = ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA")
MARK, END = "=== onednn_verbose: ", "=== onednn_verbose end"


def run(args, env=None, cwd=None):
    """Runs `python *args` in environment `env` (the test's own by default)
    with ONEDNN_VERBOSE=1, the test's ISA limits and tests/ on PYTHONPATH
    (for this module and isa). Returns {label: [fields, ...]}: the exec
    lines the child logged in each block `marked(label)`, split at commas."""
    base = os.environ if env is None else env
    full = {**base, **{k: os.environ[k] for k in ISA_LIMITS if k in os.environ},
            "ONEDNN_VERBOSE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, base.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logs, label = {}, None
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            label = line[len(MARK):]
            assert label not in logs, f"{label!r} marked twice"
            logs[label] = []
        elif line == END:
            label = None
        elif label is not None and line.startswith("onednn_verbose,exec,"):
            logs[label].append(line.split(","))
    return logs


def _flush():
    sys.stdout.flush()
    ctypes.CDLL(None).fflush(None)  # oneDNN logs through C stdio


@contextlib.contextmanager
def marked(label):
    """In the child: what oneDNN logs inside the block is `label`'s."""
    _flush()
    print(MARK + label, flush=True)
    yield
    _flush()
    print(END, flush=True)


def call(ex, nth, label):
    """In the child: runs executor `ex` nth times and marks the last call
    `label` (the earlier ones plan the region and pack its weights)."""
    for _ in range(nth - 1):
        ex.forward(is_train=False)[0].wait_to_read()
    with marked(label):
        ex.forward(is_train=False)[0].wait_to_read()


def kind(fields):
    """The primitive kind: 'convolution', 'reorder', ..."""
    return fields[fields.index("cpu") + 1]


def descs(fields):
    """The memory descriptors: ['src_u8::blocked:acdb::f0', 'wei_s8:...', ...]."""
    return next(f for f in fields if f.startswith("src_")).split()


def types(fields):
    """{'src': 'u8', 'wei': 's8', 'dst': 'f32', ...}: each argument's data type."""
    return dict(d.split(":")[0].split("_", 1) for d in descs(fields))


def layout(desc):
    """The layout tag of a memory descriptor: 'acbd' of 'src_s8::blocked:acbd::f0'."""
    return desc.split(":")[3]
