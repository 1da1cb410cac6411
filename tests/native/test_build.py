"""Building the C++ pass: cached by content, rebuilt when stale or corrupt,
compiled once by concurrent first uses, clear errors."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxamp import native as _lib
from mxamp.native import inputs

ROOT = Path(__file__).resolve().parents[2]
CONVERT = ("import mxnet as mx, mxamp; "
           "s = mxamp.convert_symbol(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, "
           "name='fc'), target_dtype='float16'); print(mxamp.summarize(s))")
CONVERTED = "{'amp_cast:float16': 3, 'amp_cast:float32': 1}\n"  # data, weight, bias; output


def python(code, cache, **env):
    """Runs `code` in a new Python process with MXAMP_CACHE=`cache`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MXAMP_CACHE": str(cache), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=env.pop("cwd", None), timeout=300)


@pytest.fixture(scope="module")
def built():
    """The graph pass library in the default cache (built if needed)."""
    return _lib.build()


def copy_into(cache, library):
    """The library and its checksum, copied into `cache` under the same names."""
    cache.mkdir(parents=True, exist_ok=True)
    for path in (library, library.with_suffix(".sha256")):
        shutil.copy(path, cache / path.name)
    return cache / library.name


def test_library_name_follows_sources_and_flags(tmp_path, monkeypatch):
    base = _lib.library_path()
    assert base != _lib.library_path(extra_flags=("-DMXAMP_VARIANT",))
    src = tmp_path / "src"
    shutil.copytree(_lib.SOURCE_DIR, src)
    monkeypatch.setattr(_lib, "SOURCE_DIR", src)
    assert _lib.library_path() == base
    (src / "amp_pass.cc").write_text((src / "amp_pass.cc").read_text() + "\n// edited\n")
    assert _lib.library_path() != base  # an edited source makes the cached library stale


def test_library_name_follows_headers_and_the_compiler(tmp_path, monkeypatch):
    """Every input of the build is in the cache key, not only the
    compiled sources: mxamp's own headers, oneDNN's, and the compiler."""
    base, backend = _lib.library_path(), _lib.library_path(lib=_lib.ONEDNN)
    src = tmp_path / "src"
    shutil.copytree(_lib.SOURCE_DIR, src)
    (src / "kernels.h").write_text("#pragma once\n")
    with monkeypatch.context() as patch:
        patch.setattr(_lib, "SOURCE_DIR", src)
        assert _lib.library_path() != base
    prefix = tmp_path / "onednn"  # oneDNN with one header changed
    shutil.copytree(_lib.onednn_prefix() / "include", prefix / "include")
    (prefix / "lib").mkdir()
    (prefix / "lib" / "libdnnl.so.3").symlink_to(_lib.onednn_prefix() / "lib" / "libdnnl.so.3")
    monkeypatch.setattr(_lib, "ONEDNN_PREFIXES", (str(prefix),))
    config = prefix / "include" / "oneapi" / "dnnl" / "dnnl_config.h"
    config.write_text(config.read_text() + "\n")
    assert _lib.library_path() == base
    assert _lib.library_path(lib=_lib.ONEDNN) not in (backend, _lib.library_path())
    compiler = tmp_path / "g++"  # the same g++ saying another version
    compiler.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo 99 || exec {shutil.which('g++')} \"$@\"\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    assert _lib.library_path() != base


def test_shipped_library_is_loaded_as_it_is(tmp_path, monkeypatch, built):
    """An installed wheel's library (beside mxamp/native) is used without
    sources or a compiler; without it, or with --force, the cache's is built."""
    monkeypatch.setattr(_lib, "PACKAGE_DIR", tmp_path)
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path / "cache"))
    assert _lib.shipped() is None and _lib.library_file() == _lib.library_path()
    shutil.copy(built, tmp_path / "libmxamp.so")
    monkeypatch.setattr(_lib, "SOURCE_DIR", tmp_path / "no-sources")
    monkeypatch.setenv("CXX", "/nonexistent")
    assert _lib.library_file() == _lib.shipped() == tmp_path / "libmxamp.so"
    with pytest.raises(RuntimeError, match=r"sources are missing .*reinstall mxamp from its wheel"):
        _lib.library_file(force=True)


def test_cmake_reads_the_same_inputs(tmp_path):
    """CMakeLists.txt builds what the cache build builds: the same sources,
    flags, MXNet extension API and oneDNN."""
    done = subprocess.run([sys.executable, str(ROOT / "mxamp/native/inputs.py"),
                           str(tmp_path / "inputs.cmake")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    header, lib_api = inputs.lib_api()
    prefix = _lib.onednn_prefix()
    assert (tmp_path / "inputs.cmake").read_text() == "".join([
        'set(MXAMP_COMPILE_FLAGS "-std=c++17" "-O2")\n',
        f'set(MXNET_INCLUDE "{header.parents[1]}")\n', f'set(MXNET_LIB_API "{lib_api}")\n',
        f'set(ONEDNN_INCLUDE "{prefix / "include"}")\n',
        f'set(ONEDNN_LIBRARY "{prefix / "lib" / "libdnnl.so.3"}")\n',
        'set(ONEDNN_FLAGS "-fopenmp")\n',
        'set(MXAMP_LIBRARIES "libmxamp" "libmxamp_onednn")\n',
        'set(libmxamp_SOURCES "src/operator/amp_pass.cc")\n', 'set(libmxamp_ONEDNN "OFF")\n',
        'set(libmxamp_onednn_SOURCES '
        + " ".join(f'"src/operator/{s}"' for s in inputs.ONEDNN.sources) + ")\n",
        'set(libmxamp_onednn_ONEDNN "ON")\n'])
    assert all(flag in _lib.CXXFLAGS for flag in inputs.COMPILE_FLAGS)


def test_build_compiles_into_an_empty_cache_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path))
    path = _lib.build()
    assert path.parent == tmp_path and path.is_file()
    data = path.read_bytes()
    assert json.loads(path.with_suffix(".sha256").read_text()) == {
        "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    mtime = path.stat().st_mtime_ns
    assert _lib.build() == path and path.stat().st_mtime_ns == mtime
    # the library, its checksum and the build lock; no temporary left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        path.with_suffix(s).name for s in (".lock", ".sha256", ".so"))


def test_truncated_library_is_rebuilt_not_loaded(tmp_path, built):
    """A library cut short after its checksum was written used to kill the
    first conversion with SIGBUS when MXNet mapped it."""
    target = copy_into(tmp_path, built)
    target.write_bytes(built.read_bytes()[:len(built.read_bytes()) // 2])
    done = python(CONVERT, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == CONVERTED
    assert (f"rebuilding {target}: its size or sha256 does not match its checksum "
            "(truncated or corrupt)") in done.stderr
    # whole again (its new checksum matches); bytes may differ from `built`,
    # which another checkout (another source path) may have compiled
    assert _lib._problem(target) is None and target.stat().st_size > len(built.read_bytes()) // 2


def test_empty_library_without_checksum_is_rebuilt(tmp_path, monkeypatch, built, caplog):
    """A 0-byte file under the library's name ("file too short" when loaded)."""
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path))
    (tmp_path / built.name).write_bytes(b"")
    assert _lib.build() == tmp_path / built.name
    assert _lib._problem(tmp_path / built.name) is None
    assert caplog.messages[0] == \
        f"rebuilding {tmp_path / built.name}: no readable checksum beside it"


def test_concurrent_first_uses_compile_once(tmp_path):
    code = "import logging, mxamp.native as l; logging.basicConfig(level=logging.INFO); l.load()"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MXAMP_CACHE": str(tmp_path)}
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    errors = [run.communicate(timeout=300)[1] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], errors
    assert sum(e.count("building mxamp graph pass") for e in errors) == 1


def test_cache_directory_is_absolute_and_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("MXAMP_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _lib.cache_dir() == tmp_path / "xdg" / "mxamp"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # ignored, as the XDG spec says
    assert _lib.cache_dir() == Path.home() / ".cache" / "mxamp"
    monkeypatch.setenv("MXAMP_CACHE", "cache")  # wins over XDG_CACHE_HOME
    monkeypatch.chdir(tmp_path)
    assert _lib.cache_dir() == tmp_path / "cache"


def test_relative_cache_directory_converts(tmp_path, built):
    """MXNet's library loader refuses relative paths: every conversion failed."""
    copy_into(tmp_path / "cache", built)
    done = python(CONVERT, "cache", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == CONVERTED
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(
        built.with_suffix(s).name for s in (".sha256", ".so"))  # used as it was


@pytest.mark.parametrize("where, reason", [("file/cache", "Not a directory"),
                                           ("file", "File exists")])
def test_unusable_cache_directory_is_a_clear_error(tmp_path, monkeypatch, where, reason):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path / where))
    with pytest.raises(RuntimeError) as err:
        _lib.build()
    assert str(err.value) == (f"cannot use the cache directory {tmp_path / where} for mxamp's "
                              f"libraries ({reason}); set MXAMP_CACHE to a writable directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the mode")
def test_read_only_cache_directory_is_a_clear_error(tmp_path, monkeypatch):
    tmp_path.chmod(0o500)
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path / "cache"))
    try:
        with pytest.raises(RuntimeError, match=r"cannot use the cache directory .* \(Permission "
                                               r"denied\); set MXAMP_CACHE"):
            _lib.build()
    finally:
        tmp_path.chmod(0o700)


def test_library_without_the_pass_is_an_error_not_a_silent_no_op(tmp_path):
    """A library that loads but registers no pass made optimize_for return
    its input: the conversion silently changed nothing."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "amp_pass.cc").write_text(
        '#include "mxnet/lib_api.h"\n'
        "mxnet::ext::MXReturnValue initialize(int) { return mxnet::ext::MX_SUCCESS; }\n")
    done = python(f"import mxamp.native as l, pathlib; l.SOURCE_DIR = pathlib.Path({str(src)!r}); "
                  + CONVERT, tmp_path / "cache")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        f"RuntimeError: mxamp's graph pass library was loaded but 'mxamp_reduce_precision' is "
        f"not registered with MXNet (is the library in {tmp_path / 'cache'} from other "
        "sources?); rebuild it with `python -m mxamp.build --force`")


def test_loaded_pass_passes_the_registration_check():
    _lib.load()
    _lib.check_registered(_lib.PASS)


def test_loading_the_libraries_leaves_mxnets_operator_functions_alone():
    """mx.library.load remade every Python operator function of MXNet, about
    1 s of a process's first conversion or quantization. The backend's
    region operator is still known to MXNet: a partitioned model runs."""
    code = ("import mxnet as mx, mxamp.native as n; relu = mx.nd.relu; n.load(n.PASS); "
            "n.load(n.ONEDNN); print(mx.nd.relu is relu); from mxamp.backends import onednn; "
            "fc = mx.sym.FullyConnected(mx.sym.var('x'), num_hidden=2, name='fc'); "
            "args = {'fc_weight': mx.nd.ones((2, 3)), 'fc_bias': mx.nd.zeros(2)}; "
            "part, part_args, _ = onednn.apply_backend(fc, args, {}, compute='float32'); "
            "print(onednn.REGION_OP in part.tojson()); "
            "exe = part.bind(mx.cpu(), {'x': mx.nd.ones((1, 3)), **part_args}); "
            "print(exe.forward()[0].asnumpy().tolist())")
    done = python(code, _lib.cache_dir())
    assert done.stdout.split("\n")[:3] == ["True", "True", "[[3.0, 3.0]]"], done.stderr


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(RuntimeError, match="compiler 'no-such-compiler' not found"):
        _lib.build()


def test_build_command_without_compiler_prints_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mxamp.build"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "CXX": "/nonexistent",
                               "MXAMP_CACHE": str(tmp_path)}, timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == ("error: cannot build mxamp's graph pass: compiler '/nonexistent' not "
                           "found; install a C++17 compiler (Debian/Ubuntu: apt-get install g++) "
                           "or set CXX\n")


def test_missing_sources_say_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setattr(_lib, "SOURCE_DIR", tmp_path)
    with pytest.raises(RuntimeError, match=r"C\+\+ sources are missing .*python -m mxamp.build"):
        _lib.library_path()


def test_compile_errors_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "amp_pass.cc").write_text("this is not C++\n")
    monkeypatch.setattr(_lib, "SOURCE_DIR", src)
    with pytest.raises(RuntimeError, match="building mxamp's graph pass failed"):
        _lib.build()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [_lib.library_path().with_suffix(
        ".lock").name]  # no temporary left behind
