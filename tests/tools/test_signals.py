"""SIGINT (Ctrl-C), SIGTERM (timeout, kill, docker stop, CI runners) and
SIGHUP (a closed terminal or ssh session) at several points of an ``mxamp
convert`` run, in a subprocess as a user meets them: the run ends with one
line (status 130 / 143 / 129) and leaves either the complete previous output
or the complete new one, and no staging directory. SIGKILL at each step of
publishing leaves the same, once the next run or load has recovered it."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from graphs import tiny_net
from mxamp.tools import publish

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.dirname(os.path.abspath(__file__))])}
# What the console script `mxamp` runs (pyproject.toml's entry point).
COMMAND = [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()"]
SHAPE = ["--shape", "data:1,3,8,8"]
STATUS = {signal.SIGINT: (130, "Aborted."), signal.SIGTERM: (143, "Terminated."),
          signal.SIGHUP: (129, "Hangup.")}
SIGNALS = pytest.mark.parametrize("signum", list(STATUS), ids=lambda s: signal.Signals(s).name)


def convert(directory, dtype):
    return subprocess.Popen([*COMMAND, "convert", "tiny", "--dtype", dtype, *SHAPE, "--out",
                             "out", "--overwrite"], cwd=directory, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def pair(directory):
    """The output pair's bytes, or None for each file that is missing."""
    return tuple(open(p, "rb").read() if os.path.exists(p) else None
                 for p in (directory / "out-symbol.json", directory / "out-0000.params"))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A directory holding an exported float32 model and the pairs that
    `mxamp convert` writes from it for float16 (the previous output in the
    tests) and for bfloat16 (the new one)."""
    directory = tmp_path_factory.mktemp("signals")
    net = tiny_net()
    net.export(str(directory / "tiny"))
    pairs = {}
    for dtype in ("bfloat16", "float16"):  # the float16 pair stays, as the previous output
        run = convert(directory, dtype)
        assert run.wait(timeout=300) == 0, run.stderr.read()
        pairs[dtype] = pair(directory)
    return directory, pairs


def staging(directory):
    """The staging directories (and other leftovers) in the work directories
    of `directory`: all but each one's current version."""
    left = []
    for work in directory.glob(f".*{publish.WORK_SUFFIX}"):
        current = publish._current(work)
        left += [work / n for n in os.listdir(work) if n not in (publish.CURRENT, current)]
    return left


def when_staged(file_name=None):
    """Waits until the run's staging directory exists (and holds `file_name`)."""
    def wait(directory, run):
        while run.poll() is None:
            found = staging(directory)
            if found and (file_name is None or os.path.exists(found[0] / file_name)):
                return
            time.sleep(0.002)
    return wait


def after(seconds):
    return lambda directory, run: time.sleep(seconds)


# Points of a run: while MXNet and mxamp import, while the model loads and
# converts, once the staging directory exists (the pair being written), once
# the pair is written there (reloaded and verified against float32).
POINTS = {"importing": after(0.3), "converting": after(1.2),
          "staging": when_staged(), "verifying": when_staged("out-symbol.json")}


@SIGNALS
@pytest.mark.parametrize("point", list(POINTS))
def test_a_signal_leaves_the_previous_or_the_new_output(outputs, point, signum):
    directory, pairs = outputs
    run = convert(directory, "bfloat16")
    POINTS[point](directory, run)
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=300)
    status, message = STATUS[signum]
    if run.returncode == 0:  # the run ended before the signal
        assert pair(directory) == pairs["bfloat16"]
    else:
        assert (run.returncode, stderr.splitlines()) == (status, [message])
        assert pair(directory) in (pairs["float16"], pairs["bfloat16"])
    assert staging(directory) == []
    if pair(directory) == pairs["bfloat16"]:  # the previous output for the next case
        run = convert(directory, "float16")
        assert run.wait(timeout=300) == 0


# Commands that write a directory, swapped whole for the previous one: the
# file a complete new directory holds.
DIRECTORY_COMMANDS = {
    "zoo": (["zoo", "cifar_resnet20_v1", "--dtype", "bfloat16"], "report.json"),
    "inspect": (["inspect", "tiny"], "inspect.json"),
}


def previous_directory(directory, command):
    """The --out directory of `command` as a previous run left it: one file,
    'previous'. (Made afresh for each case: a case whose run published
    its new directory left that directory for the next case, where the
    'previous' file written into it made it neither state.)"""
    out = directory / f"{command}_out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    (out / "previous").write_text("the previous run's")
    return out


def assert_previous_or_new(out, complete):
    names = sorted(os.listdir(out))
    assert names == ["previous"] or (complete in names and "previous" not in names), names
    assert staging(out.parent) == []


@SIGNALS
@pytest.mark.parametrize("command", list(DIRECTORY_COMMANDS))
def test_a_signal_while_converting_leaves_the_previous_or_the_new_directory(outputs, command,
                                                                               signum):
    directory = outputs[0]
    args, complete = DIRECTORY_COMMANDS[command]
    out = previous_directory(directory, command)
    run = subprocess.Popen([*COMMAND, *args, "--out", out.name, "--overwrite"], cwd=directory,
                           env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    POINTS["converting"](directory, run)
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=300)
    if run.returncode != 0:
        assert (run.returncode, stderr.splitlines()[-1:]) == (STATUS[signum][0],
                                                              [STATUS[signum][1]])
        assert "Traceback" not in stderr
    assert_previous_or_new(out, complete)


def _hooked(step, signal_name):
    """A run of the console script that sends itself `signal_name` at its
    `step`-th file system change while publishing (published.signal_at_step):
    deterministically inside whatever window publishing has."""
    return textwrap.dedent(f"""
        import signal, sys
        import published
        published.signal_at_step({step}, signal.{signal_name})
        import mxamp_cli
        sys.argv = ["mxamp", *sys.argv[1:]]
        mxamp_cli.main()
    """)


def run_hooked(directory, step, signal_name, args):
    return subprocess.run([sys.executable, "-c", _hooked(step, signal_name), *args],
                          cwd=directory, env=ENV, capture_output=True, text=True, timeout=300)


@SIGNALS
@pytest.mark.parametrize("command", list(DIRECTORY_COMMANDS))
def test_a_signal_at_each_step_of_publishing_a_directory_waits_for_its_end(outputs, command,
                                                                           signum):
    """Deterministic: the signal arrives at each change publishing makes
    (the exchange of the two directories, the previous one's removal);
    it takes effect once the new directory is in place."""
    directory = outputs[0]
    args, complete = DIRECTORY_COMMANDS[command]
    steps = 2 if command == "inspect" else 1  # a zoo run takes a while: the exchange only
    for step in range(steps):
        out = previous_directory(directory, command)
        done = run_hooked(directory, step, signal.Signals(signum).name,
                          [*args, "--out", out.name, "--overwrite"])
        assert (done.returncode, done.stderr.splitlines()[-1:]) == (
            STATUS[signum][0], [STATUS[signum][1]]), done.stderr
        assert complete in os.listdir(out) and "previous" not in os.listdir(out)
        assert staging(directory) == []


def test_a_signal_at_each_step_of_publishing_a_pair_waits_for_its_end(outputs):
    """Deterministic: SIGINT, SIGTERM and SIGHUP in turn arrive at each change
    publishing makes (a signal between two renames left a new symbol next
    to the previous run's params); each takes effect once the new pair is
    in place."""
    directory, pairs = outputs
    step = 0
    while True:
        signum = list(STATUS)[step % len(STATUS)]
        before = publish._current(directory / ".out.mxamp")
        done = run_hooked(directory, step, signal.Signals(signum).name,
                          ["convert", "tiny", "--dtype", "bfloat16", *SHAPE, "--out", "out",
                           "--overwrite"])
        assert pair(directory) == pairs["bfloat16"], step
        assert publish._current(directory / ".out.mxamp") != before  # published anew
        assert staging(directory) == []
        if done.returncode == 0:
            break  # past the last step: no signal sent
        assert (done.returncode, done.stderr.splitlines()) == (STATUS[signum][0],
                                                               [STATUS[signum][1]])
        step += 1
    assert step == 5  # the version in, the switch (remove, symlink, replace), the old one out
    restore_previous(directory)


def restore_previous(directory):
    run = convert(directory, "float16")
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr
    return stderr


# A run of the console script with MXNet's NDArray.__del__ sending the
# process a signal the first time it runs: the handler ran inside the
# finalizer, where the exception it raised was printed and lost, and the run
# went on to publish its output and exit 0.
IN_DEL = textwrap.dedent("""
    import os, signal, sys, time
    import mxnet as mx
    original = mx.nd.NDArray.__del__
    sent = []

    def __del__(self):
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.{signal})
            time.sleep(0.05)  # the handler runs here, inside the finalizer
        original(self)

    mx.nd.NDArray.__del__ = __del__
    import mxamp_cli
    sys.argv = ["mxamp", *sys.argv[1:]]
    mxamp_cli.main()
""")


@SIGNALS
def test_a_signal_inside_an_ndarray_finalizer_stops_the_run(outputs, signum):
    directory, pairs = outputs
    script = IN_DEL.format(signal=signal.Signals(signum).name)
    done = subprocess.run([sys.executable, "-c", script, "convert", "tiny", "--dtype",
                           "bfloat16", *SHAPE, "--out", "out", "--overwrite"], cwd=directory,
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr.splitlines()) == (STATUS[signum][0],
                                                           [STATUS[signum][1]])
    assert pair(directory) == pairs["float16"]  # stopped before publishing
    assert staging(directory) == []


# The console script with a last object whose finalizer takes a while: the
# interpreter's own shutdown, after the command, where MXNet's C++ teardown
# also runs. A signal there found Python's handlers gone and killed the
# process without its line.
AT_SHUTDOWN = textwrap.dedent("""
    import sys, time
    import mxamp_cli

    class Slow:
        def __del__(self):
            print("finalizing", flush=True)
            time.sleep(5)

    last = Slow()
    sys.argv = ["mxamp", "--version"]
    mxamp_cli.main()
""")


@SIGNALS
def test_a_signal_while_the_process_ends_prints_its_line(signum):
    """The process ends after the command without the interpreter's
    finalization (nothing is written then): its status is the command's, or
    a signal's with the line, never a silent death by the signal."""
    run = subprocess.Popen([sys.executable, "-c", AT_SHUTDOWN], env=ENV, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = run.stdout.readline()
    assert first.startswith("mxamp, version")
    time.sleep(0.3)  # in the finalizer, if the interpreter runs one
    if run.poll() is None:
        run.send_signal(signum)
    out, err = run.communicate(timeout=60)
    assert "finalizing" not in out
    assert (run.returncode, err) in ((0, ""), (STATUS[signum][0], STATUS[signum][1] + "\n"))


def loaded_by_each_loader(directory):
    """The bytes of the pair at `directory`/out, once MXNet's loader (its
    graph typed with the parameters, as binding does: a mixed pair failed
    there with "This layer requires uniform type"), SymbolBlock.imports and
    mxamp's loader have each read it."""
    import mxnet as mx
    import mxamp
    prefix = str(directory / "out")
    sym, args, aux = mx.model.load_checkpoint(prefix, 0)
    sym.infer_type(data="float32", **{n: a.dtype for n, a in {**args, **aux}.items()})
    mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-0000.params")
    mxamp.load(prefix)
    return pair(directory)


def test_a_kill_at_any_step_of_publishing_leaves_a_whole_pair(outputs):
    """SIGKILL at each step of publishing (as an OOM kill or kill -9 lands):
    MXNet's own loader, SymbolBlock.imports and mxamp's loader read the
    previous pair or the new one, with nothing to recover first; the next
    run removes the killed run's staging directory with a line saying so."""
    directory, pairs = outputs
    step = 0
    while True:
        run = run_hooked(directory, step, "SIGKILL", ["convert", "tiny", "--dtype", "bfloat16",
                                                      *SHAPE, "--out", "out", "--overwrite"])
        assert loaded_by_each_loader(directory) in (pairs["float16"], pairs["bfloat16"]), step
        if run.returncode == 0:
            break  # every step passed
        assert run.returncode == -signal.SIGKILL, run.stderr
        left = [p for p in staging(directory) if not p.name.startswith(publish.PUBLISHED)]
        stderr = restore_previous(directory)  # the next run
        assert [f"WARNING: mxamp.tools.publish: removed {p}, left by a killed run"
                for p in left] == [line for line in stderr.splitlines() if "killed" in line]
        assert staging(directory) == [] and pair(directory) == pairs["float16"]
        step += 1
    assert step == 5


def test_a_kill_at_any_step_of_publishing_a_directory_leaves_a_whole_one(outputs):
    directory = outputs[0]
    args, complete = DIRECTORY_COMMANDS["inspect"]
    step = 0
    while True:
        out = previous_directory(directory, "inspect")
        run = run_hooked(directory, step, "SIGKILL", [*args, "--out", out.name, "--overwrite"])
        names = sorted(os.listdir(out))
        assert names == ["previous"] or (complete in names and "previous" not in names), names
        if run.returncode == 0:
            break
        assert run.returncode == -signal.SIGKILL, run.stderr
        step += 1
    assert step == 2  # the exchange, the previous directory's removal


def test_the_entry_points_signal_lines_are_the_commands():
    """mxamp_cli holds these signals while mxamp imports, before it can read
    which signals end a run (mxamp.tools.signals.MESSAGES)."""
    import mxamp_cli
    from mxamp.tools import signals
    assert set(mxamp_cli.IMPORT_SIGNALS) == set(signals.MESSAGES)


@pytest.mark.parametrize("stderr_open", [True, False], ids=["stderr", "stderr closed"])
def test_a_fatal_signal_in_a_command_ends_the_process(stderr_open):
    """MXNet's own SIGSEGV handler calls exit() inside the handler: under an
    address-space limit it waited on glibc's heap lock and `mxamp quantize`
    hung until SIGKILL. The command's process keeps it out (the process
    ended with status 255 from MXNet's handler before)."""
    code = "import ctypes, mxamp_cli, mxnet; ctypes.string_at(0)"
    done = subprocess.run([sys.executable, "-c", code], env=ENV, timeout=120,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          preexec_fn=None if stderr_open else (lambda: os.close(2)))
    assert done.returncode == -signal.SIGSEGV
    assert not stderr_open or b"Fatal Python error: Segmentation fault" in done.stderr
