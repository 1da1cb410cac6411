"""Building the C++ pass: cached by content, rebuilt when stale, clear errors."""
import shutil

import pytest

from mxamp import _lib


def test_library_name_follows_sources_and_flags(tmp_path, monkeypatch):
    base = _lib.library_path()
    assert base != _lib.library_path(extra_flags=("-DMXAMP_VARIANT",))
    src = tmp_path / "src"
    shutil.copytree(_lib.SOURCE_DIR, src)
    monkeypatch.setattr(_lib, "SOURCE_DIR", src)
    assert _lib.library_path() == base
    (src / "amp_pass.cc").write_text((src / "amp_pass.cc").read_text() + "\n// edited\n")
    assert _lib.library_path() != base  # an edited source makes the cached library stale


def test_build_compiles_into_an_empty_cache_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path))
    path = _lib.build()
    assert path.parent == tmp_path and path.is_file()
    mtime = path.stat().st_mtime_ns
    assert _lib.build() == path and path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MXAMP_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(RuntimeError, match="compiler 'no-such-compiler' not found"):
        _lib.build()


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
    assert list((tmp_path / "cache").iterdir()) == []
