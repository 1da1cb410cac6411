"""Builds and loads mxamp's C++ graph pass as an MXNet extension library.

The library is compiled against the ``lib_api.h`` / ``lib_api.cc`` shipped in
the installed MXNet wheel and cached under a name derived from everything that
goes into it, so a changed source, compiler flag or MXNet version rebuilds it.
"""
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import mxnet as mx

log = logging.getLogger(__name__)

PASS_NAME = "mxamp_reduce_precision"
SOURCE_DIR = Path(__file__).resolve().parent.parent / "src" / "operator"
SOURCES = ("amp_pass.cc",)
CXXFLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared")
BUILD_HELP = "run `python -m mxamp.build` from an mxamp source checkout (needs g++)"

_loaded = None


def _mxnet_dir():
    return Path(mx.__file__).resolve().parent


def _inputs(extra_flags):
    """The files and flags that determine the library's content."""
    mxnet_dir = _mxnet_dir()
    sources = [SOURCE_DIR / name for name in SOURCES]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise RuntimeError(f"mxamp's C++ sources are missing ({', '.join(missing)}); {BUILD_HELP}")
    header = mxnet_dir / "include" / "mxnet" / "lib_api.h"
    lib_api = mxnet_dir / "src" / "lib_api.cc"
    if not header.is_file() or not lib_api.is_file():
        raise RuntimeError(
            f"the installed MXNet ({mxnet_dir}) does not ship lib_api.h / lib_api.cc; "
            "mxamp needs the mxnet==1.9.1 wheel")
    return sources + [lib_api], [header], list(CXXFLAGS) + list(extra_flags)


def cache_dir():
    return Path(os.environ.get("MXAMP_CACHE", Path.home() / ".cache" / "mxamp"))


def library_path(extra_flags=()):
    """Where the library for the current sources, flags and MXNet lives."""
    compiled, headers, flags = _inputs(extra_flags)
    digest = hashlib.sha256(mx.__version__.encode())
    for path in compiled + headers:
        digest.update(path.read_bytes())
    digest.update(" ".join(flags).encode())
    return cache_dir() / f"libmxamp_{digest.hexdigest()[:16]}.so"


def build(extra_flags=(), force=False):
    """Compiles the pass library if it is missing or stale; returns its path."""
    target = library_path(extra_flags)
    if target.is_file() and not force:
        return target
    compiled, _, flags = _inputs(extra_flags)
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"cannot build mxamp's graph pass: compiler '{compiler}' not found; "
                           "install g++ or set CXX")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a temporary name and rename, so a concurrent or interrupted
    # build never leaves a half-written library under the final name.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, *flags, f"-I{_mxnet_dir() / 'include'}", *map(str, compiled), "-o", tmp]
    log.info("building mxamp graph pass: %s", " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building mxamp's graph pass failed:\n{result.stderr}")
    os.replace(tmp, target)
    return target


def load():
    """Loads the pass into MXNet once per process, building it first if needed."""
    global _loaded
    if _loaded is None:
        path = build()
        mx.library.load(str(path), verbose=False)
        _loaded = path
    return _loaded
