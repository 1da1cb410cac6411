"""SIGINT (Ctrl-C) and SIGTERM (timeout, kill, docker stop, CI runners) at
several points of an ``mxamp convert`` run, in a subprocess as a user meets
them: the run ends with one line (status 130 / 143) and leaves either the
complete previous output or the complete new one, and no staging directory."""
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
STATUS = {signal.SIGINT: (130, "Aborted."), signal.SIGTERM: (143, "Terminated.")}


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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM],
                         ids=["SIGINT", "SIGTERM"])
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM],
                         ids=["SIGINT", "SIGTERM"])
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

    def replace(src, dst):  # a signal right after the first rename
        rename(src, dst)
        os.kill(os.getpid(), signal.{signal})

    os.replace = replace
    with checkpoint.signals_raise():
        try:
            checkpoint.publish(["new-symbol.json", "new-0000.params"],
                               ["out-symbol.json", "out-0000.params"])
        except checkpoint.Interrupted:
            sys.exit(3)
""")


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_between_the_two_renames_waits_for_the_second(tmp_path, name):
    """Deterministic: the signal arrives exactly between the renames, where
    it left a new symbol next to the previous run's params."""
    for prefix in ("new", "out"):
        for suffix in ("-symbol.json", "-0000.params"):
            (tmp_path / f"{prefix}{suffix}").write_text(prefix)
    done = subprocess.run([sys.executable, "-c", PUBLISH.format(signal=name)], cwd=tmp_path,
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr  # the signal took effect, after both renames
    assert sorted(os.listdir(tmp_path)) == ["out-0000.params", "out-symbol.json"]
    assert [(tmp_path / f).read_text() for f in sorted(os.listdir(tmp_path))] == ["new", "new"]
