"""The C++ code built with AddressSanitizer + UndefinedBehaviorSanitizer and
driven by the property tests: zero reports.

A short profile runs here; the long one is

    MXAMP_SANITIZE=1 MXAMP_FUZZ_EXAMPLES=3000 ASAN_OPTIONS=detect_leaks=0 \\
    LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \\
    python -m pytest -q tests/convert/test_fuzz.py tests/convert/test_errors.py \\
        tests/convert/test_structure.py tests/convert/test_wire.py

The oneDNN backend's operator table test (one small case per table row in
each compute type this CPU has) and its operator sweep (every operator at
bench's sizes) run the same way in a job of their own, which .ci/run runs
after the suite. Most of that job is building the backend once more,
sanitized: about 100 s of compiler CPU time, so about a minute on an idle
2-core machine and twice that when other work shares it. CI's fresh venv
puts new include paths into the cache key, so CI always builds it:

    MXAMP_SANITIZED_SWEEP=1 python -m pytest -q \\
        tests/native/test_sanitized.py::test_backend_sweep_under_sanitizers_has_no_reports

The first report stops the process (ASan's and UBSan's halt_on_error, and
the library is built with -fno-sanitize-recover), so the run fails on it.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mxamp import native as _lib

ROOT = Path(__file__).resolve().parents[2]
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def gcc_file(name):
    return subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True,
                          check=True).stdout.strip()


def sanitized_env(**extra):
    # libstdc++ is preloaded too: ASan must see C++ exceptions thrown inside
    # MXNet through the same runtime it intercepts.
    return {**os.environ, "MXAMP_SANITIZE": "1",
            "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "LD_PRELOAD": f"{gcc_file('libasan.so')} {gcc_file('libstdc++.so')}", **extra}


def test_sanitized_library_is_instrumented():
    path = _lib.build(extra_flags=_lib.SANITIZE_FLAGS)
    assert path != _lib.build()
    symbols = subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True,
                             check=True).stdout
    assert "__asan_report_load" in symbols and "__ubsan_handle" in symbols


def run_sanitized(tests, **env):
    """Runs pytest on `tests` in a process with the sanitized libraries and
    asserts it passed with no sanitizer report. --capture=sys leaves the
    process's stderr alone: a report stops the process, and what pytest
    captured at the file-descriptor level would be lost with it."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--capture=sys", "-p", "no:cacheprovider",
         "-p", "no:warnings", *tests],
        cwd=ROOT, env=sanitized_env(**env), capture_output=True, text=True)
    output = run.stdout + run.stderr
    first = min([output.find(r) for r in SANITIZER_REPORTS if r in output], default=None)
    excerpt = output[-3000:] if first is None else output[max(0, first - 200):first + 3000]
    assert run.returncode == 0 and first is None, excerpt
    assert " passed" in output, excerpt


def test_short_sanitized_profile_has_no_reports():
    run_sanitized(["tests/convert/test_fuzz.py", "tests/convert/test_errors.py",
                   "tests/convert/test_structure.py", "tests/convert/test_wire.py",
                   "tests/native/test_sanitized.py::test_sanitized_process_loads_the_sanitized_"
                   "library"], MXAMP_FUZZ_EXAMPLES="40")


@pytest.mark.skipif(os.environ.get("MXAMP_SANITIZE") != "1", reason="runs inside the profile")
def test_sanitized_process_loads_the_sanitized_library():
    assert _lib.load() == _lib.library_path(extra_flags=_lib.SANITIZE_FLAGS)


@pytest.mark.skipif(os.environ.get("MXAMP_SANITIZED_SWEEP") != "1",
                    reason="a job of its own: .ci/run runs it with MXAMP_SANITIZED_SWEEP=1")
def test_backend_sweep_under_sanitizers_has_no_reports():
    """The oneDNN backend library built with ASan + UBSan runs the operator
    sweep and the operator table's cases (every operator, every compute type
    this CPU has) with zero reports."""
    _lib.build(extra_flags=_lib.SANITIZE_FLAGS, lib=_lib.ONEDNN)  # before the sweep's first case
    run_sanitized(["tests/backends/test_onednn_sweep.py", "tests/backends/test_onednn_table.py",
                   "tests/native/test_sanitized.py::test_sanitized_process_loads_the_sanitized_"
                   "backend"])


@pytest.mark.skipif(os.environ.get("MXAMP_SANITIZE") != "1", reason="runs inside the profile")
def test_sanitized_process_loads_the_sanitized_backend():
    assert _lib.load(_lib.ONEDNN) == _lib.library_path(extra_flags=_lib.SANITIZE_FLAGS,
                                                       lib=_lib.ONEDNN)


def test_sanitize_without_the_runtime_preloaded_is_a_clear_error():
    env = {**os.environ, "MXAMP_SANITIZE": "1"}
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([sys.executable, "-c", "import mxamp.native as l; l.load()"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert "MXAMP_SANITIZE=1 needs the AddressSanitizer runtime preloaded" in run.stderr
