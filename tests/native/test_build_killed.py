"""A build of a native library killed mid-compile (SIGKILL, as an OOM kill
lands) leaves its temporary file in the cache; the next build of that
library removes it, with a log line, and leaves only the library and its
checksum."""
import os
import re
import signal
import subprocess
import sys
import time

BUILD = """
import logging, sys
logging.basicConfig(format="%(levelname)s: %(name)s: %(message)s")
from mxamp import native
native.build(extra_flags=("-DMXAMP_KILLED_BUILD_TEST",), lib=native.PASS)
"""



def temporaries(directory):
    """Files of the cache other than a library, its checksum and its lock."""
    return sorted(n for n in os.listdir(directory) if not n.endswith((".lock", ".sha256"))
                  and not re.fullmatch(r"libmxamp_[0-9a-f]{16}\.so", n))


def test_a_killed_build_leaves_no_temporary_behind(tmp_path):
    env = {**os.environ, "MXAMP_CACHE": str(tmp_path)}
    run = subprocess.Popen([sys.executable, "-c", BUILD], env=env, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not temporaries(tmp_path):
        assert run.poll() is None and time.monotonic() < deadline, "no temporary appeared"
        time.sleep(0.01)
    os.killpg(run.pid, signal.SIGKILL)  # mid-compile: the build and its compiler
    run.communicate(timeout=60)
    orphans = temporaries(tmp_path)
    assert len(orphans) == 1
    done = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert f"removing {tmp_path / orphans[0]}, left by a build that was killed" in done.stderr
    assert temporaries(tmp_path) == []
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".so")]) == 1
