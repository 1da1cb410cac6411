"""Builds and loads mxamp's C++ code as MXNet extension libraries.

Two libraries: the graph pass (``PASS``, always) and the oneDNN 3 execution
backend (``ONEDNN``, needs the onednn packages). Each is compiled against the
``lib_api.h`` / ``lib_api.cc`` shipped in the installed MXNet wheel and cached
under a name derived from everything that goes into it, so a changed source,
compiler flag, oneDNN or MXNet version rebuilds it.
"""
import ctypes
import dataclasses
import hashlib
import logging
import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import mxnet as mx

log = logging.getLogger(__name__)

PASS_NAME = "mxamp_reduce_precision"
SOURCE_DIR = Path(__file__).resolve().parent.parent / "src" / "operator"
SOURCES = ("amp_pass.cc",)
CXXFLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared")
# AddressSanitizer + UndefinedBehaviorSanitizer build (tests/test_sanitized.py).
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                  "-fno-omit-frame-pointer", "-g")
BUILD_HELP = "run `python -m mxamp.build` from an mxamp source checkout (needs g++)"
ONEDNN_INSTALL = ("pip install onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0 "
                  "(or the extra mxamp[onednn])")
# Where pip puts the onednn packages' include/ and lib/ (a prefix install).
ONEDNN_PREFIXES = (sys.prefix, site.USER_BASE)


@dataclasses.dataclass(frozen=True)
class Library:
    """One extension library: its cache file stem, sources (in SOURCE_DIR),
    a name for messages and whether it links oneDNN 3."""
    stem: str
    sources: tuple
    what: str
    onednn: bool = False


PASS = Library("libmxamp", SOURCES, "graph pass")
ONEDNN = Library("libmxamp_onednn", ("onednn_backend.cc",), "oneDNN backend", onednn=True)

_loaded = {}


def _mxnet_dir():
    return Path(mx.__file__).resolve().parent


def onednn_prefix():
    """The prefix holding oneDNN 3's headers and libdnnl.so.3."""
    for prefix in map(Path, ONEDNN_PREFIXES):
        if ((prefix / "include" / "oneapi" / "dnnl" / "dnnl.hpp").is_file()
                and (prefix / "lib" / "libdnnl.so.3").is_file()):
            return prefix
    raise RuntimeError(f"oneDNN 3 (dnnl.hpp and libdnnl.so.3) not found under "
                       f"{', '.join(map(str, ONEDNN_PREFIXES))}; install it with {ONEDNN_INSTALL}")


def _inputs(extra_flags, lib):
    """The files and flags that determine the library's content: compiled
    files, other files it depends on, compiler flags and linker flags."""
    mxnet_dir = _mxnet_dir()
    sources = [SOURCE_DIR / name for name in lib.sources]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise RuntimeError(f"mxamp's C++ sources are missing ({', '.join(missing)}); {BUILD_HELP}")
    header = mxnet_dir / "include" / "mxnet" / "lib_api.h"
    lib_api = mxnet_dir / "src" / "lib_api.cc"
    if not header.is_file() or not lib_api.is_file():
        raise RuntimeError(
            f"the installed MXNet ({mxnet_dir}) does not ship lib_api.h / lib_api.cc; "
            "mxamp needs the mxnet==1.9.1 wheel")
    headers, flags, link = [header], [*CXXFLAGS, *extra_flags], []
    if lib.onednn:
        prefix = onednn_prefix()
        headers.append(prefix / "include" / "oneapi" / "dnnl" / "dnnl_version.h")
        flags.append(f"-I{prefix / 'include'}")
        link = [f"-L{prefix / 'lib'}", "-l:libdnnl.so.3", f"-Wl,-rpath,{prefix / 'lib'}"]
    return sources + [lib_api], headers, flags, link


def cache_dir():
    return Path(os.environ.get("MXAMP_CACHE", Path.home() / ".cache" / "mxamp"))


def library_path(extra_flags=(), lib=PASS):
    """Where the library for the current sources, flags and MXNet lives."""
    compiled, headers, flags, link = _inputs(extra_flags, lib)
    digest = hashlib.sha256(mx.__version__.encode())
    for path in compiled + headers:
        digest.update(path.read_bytes())
    digest.update(" ".join(flags + link).encode())
    return cache_dir() / f"{lib.stem}_{digest.hexdigest()[:16]}.so"


def build(extra_flags=(), force=False, lib=PASS):
    """Compiles the library if it is missing or stale; returns its path."""
    target = library_path(extra_flags, lib)
    if target.is_file() and not force:
        return target
    compiled, _, flags, link = _inputs(extra_flags, lib)
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"cannot build mxamp's {lib.what}: compiler '{compiler}' not found; "
                           "install g++ or set CXX")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a temporary name and rename, so a concurrent or interrupted
    # build never leaves a half-written library under the final name.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, *flags, f"-I{_mxnet_dir() / 'include'}", *map(str, compiled), *link,
           "-o", tmp]
    log.info("building mxamp %s: %s", lib.what, " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building mxamp's {lib.what} failed:\n{result.stderr}")
    os.replace(tmp, target)
    return target


def sanitize_flags():
    """SANITIZE_FLAGS when MXAMP_SANITIZE=1 (the sanitizer runtime must then be
    preloaded into the process), else none."""
    if os.environ.get("MXAMP_SANITIZE") != "1":
        return ()
    if not hasattr(ctypes.CDLL(None), "__asan_init"):
        raise RuntimeError(
            "MXAMP_SANITIZE=1 needs the AddressSanitizer runtime preloaded: run with "
            'LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" '
            "ASAN_OPTIONS=detect_leaks=0")
    return SANITIZE_FLAGS


def load(lib=PASS):
    """Loads a library into MXNet once per process, building it first if needed
    (the sanitized variant under MXAMP_SANITIZE=1)."""
    if lib not in _loaded:
        path = build(extra_flags=sanitize_flags(), lib=lib)
        mx.library.load(str(path), verbose=False)
        _loaded[lib] = path
    return _loaded[lib]
