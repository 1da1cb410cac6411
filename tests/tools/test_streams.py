"""Commands with their standard streams closed (``>&-``, ``2>&-``, as under
some daemons and cron) or writing into a pipe whose reader has quit
(``| head -1``): each writes its output and exits 0. (Before, a closed
stdout ended `mxamp convert` with "AttributeError: 'NoneType' object has no
attribute 'flush'" and status 1, after writing the model.)"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mxamp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT}
COMMAND = [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()"]


def _closed(redirections):
    def run(cmd, cwd):
        done = subprocess.run(["sh", "-c", f'exec "$@" {redirections}', "sh", *cmd], cwd=cwd,
                              env=ENV, timeout=600, capture_output=True, text=True)
        return done.returncode, done.stderr
    return run


def _quit_reader(fd):
    """A pipe whose reader has quit before the command writes (what `| head -1`
    is once head has its line), on stdout (1) or stderr (2); the other
    stream is read."""
    def run(cmd, cwd):
        read, write = os.pipe()
        os.close(read)
        streams = {"stdout": write, "stderr": subprocess.PIPE} if fd == 1 else \
            {"stderr": write, "stdout": subprocess.PIPE}
        try:
            done = subprocess.run(cmd, cwd=cwd, env=ENV, timeout=600, text=True, **streams)
        finally:
            os.close(write)
        return done.returncode, done.stderr or done.stdout
    return run


STREAMS = {"stdout closed": _closed(">&-"), "stderr closed": _closed("2>&-"),
           "both closed": _closed(">&- 2>&-"), "stdout reader quit": _quit_reader(1),
           "stderr reader quit": _quit_reader(2)}


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "c.npy"
    np.save(path, np.random.default_rng(0).uniform(size=(4, 3, 8, 8)).astype("float32"))
    return str(path)


def _check_pair(prefix, tmp_path):
    mxamp.load(str(tmp_path / prefix))  # written whole, and nothing else wrote into it


COMMANDS = {
    "convert": (lambda tiny, calib: ["convert", tiny, "--dtype", "bfloat16", "--shape",
                                     "data:1,3,8,8", "--out", "out", "--json"],
                lambda tmp_path: _check_pair("out", tmp_path)),
    "inspect": (lambda tiny, calib: ["inspect", tiny, "--out", "rep"],
                lambda tmp_path: json.loads((tmp_path / "rep" / "inspect.json").read_text())),
    "quantize": (lambda tiny, calib: ["quantize", tiny, "--calib", calib, "--calib-mode",
                                      "naive", "--out", "q"],
                 lambda tmp_path: _check_pair("q", tmp_path)),
}


@pytest.mark.parametrize("streams", list(STREAMS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_succeeds_whatever_its_standard_streams(tiny, calib, tmp_path, command,
                                                          streams):
    args, check = COMMANDS[command]
    status, shown = STREAMS[streams]([*COMMAND, *args(tiny, calib)], tmp_path)
    assert status == 0, shown
    check(tmp_path)


def test_zoo_succeeds_with_its_stdout_closed(tmp_path):
    zoo = ["zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--shape", "1,3,16,16",
           "--out", "zoo_out"]
    status, shown = STREAMS["stdout closed"]([*COMMAND, *zoo], tmp_path)
    assert status == 0, shown
    assert json.loads((tmp_path / "zoo_out" / "report.json").read_text())["converted"] == 1


def test_optimize_succeeds_into_a_reader_that_quit(tiny, calib, tmp_path):
    optimize = ["optimize", tiny, "--calib", calib, "--runs", "1", "--report", "r"]
    status, shown = STREAMS["stdout reader quit"]([*COMMAND, *optimize], tmp_path)
    assert status == 0, shown
    assert json.loads((tmp_path / "r" / "int8.json").read_text())["operators"]

