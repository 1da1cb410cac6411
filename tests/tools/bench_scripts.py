"""Running the scripts in bench/ as a user does, for the bench tests."""
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_script(name, *args, timeout):
    """bench/`name` with `args`, on one OpenMP thread, in a subprocess."""
    return subprocess.run([sys.executable, str(BENCH / name), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
