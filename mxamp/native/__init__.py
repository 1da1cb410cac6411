"""Builds and loads mxamp's C++ code as MXNet extension libraries.

Two libraries: the graph pass (``PASS``, always) and the oneDNN 3 execution
backend (``ONEDNN``, needs the onednn packages). Each is compiled against the
``lib_api.h`` / ``lib_api.cc`` shipped in the installed MXNet wheel and cached
under a name derived from everything that goes into it, so a changed source,
compiler flag, oneDNN or MXNet version rebuilds it. A checksum file beside
each library (sha256 and size) is checked before loading, so a truncated or
corrupt file is rebuilt instead of crashing the process when MXNet maps it;
a file lock makes concurrent first uses compile once.
"""
import ctypes
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import mxnet as mx
from filelock import FileLock

from ..graph import graph_json

log = logging.getLogger(__name__)

PASS_NAME = "mxamp_reduce_precision"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "src" / "operator"
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
    a name for messages, whether it links oneDNN 3, and the pass or
    partitioner it registers with the options that make it rewrite a small
    FullyConnected -> relu graph so that `probe_op` appears in it."""
    stem: str
    sources: tuple
    what: str
    backend: str
    probe_options: tuple
    probe_op: str
    onednn: bool = False


# The pass casts the graph output to float32; the partitioner puts both
# operators into one region.
PASS = Library("libmxamp", SOURCES, "graph pass", PASS_NAME,
               (("target_dtype", "float16"), ("decisions", ""), ("outputs", "f")), "amp_cast")
ONEDNN = Library("libmxamp_onednn", ("onednn_backend.cc",), "oneDNN backend", "mxamp_onednn",
                 (("compute", "float32"),), "_mxamp_onednn_region", onednn=True)

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
    """$MXAMP_CACHE, else $XDG_CACHE_HOME/mxamp, else ~/.cache/mxamp; made
    absolute, as MXNet's library loader refuses relative paths."""
    path = os.environ.get("MXAMP_CACHE")
    if not path:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        # The XDG spec says to ignore a relative XDG_CACHE_HOME.
        path = Path(xdg if os.path.isabs(xdg) else Path.home() / ".cache") / "mxamp"
    return Path(path).absolute()


def _usable(directory):
    """Creates the cache directory; a RuntimeError naming it if it cannot be
    created or written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        raise RuntimeError(f"cannot use the cache directory {directory} for mxamp's "
                           f"libraries ({err.strerror or err}); set MXAMP_CACHE to a writable "
                           "directory") from None


def _checksum_path(target):
    return target.with_suffix(".sha256")


def _checksum(path):
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _problem(target):
    """Why the cached library cannot be used (None if it can)."""
    if not target.is_file():
        return "missing"
    try:
        expected = json.loads(_checksum_path(target).read_text())
    except (OSError, ValueError):
        return "no readable checksum beside it"
    if _checksum(target) != expected:
        return "its size or sha256 does not match its checksum (truncated or corrupt)"
    return None


def library_path(extra_flags=(), lib=PASS):
    """Where the library for the current sources, flags and MXNet lives."""
    compiled, headers, flags, link = _inputs(extra_flags, lib)
    digest = hashlib.sha256(mx.__version__.encode())
    for path in compiled + headers:
        digest.update(path.read_bytes())
    digest.update(" ".join(flags + link).encode())
    return cache_dir() / f"{lib.stem}_{digest.hexdigest()[:16]}.so"


def build(extra_flags=(), force=False, lib=PASS):
    """Compiles the library if it is missing, stale or does not match its
    checksum; returns its path."""
    target = library_path(extra_flags, lib)
    if not force and _problem(target) is None:
        return target
    _usable(target.parent)
    # One process compiles; the others wait, then find the library intact.
    with FileLock(target.with_suffix(".lock")):
        problem = _problem(target)
        if problem is None and not force:
            return target
        if problem not in (None, "missing"):
            log.warning("rebuilding %s: %s", target, problem)
        _compile(target, extra_flags, lib)
    return target


def _compile(target, extra_flags, lib):
    compiled, _, flags, link = _inputs(extra_flags, lib)
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"cannot build mxamp's {lib.what}: compiler '{compiler}' not found; "
                           "install g++ or set CXX")
    # Compile to a temporary name and rename, so an interrupted build never
    # leaves a half-written library under the final name.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, *flags, f"-I{_mxnet_dir() / 'include'}", *map(str, compiled), *link,
           "-o", tmp]
    log.info("building mxamp %s: %s", lib.what, " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building mxamp's {lib.what} failed:\n{result.stderr}")
    checksum = json.dumps(_checksum(Path(tmp)))
    os.replace(tmp, target)
    fd, tmp = tempfile.mkstemp(suffix=".sha256", dir=target.parent)
    with os.fdopen(fd, "w") as f:
        f.write(checksum)
    os.replace(tmp, _checksum_path(target))


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
        check_registered(lib)
        _loaded[lib] = path
    return _loaded[lib]


def check_registered(lib=PASS):
    """RuntimeError unless the library's pass or partitioner is registered
    with MXNet: for a name it does not know, ``optimize_for`` only logs and
    returns its input, so conversion would silently change nothing. Checked
    by rewriting a FullyConnected -> relu graph with it."""
    fc = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=1, name="mxamp_probe_fc")
    graph = mx.sym.Activation(fc, act_type="relu", name="mxamp_probe_relu")
    out = graph.optimize_for(lib.backend, ctx=mx.cpu(), skip_infer=True,
                             **dict(lib.probe_options))
    ops = {n["op"] for n in graph_json(out)["nodes"]}
    if lib.probe_op not in ops:
        raise RuntimeError(f"mxamp's {lib.what} library was loaded but '{lib.backend}' is not "
                           f"registered with MXNet (is the library in {cache_dir()} from other "
                           "sources?); rebuild it with `python -m mxamp.build --force`")
