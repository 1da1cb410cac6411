"""Builds and loads mxamp's C++ code as MXNet extension libraries.

Two libraries (``inputs.LIBRARIES``): the graph pass (``PASS``, always) and
the oneDNN 3 execution backend (``ONEDNN``). An installed wheel ships both,
built by CMake (CMakeLists.txt) beside this file, and loads those. A source
checkout (or editable install) compiles them on first use instead, against
the ``lib_api.h`` / ``lib_api.cc`` shipped in the installed MXNet wheel, and
caches each under a name derived from everything that goes into it (every
source and header, the flags, the compiler, MXNet and oneDNN), so any change
rebuilds it. A checksum file beside each cached library (sha256 and size) is
checked before loading, so a truncated or corrupt file is rebuilt instead of
crashing the process when MXNet maps it; a file lock makes concurrent first
uses compile once.
"""
import concurrent.futures
import ctypes
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import mxnet as mx
from filelock import FileLock
from mxnet.base import _LIB, c_str, check_call, mx_uint

from ..graph import graph_json
from . import inputs
from .inputs import ONEDNN, ONEDNN_INSTALL, ONEDNN_PREFIXES, PASS, PASS_NAME, Library  # noqa: F401

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = inputs.SOURCE_DIR
# The cache build adds to inputs.COMPILE_FLAGS what CMake adds for a module.
CXXFLAGS = (*inputs.COMPILE_FLAGS, "-fPIC", "-shared")
# AddressSanitizer + UndefinedBehaviorSanitizer build (tests/test_sanitized.py).
# -g1 (line tables) gives reports the same frames, inlined ones included, as
# -g, and compiles in about two thirds of the time.
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                  "-fno-omit-frame-pointer", "-g1")
BUILD_HELP = ("reinstall mxamp from its wheel, or run `python -m mxamp.build` in a source "
              "checkout (needs g++)")
COMPILER_HELP = "install a C++17 compiler (Debian/Ubuntu: apt-get install g++) or set CXX"
HEADER_SUFFIXES = (".h", ".hpp")

_loaded = {}


def onednn_prefix(headers=True):
    """The prefix holding libdnnl.so.3 (and oneDNN 3's headers)."""
    return inputs.onednn_prefix(ONEDNN_PREFIXES, headers)


def _headers(directory):
    return sorted(p for p in directory.rglob("*") if p.suffix in HEADER_SUFFIXES)


def _inputs(extra_flags, lib):
    """The files and flags that determine the library's content: compiled
    files, the headers they may include (mxamp's own, MXNet's lib_api.h,
    all of oneDNN's), compiler flags and linker flags."""
    sources = [SOURCE_DIR / name for name in lib.sources]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing or not sources:  # an installed wheel finds none to list
        raise RuntimeError(f"mxamp's C++ sources are missing ({', '.join(missing) or SOURCE_DIR}); "
                           f"{BUILD_HELP}")
    header, lib_api = inputs.lib_api()
    headers = [*_headers(SOURCE_DIR), header]
    flags, link = [*CXXFLAGS, *extra_flags, f"-I{header.parents[1]}"], []
    if lib.onednn:
        prefix = onednn_prefix()
        headers += _headers(prefix / "include" / "oneapi" / "dnnl")
        flags += [f"-I{prefix / 'include'}", *inputs.ONEDNN_FLAGS]
        link = [f"-L{prefix / 'lib'}", "-l:libdnnl.so.3", f"-Wl,-rpath,{prefix / 'lib'}",
                *inputs.ONEDNN_FLAGS]
    return sources + [lib_api], headers, flags, link


def _compiler():
    return os.environ.get("CXX", "g++")


@functools.lru_cache(maxsize=None)
def _compiler_identity(compiler):
    """The compiler's path and version banner (a new compiler rebuilds)."""
    path = shutil.which(compiler)
    if path is None:
        return "missing"
    result = subprocess.run([path, "--version"], capture_output=True, text=True)
    return f"{path}\n{result.stdout}"


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
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update("\0".join([*flags, *link, _compiler_identity(_compiler())]).encode())
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
    compiler = _compiler()
    if shutil.which(compiler) is None:
        raise RuntimeError(f"cannot build mxamp's {lib.what}: compiler '{compiler}' not found; "
                           f"{COMPILER_HELP}")
    # Compile in a temporary directory and rename the library out of it, so
    # an interrupted build never leaves a half-written library under the
    # final name. Temporaries are named after the target: only the holder of
    # its lock writes them, so those found now are a killed build's.
    for orphan in target.parent.glob(f"{target.name}.*.tmp"):
        log.warning("removing %s, left by a build that was killed", orphan)
        _remove(orphan)
    work = Path(tempfile.mkdtemp(prefix=f"{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        log.info("building mxamp %s: %s", lib.what,
                 " ".join([compiler, *flags, *map(str, compiled), *link]))
        objects = _objects(compiler, flags, compiled, work, lib)
        built = work / target.name
        _run(lib, [compiler, *flags, *objects, *link, "-o", str(built)])
        checksum = work / "checksum"
        checksum.write_text(json.dumps(_checksum(built)))
        os.replace(built, target)
        os.replace(checksum, _checksum_path(target))
    finally:
        _remove(work)  # an error or an interruption


def _objects(compiler, flags, sources, work, lib):
    """Compiles each source to an object file in `work`, as many at once as
    this process may use CPUs (the sanitized backend takes ~90 s of CPU)."""
    objects = [str(work / f"{i}_{source.stem}.o") for i, source in enumerate(sources)]
    commands = [[compiler, *flags, "-c", str(source), "-o", obj]
                for source, obj in zip(sources, objects)]
    jobs = min(len(commands), len(os.sched_getaffinity(0)))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(functools.partial(_run, lib), commands))
    return objects


def _run(lib, cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building mxamp's {lib.what} failed:\n{result.stderr}")


def _remove(path):
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


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


def shipped(lib=PASS):
    """The library an installed wheel ships beside this file, or None (a
    source checkout ships none: its libraries come from the cache)."""
    path = PACKAGE_DIR / f"{lib.stem}.so"
    return path if path.is_file() else None


def library_file(lib=PASS, force=False):
    """The library to load: the wheel's own, else the cache's, built if
    needed (the sanitized variant under MXAMP_SANITIZE=1, always built)."""
    flags = sanitize_flags()
    if shipped(lib) and not flags and not force:
        return shipped(lib)
    return build(extra_flags=flags, force=force, lib=lib)


def load(lib=PASS):
    """Loads a library into MXNet once per process (see `library_file`)."""
    if lib not in _loaded:
        path = library_file(lib)
        if lib.onednn:
            # The wheel's library names libdnnl.so.3 without a path: the
            # loader takes the one already in the process.
            ctypes.CDLL(str(onednn_prefix(headers=False) / "lib" / "libdnnl.so.3"))
        _load_into_mxnet(path)
        check_registered(lib)
        _loaded[lib] = path
    return _loaded[lib]


def _load_into_mxnet(path):
    """MXNet's ``mx.library.load`` without its regeneration of every Python
    operator function (about 1 s a library): graphs reach the libraries'
    passes, partitioners and operators through MXNet's C++ registry, and
    nothing calls a library's operator from Python (the backend's region
    operator is made by partitioning)."""
    check_call(_LIB.MXLoadLib(c_str(str(path)), mx_uint(0)))


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
