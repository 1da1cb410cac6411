"""SIGINT (Ctrl-C), SIGTERM (timeout, kill, docker stop, CI runners) and
SIGHUP (a closed terminal or ssh session) at several points of an ``mxamp
convert`` run, in a subprocess as a user meets them: the run ends with one
line (status 130 / 143 / 129) and leaves either the complete previous output
or the complete new one, and no staging directory. SIGKILL at each step of
publishing leaves the same, once the next run or load has recovered it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from graphs import tiny_net

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT}
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
    return [n for n in os.listdir(directory) if ".mxamp-" in n]


def when_staged(file_name=None):
    """Waits until the run's staging directory exists (and holds `file_name`)."""
    def wait(directory, run):
        while run.poll() is None:
            found = staging(directory)
            if found and (file_name is None or
                          os.path.exists(directory / found[0] / file_name)):
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


@SIGNALS
@pytest.mark.parametrize("point", ["staging", "converting"])
@pytest.mark.parametrize("command", list(DIRECTORY_COMMANDS))
def test_a_signal_leaves_the_previous_or_the_new_directory(outputs, command, point, signum):
    directory = outputs[0]
    args, complete = DIRECTORY_COMMANDS[command]
    out = directory / f"{command}_out"
    out.mkdir(exist_ok=True)
    (out / "previous").write_text("the previous run's")
    run = subprocess.Popen([*COMMAND, *args, "--out", out.name, "--overwrite"], cwd=directory,
                           env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    POINTS[point](directory, run)
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=300)
    if run.returncode != 0:
        assert (run.returncode, stderr.splitlines()[-1:]) == STATUS[signum][:1] + (
            [STATUS[signum][1]],)
        assert "Traceback" not in stderr
    names = sorted(os.listdir(out))
    assert names == ["previous"] or (complete in names and "previous" not in names), names
    assert staging(directory) == [] and not [n for n in os.listdir(directory) if
                                             n.endswith(".old")]


PUBLISH = textwrap.dedent("""
    import os, signal, sys
    from mxamp.tools import checkpoint
    rename = os.replace

    def replace(src, dst):  # a signal right after the first rename of the pair
        rename(src, dst)
        if dst.endswith(".params"):
            os.kill(os.getpid(), signal.{signal})

    os.replace = replace
    try:
        with checkpoint.signals_deferred():
            os.makedirs(".out.mxamp-1-x")
            checkpoint.publish([".out.mxamp-1-x/new-symbol.json", "new-0000.params"],
                               ["out-symbol.json", "out-0000.params"])
    except checkpoint.Interrupted:
        sys.exit(3)
""")


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_between_the_two_renames_waits_for_the_second(tmp_path, name):
    """Deterministic: the signal arrives exactly between the renames, where
    it left a new symbol next to the previous run's params."""
    for prefix in ("new", "out"):
        for suffix in ("-symbol.json", "-0000.params"):
            (tmp_path / f"{prefix}{suffix}").write_text(prefix)
    (tmp_path / "new-symbol.json").rename(tmp_path / "staged")
    script = PUBLISH.format(signal=name).replace(".out.mxamp-1-x/new-symbol.json", "staged")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr  # the signal took effect, after both renames
    names = sorted(n for n in os.listdir(tmp_path) if not n.startswith(".out.mxamp-"))
    assert names == ["out-0000.params", "out-symbol.json"]
    assert [(tmp_path / f).read_text() for f in names] == ["new", "new"]


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


def _killed_at(step):
    """A run of the console script killed (SIGKILL) at its `step`-th rename
    or removal of a file (0: the first), as an OOM kill or kill -9 lands."""
    return textwrap.dedent(f"""
        import os, signal, sys
        calls = [0]

        def killing(original):
            def call(*args):
                if calls[0] == {step}:
                    os.kill(os.getpid(), signal.SIGKILL)
                calls[0] += 1
                return original(*args)
            return call

        import mxamp_cli
        from mxamp.tools import checkpoint
        publish = checkpoint.publish

        def publish_killed(*args):  # only publishing's own renames count
            os.replace, os.remove = killing(os.replace), killing(os.remove)
            publish(*args)
        checkpoint.publish = publish_killed
        sys.argv = ["mxamp", *sys.argv[1:]]
        mxamp_cli.main()
    """)


def test_a_kill_at_any_step_of_publishing_leaves_a_whole_pair(outputs):
    """After SIGKILL at each step, loading the output (mxamp's loader; the
    next run on it does the same) gives the previous pair or the new one,
    and the next run removes the killed run's staging directory with a line
    saying so."""
    from mxamp.tools import checkpoint
    directory, pairs = outputs
    step = 0
    while True:
        run = subprocess.run([sys.executable, "-c", _killed_at(step), "convert", "tiny",
                              "--dtype", "bfloat16", *SHAPE, "--out", "out", "--overwrite"],
                             cwd=directory, env=ENV, capture_output=True, text=True,
                             timeout=300)
        if run.returncode == 0:
            break  # every step passed
        assert run.returncode == -signal.SIGKILL, run.stderr
        checkpoint.load_checkpoint(str(directory / "out"))
        left = staging(directory)  # the killed run's staging directory
        assert pair(directory) in (pairs["float16"], pairs["bfloat16"]), step
        assert [n for n in os.listdir(directory) if n.endswith("mxamp-publish")] == []
        again = convert(directory, "float16")  # the next run: previous output for the next step
        _, stderr = again.communicate(timeout=300)
        assert again.returncode == 0, stderr
        assert [f"WARNING: mxamp.tools.checkpoint: removed {directory / n}, left by a killed run"
                for n in left] == [line for line in stderr.splitlines() if "killed" in line]
        assert staging(directory) == [] and pair(directory) == pairs["float16"]
        step += 1
    assert step == 4  # the manifest, the params, the symbol, the manifest's removal
