"""Every file a command reads, damaged: the model's symbol and params, a
--config policy, calibration arrays. One error line that names the file,
says what is wrong with it and what is accepted; no C++ text (MXNet's
checks, source files, stack traces), in a subprocess as a user runs it."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()"]
ENV = {**os.environ, "PYTHONPATH": ROOT}
CPP_TEXT = ("Check failed", "std::", ".cc", "Stack trace", "MXNetError", "Traceback")
CONVERT = ["convert", "m", "--dtype", "bf16", "--shape", "data:1,3,8,8", "--out", "o"]
EXPORTED = "give the PREFIX-symbol.json that HybridBlock.export or mx.model.save_checkpoint writes"
PARAMS = ("m-0000.params is not an MXNet params file (truncated or corrupt?): give one that "
          "HybridBlock.export or mx.model.save_checkpoint writes")


def _file(name, data):
    def make(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            os.rmdir(path)
        elif os.path.lexists(path):
            os.remove(path)
        if data is None:
            os.makedirs(path)
        else:
            with open(path, "wb") as f:
                f.write(data)
    return make


CASES = {  # (what is damaged, the command, the error after "Error: ")
    "symbol: not JSON": (_file("m-symbol.json", b"hello"), CONVERT,
                         "m-symbol.json is not a symbol file: it is not JSON (Expecting value: "
                         f"line 1 column 1 (char 0)); {EXPORTED}"),
    "symbol: binary": (_file("m-symbol.json", b"\xff\xfe\x00"), CONVERT,
                       f"m-symbol.json is not a symbol file: it is not JSON text (UTF-8); "
                       f"{EXPORTED}"),
    "symbol: empty": (_file("m-symbol.json", b""), CONVERT,
                      f"m-symbol.json is not a symbol file: it is empty; {EXPORTED}"),
    "symbol: a directory": (_file("m-symbol.json", None), CONVERT,
                            "cannot read m-symbol.json: Is a directory"),
    "params: garbage": (_file("m-0000.params", b"garbage" * 5), CONVERT, PARAMS),
    "params: empty": (_file("m-0000.params", b""), CONVERT, PARAMS),
    "params: a directory": (_file("m-0000.params", None), CONVERT,
                            "cannot read m-0000.params: Is a directory"),
    "config: JSON": (_file("p.json", b"{nope"), [*CONVERT, "--config", "p.json"],
                     "policy file 'p.json' does not parse: Expecting property name enclosed in "
                     "double quotes: line 1 column 2 (char 1)"),
    "config: TOML": (_file("p.toml", b"a = = 1"), [*CONVERT, "--config", "p.toml"],
                     "policy file 'p.toml' does not parse: Invalid value (at line 1, column 5)"),
    "calibration: .npy": (_file("c.npy", b"garbage"), ["quantize", "m", "--calib", "c.npy"],
                          "calibration data 'c.npy' is not a readable .npy file (truncated or "
                          "corrupt?): Cannot load file containing pickled data when "
                          "allow_pickle=False; write it with numpy.save"),
    "calibration: .npz": (_file("c.npz", b""), ["quantize", "m", "--calib", "c.npz"],
                          "calibration data 'c.npz' is not a readable .npz file (truncated or "
                          "corrupt?): "),
    "calibration: a folder without a shape": (
        _file("c.npz", None), ["quantize", "m", "--calib", "c.npz"],
        "calibration data 'c.npz' is a folder of images: they need the input shape N,C,H,W "
        "(--shape or --input-shapes) to be resized to"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_file_is_named_in_one_error(tiny, tmp_path, case):
    make, args, message = CASES[case]
    for suffix in ("-symbol.json", "-0000.params"):
        shutil.copy(tiny + suffix, tmp_path / f"m{suffix}")
    make(str(tmp_path))
    done = subprocess.run([*COMMAND, *args], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(f"Error: {message}"), \
        done.stderr
    assert not any(text in done.stderr for text in CPP_TEXT)
