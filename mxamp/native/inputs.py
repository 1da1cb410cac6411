"""What goes into mxamp's C++ libraries: their sources, compiler flags, and
where MXNet's extension API (lib_api.h / lib_api.cc in the mxnet wheel) and
oneDNN 3 (the onednn pip packages) are installed.

Standard library only: CMake runs this file in the wheel's build
environment (``python inputs.py OUT.cmake`` writes CMake ``set()`` lines),
and the on-first-use build of a source checkout imports it, so both build
the same libraries from the same list."""
import dataclasses
import importlib.metadata
import importlib.util
import site
import sys
from pathlib import Path

# Flags for compiling every source (CMake and the cache build add -fPIC
# -shared themselves).
COMPILE_FLAGS = ("-std=c++17", "-O2")
# Compiler and linker flags of the oneDNN backend: OpenMP, the threading its
# oneDNN (the -gomp build) uses, so that speed.cc times kernels on one thread
# and a region's chunks run on threads of the same team (chunks.cc).
ONEDNN_FLAGS = ("-fopenmp",)
ONEDNN_INSTALL = ("pip install onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0 "
                  "(or the extra mxamp[onednn])")


@dataclasses.dataclass(frozen=True)
class Library:
    """One extension library: its file stem, sources (in src/operator/), a
    name for messages, whether it links oneDNN 3, and the pass or
    partitioner it registers with the options that make it rewrite a small
    FullyConnected -> relu graph so that `probe_op` appears in it."""
    stem: str
    sources: tuple
    what: str
    backend: str
    probe_options: tuple
    probe_op: str
    onednn: bool = False


PASS_NAME = "mxamp_reduce_precision"
# The pass casts the graph output to float32; the partitioner puts both
# operators into one region.
PASS = Library("libmxamp", ("amp_pass.cc",), "graph pass", PASS_NAME,
               (("target_dtype", "float16"), ("decisions", ""), ("outputs", "f")), "amp_cast")
# The oneDNN backend: one file per part (src/operator/onednn/library.cc
# describes them); every .cc there, listed so that CMake and the cache build
# compile the same ones (tests/native/test_build.py checks the list).
ONEDNN_SOURCES = tuple(f"onednn/{name}.cc" for name in (
    "library", "engine", "speed", "attrs", "graph", "table", "partitioner", "region", "chunks", "plan",
    "linear", "encodings", "strides", "weights", "eltwise", "binary", "pooling", "normalisation", "batch_dot", "views", "casts",
    "depthwise", "softmax_int8", "lookup", "special", "int8_layers"))
ONEDNN = Library("libmxamp_onednn", ONEDNN_SOURCES, "oneDNN backend", "mxamp_onednn",
                 (("compute", "float32"),), "_mxamp_onednn_region", onednn=True)
LIBRARIES = (PASS, ONEDNN)


def mxnet_dir():
    """The installed mxnet package's directory (found without importing it)."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or spec.origin is None:
        raise RuntimeError("MXNet is not installed; mxamp needs mxnet==1.9.1")
    return Path(spec.origin).resolve().parent


def lib_api():
    """MXNet's extension API: the lib_api.h header and lib_api.cc source."""
    mxnet = mxnet_dir()
    header, source = mxnet / "include" / "mxnet" / "lib_api.h", mxnet / "src" / "lib_api.cc"
    if not header.is_file() or not source.is_file():
        raise RuntimeError(f"the installed MXNet ({mxnet}) does not ship lib_api.h / lib_api.cc; "
                           "mxamp needs the mxnet==1.9.1 wheel")
    return header, source


def _installed_prefixes():
    """The prefixes the onednn packages were installed into, read from their
    file lists (a venv's own, its base Python's, or a build environment's)."""
    prefixes = []
    for dist, tail, depth in (("onednn-devel-cpu-gomp", "include/oneapi/dnnl/dnnl.hpp", 3),
                              ("onednn-cpu-gomp", "/libdnnl.so.3", 1)):
        try:
            files = importlib.metadata.distribution(dist).files or ()
        except importlib.metadata.PackageNotFoundError:
            continue
        prefixes += [Path(f.locate()).resolve().parents[depth] for f in files
                     if f.as_posix().endswith(tail)]
    return tuple(dict.fromkeys(prefixes))


# Where pip puts the onednn packages' include/ and lib/ (a prefix install).
ONEDNN_PREFIXES = (*_installed_prefixes(), sys.prefix, sys.base_prefix, site.USER_BASE)


def onednn_prefix(prefixes=ONEDNN_PREFIXES, headers=True):
    """The first of `prefixes` holding libdnnl.so.3 (and oneDNN 3's headers,
    which only a build needs)."""
    wanted = ["lib/libdnnl.so.3"] + ["include/oneapi/dnnl/dnnl.hpp"] * headers
    for prefix in map(Path, prefixes):
        if all((prefix / name).is_file() for name in wanted):
            return prefix
    what = "dnnl.hpp and libdnnl.so.3" if headers else "libdnnl.so.3"
    raise RuntimeError(f"oneDNN 3 ({what}) not found under "
                       f"{', '.join(map(str, prefixes))}; install it with {ONEDNN_INSTALL}")


def _cmake(name, values):
    quoted = " ".join(f'"{value}"' for value in values)
    return f"set({name} {quoted})\n"


def write_cmake(out):
    """CMake `set()` lines for CMakeLists.txt: the flags, MXNet's and
    oneDNN's files, and each library's stem, sources and oneDNN use."""
    header, source = lib_api()
    prefix = onednn_prefix()
    lines = [_cmake("MXAMP_COMPILE_FLAGS", COMPILE_FLAGS),
             _cmake("MXNET_INCLUDE", [header.parents[1]]), _cmake("MXNET_LIB_API", [source]),
             _cmake("ONEDNN_INCLUDE", [prefix / "include"]),
             _cmake("ONEDNN_LIBRARY", [prefix / "lib" / "libdnnl.so.3"]),
             _cmake("ONEDNN_FLAGS", ONEDNN_FLAGS),
             _cmake("MXAMP_LIBRARIES", [lib.stem for lib in LIBRARIES])]
    for lib in LIBRARIES:
        lines += [_cmake(f"{lib.stem}_SOURCES", [f"src/operator/{s}" for s in lib.sources]),
                  _cmake(f"{lib.stem}_ONEDNN", ["ON" if lib.onednn else "OFF"])]
    Path(out).write_text("".join(lines))


if __name__ == "__main__":
    try:
        write_cmake(sys.argv[1])
    except RuntimeError as err:
        sys.exit(f"error: {err}")
