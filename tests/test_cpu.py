"""mxamp.cpu agrees with what the kernel libraries do under each ISA limit,
and bfloat16 arrays become numpy through one helper on every CPU."""
import ctypes
import json
import logging
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from mxamp import cpu, verify
from mxamp.dtypes import as_numpy, to_numpy
from mxamp.quantization.calibrate import Collector

BF16 = to_numpy(12)
LIMITS = ("AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "ALL")
# oneDNN 3's dnnl_cpu_isa_t values and the features each stands for.
ONEDNN_ISAS = {0x0: set(), 0x1: set(), 0x3: set(), 0x7: {"avx2"}, 0xF: {"avx2", "vnni"}, 0x1F: {"avx2", "vnni"},
               0x27: {"avx2", "avx512"}, 0x67: {"avx2", "avx512", "vnni"},
               0xE7: {"avx2", "avx512", "vnni", "bf16"}, 0x1EF: {"avx2", "avx512", "vnni", "bf16"},
               0xFEF: set(cpu.FEATURES), 0x1FEF: set(cpu.FEATURES)}


def _run(code, env):
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_MAX_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.cpu
@pytest.mark.parametrize("limit", LIMITS)
def test_onednn_features_are_what_onednn_3_uses(limit):
    """features('onednn') under a limit is the ISA oneDNN 3 itself runs on."""
    got = _run("""
import ctypes, json
from mxamp import cpu, native
lib = ctypes.CDLL(str(native.onednn_prefix() / "lib" / "libdnnl.so.3"))
print(json.dumps([lib.dnnl_get_effective_cpu_isa(), cpu.features("onednn").names()]))
""", {"ONEDNN_MAX_CPU_ISA": limit})
    assert set(got[1]) == ONEDNN_ISAS[got[0]]


@pytest.mark.cpu
@pytest.mark.parametrize("limit", ["AVX2", "AVX512_CORE", None])
def test_mxnet_bfloat16_kernels_follow_dnnl_max_cpu_isa(limit):
    """MXNet's bfloat16 Convolution runs exactly where mxnet_has_bfloat16()
    says, under DNNL_MAX_CPU_ISA (the variable MXNet's oneDNN 2 reads) and
    regardless of ONEDNN_MAX_CPU_ISA (oneDNN 3's)."""
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    if limit:
        env["DNNL_MAX_CPU_ISA"] = limit
    runs, said = _run("""
import json
import mxnet as mx
from mxamp import cpu
from mxamp.dtypes import to_numpy
bf16 = to_numpy(12)
x, w = (mx.nd.amp_cast(mx.nd.ones(s), dtype=bf16) for s in ((1, 4, 6, 6), (4, 4, 3, 3)))
try:
    mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True).wait_to_read()
    runs = True
except mx.base.MXNetError:
    runs = False
print(json.dumps([runs, cpu.mxnet_has_bfloat16()]))
""", env)
    assert runs is said
    if limit == "AVX2":
        assert not said


# MXNet's oneDNN v2.4 names the ISA it runs on in its verbose output.
MXNET_ISAS = {"Intel SSE4.1": set(), "Intel AVX": set(), "Intel AVX2": {"avx2"},
              "Intel AVX2 with Intel DL Boost": {"avx2", "vnni"},
              "Intel AVX-512": {"avx2"},  # Xeon Phi's AVX-512, without BW/VL/DQ
              "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions":
                  {"avx2", "avx512"},
              "Intel AVX-512 with Intel DL Boost": {"avx2", "avx512", "vnni"},
              "Intel AVX-512 with Intel DL Boost and bfloat16 support":
                  {"avx2", "avx512", "vnni", "bf16"},
              "Intel AVX-512 with Intel DL Boost and bfloat16 support and Intel AMX with "
              "bfloat16 and 8-bit integer support": set(cpu.FEATURES)}
# (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA); None: unset.
ODD_LIMITS = [("avx2", None), ("Avx2", None), (" AVX2", None), ("AVX2 ", None),
              ("garbage", None), ("", None), ("AVX512_MIC", None),
              (None, "avx2"), (None, " AVX2"), (None, "AVX2\t"), (None, "garbage"), (None, ""),
              (None, "AVX2_VNNI"), (None, "AVX512_MIC"), (None, "all"),
              ("garbage", "AVX2"), ("", "AVX2"), ("AVX512_CORE", "AVX2"),
              ("avx2", "AVX512_CORE"), ("all", "AVX2"), (None, "ALL"), (None, "AVX512_CORE_AMX")]


@pytest.mark.parametrize("onednn_isa,dnnl_isa", ODD_LIMITS, ids=repr)
def test_odd_limits_read_as_each_library_reads_them(onednn_isa, dnnl_isa):
    """features() of each engine against the library's own answer: oneDNN 3's
    dnnl_get_effective_cpu_isa, and the ISA MXNet's oneDNN 2 names in its
    verbose output when it runs a Convolution."""
    env = {"DNNL_VERBOSE": "1"}
    for name, value in (("ONEDNN_MAX_CPU_ISA", onednn_isa), ("DNNL_MAX_CPU_ISA", dnnl_isa)):
        if value is not None:
            env[name] = value
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_MAX_CPU_ISA")}
    out = subprocess.run([sys.executable, "-c", """
import ctypes, json
import mxnet as mx
from mxamp import cpu, native
x, w = mx.nd.ones((1, 4, 6, 6)), mx.nd.ones((4, 4, 3, 3))
mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True).wait_to_read()
lib = ctypes.CDLL(str(native.onednn_prefix() / "lib" / "libdnnl.so.3"))
print(json.dumps([lib.dnnl_get_effective_cpu_isa(), cpu.features("onednn").names(),
                  cpu.features("mxnet").names()]))
"""], env={**clean, **env}, check=True, capture_output=True, text=True).stdout
    mxnet_isa = next(line.split(",isa:", 1)[1] for line in out.splitlines()
                     if line.startswith("dnnl_verbose,info,cpu,isa:"))
    onednn_isa_code, onednn_said, mxnet_said = json.loads(out.splitlines()[-1])
    assert set(onednn_said) == ONEDNN_ISAS[onednn_isa_code]
    assert set(mxnet_said) == MXNET_ISAS[mxnet_isa]


def test_a_limit_caps_the_features(monkeypatch):
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    for engine in cpu.ENGINES:  # oneDNN 3 reads DNNL_MAX_CPU_ISA too
        have = cpu.features(engine)
        assert not (have.avx512 or have.vnni or have.bf16 or have.amx)
        assert have.limit == "DNNL_MAX_CPU_ISA=AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "all")
    assert cpu.features("onednn").limit == "ONEDNN_MAX_CPU_ISA=ALL"
    assert cpu.features("mxnet").limit == "DNNL_MAX_CPU_ISA=AVX2"
    assert "DNNL_MAX_CPU_ISA=AVX2" in cpu.describe()


ZEN4_FLAGS = "avx2 fma avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16"


@pytest.mark.parametrize("flags, vnni", [(ZEN4_FLAGS, False),  # AMD Zen 4
                                         (ZEN4_FLAGS + " avx_vnni", True)])  # Zen 5, Xeons
def test_an_avx2_vnni_limit_leaves_vnni_only_with_avx_vnni(monkeypatch, flags, vnni):
    """AVX2_VNNI is the VEX form of INT8 dot products: a CPU with only their
    AVX-512 form (Zen 4) runs at AVX2 under it, as oneDNN's effective ISA says."""
    monkeypatch.setattr(cpu, "_fields", lambda: {"flags": flags})
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2_VNNI")
    for engine in cpu.ENGINES:
        assert cpu.features(engine).names() == (["avx2", "vnni"] if vnni else ["avx2"])
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE_VNNI")
    assert cpu.features("onednn").names() == ["avx2", "avx512", "vnni"]


def test_bad_names_are_refused():
    with pytest.raises(ValueError, match="engine must be one of mxnet, onednn, got 'gpu'"):
        cpu.features("gpu")
    with pytest.raises(ValueError, match="isa must be one of SSE41, .*got 'AVX9'"):
        cpu.limited("AVX9")
    assert cpu.limited("AVX2") == {"DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


VALUES = [1.5, -2.25, 3.0e38, 9.99e-4, 0.0, -0.0]


def test_as_numpy_widens_bfloat16_exactly():
    """bfloat16 casts run on every CPU; as_numpy gives the float32 values
    bfloat16 holds, from an NDArray or from its numpy form."""
    low = mx.nd.amp_cast(mx.nd.array(VALUES), dtype=BF16)
    expected = mx.nd.amp_cast(low, dtype="float32").asnumpy()
    for array in (low, low.asnumpy()):
        got = as_numpy(array)
        assert got.dtype == np.float32 and got.tolist() == expected.tolist()
    assert expected[0] == 1.5 and expected[2] != 3.0e38  # rounded to 8 bits of mantissa
    assert as_numpy(mx.nd.array([1, 2], dtype="float16")).dtype == np.float16
    assert as_numpy(np.arange(3)).dtype == np.arange(3).dtype


def test_errors_of_bfloat16_outputs():
    ref = mx.nd.array([1.5, -2.25, 9.99e-4, 3.3])
    low = mx.nd.amp_cast(ref, dtype=BF16)
    assert 0 < verify.relative_error(low, ref) < 2 ** -8
    assert verify.relative_error(low.asnumpy(), ref) == verify.relative_error(low, ref)


def test_calibration_of_bfloat16_tensors():
    """A model declaring a bfloat16 input is calibrated on every CPU."""
    data = mx.sym.var("data", dtype=BF16)
    sym = mx.sym.amp_cast(mx.sym.relu(data), dtype="float32", name="out")
    batch = mx.nd.amp_cast(mx.nd.array([[-1.5, 2.25, 0.5, 3.0]]), dtype=BF16)
    for mode in ("naive", "entropy"):
        collector = Collector(sym, {}, {}, ["data"], ["data"], mode)
        collector.run([batch])
        stats = collector.stats()["data"]
        assert (stats.min, stats.max, stats.signed) == (-1.5, 3.0, True)


def test_comparison_with_bfloat16_outputs():
    """verify.compare on a model whose output is bfloat16 (a cast, which every
    CPU runs): the error is bfloat16's rounding and the output is finite."""
    data = mx.sym.var("data")
    reference = (mx.sym.identity(data), {}, {})
    converted = (mx.sym.amp_cast(data, dtype=BF16), {}, {})
    feeds = {"data": mx.nd.array(np.linspace(0.1, 7.3, 40).reshape(4, 10))}
    result = verify.compare(reference, converted, feeds)
    assert result["finite"] and 0 < result["errors"][0] < 2 ** -8


def test_lower_classes_each_remove_a_feature(monkeypatch):
    monkeypatch.setattr(cpu, "_hardware", lambda: {"avx2", "avx512", "vnni", "bf16"})
    assert cpu.lower_classes() == ["AVX2", "AVX512_CORE_VNNI"]
    assert cpu.rerun_limits() == ["AVX2", "AVX512_CORE_VNNI"]
    monkeypatch.setattr(cpu, "_hardware", lambda: set(cpu.FEATURES))
    assert cpu.lower_classes() == list(cpu.CLASSES)
    # on AMX, CI also reruns under the limit MXNet's oneDNN needs to run AMX
    assert cpu.rerun_limits() == list(cpu.CLASSES) + ["AVX512_CORE_AMX"]
    monkeypatch.setattr(cpu, "_hardware", lambda: {"avx2"})
    assert cpu.lower_classes() == [] and cpu.rerun_limits() == []


@pytest.mark.parametrize("fields, identity", [
    ({"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17", "flags": "avx2"},
     "AuthenticAMD family 25 model 17"),
    ({"vendor_id": "GenuineIntel", "model name": "Intel(R) Xeon(R)"}, None),  # no family
    ({}, None),  # no /proc/cpuinfo
])
def test_identity_is_vendor_family_and_model(monkeypatch, fields, identity):
    """The key of per-CPU speed data: finer than the ISA class, None where
    /proc/cpuinfo does not say it."""
    monkeypatch.setattr(cpu, "_fields", lambda: fields)
    assert cpu.identity() == identity


AMX_FLAGS = ZEN4_FLAGS + " avx_vnni amx_tile amx_bf16 amx_int8"


class FakeLinux:
    """Linux's answers to arch_prctl about the AMX tile state: whether it
    grants it when asked, and whether this process has it."""

    def __init__(self, grants):
        self.grants, self.permitted, self.requests = grants, False, 0

    def __call__(self, request, arg):
        if request == cpu._REQ_XCOMP_PERM:
            self.requests += 1
            self.permitted = self.permitted or self.grants
            return 0 if self.grants else -1
        ctypes.c_uint64.from_address(arg).value = int(self.permitted) << cpu._XTILEDATA
        return 0


@pytest.fixture
def amx_cpu(monkeypatch):
    """An AMX Xeon as /proc/cpuinfo and /proc/self/maps tell it, no limit
    set, before mxamp's step; MXNet's oneDNN's reading of its limit is
    recorded instead of made (this process's MXNet has made kernels)."""
    monkeypatch.setattr(cpu, "_fields", lambda: {"flags": AMX_FLAGS})
    monkeypatch.setattr(cpu, "_jit_code_bytes", lambda: 4096)  # ctypes' page
    monkeypatch.setattr(cpu, "_mxnet_latched", None)
    for name in ("DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", cpu.AMX_SWITCH):
        monkeypatch.delenv(name, raising=False)
    latched = []
    monkeypatch.setattr(cpu, "_latch_mxnet_isa", latched.append)
    linux = FakeLinux(grants=True)
    monkeypatch.setattr(cpu, "_arch_prctl", linux)
    return latched, linux


def test_amx_for_mxnet_on_import(amx_cpu, caplog):
    """On an AMX CPU, MXNet's oneDNN gets the AMX limit, the tile state is
    asked for first, and one INFO line says so and names the switch (that the
    variable is gone afterwards: test_mxnets_onednn_keeps_the_limit_it_read_first)."""
    latched, linux = amx_cpu
    assert not cpu.features("mxnet").amx  # MXNet's oneDNN leaves AMX out by default
    assert cpu.features("onednn").amx  # oneDNN 3 runs it
    with caplog.at_level(logging.INFO, logger="mxamp.cpu"):
        cpu.enable_mxnet_amx()
        cpu.enable_mxnet_amx()
    assert latched == ["AVX512_CORE_AMX"] and linux.permitted
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "MXAMP_MXNET_AMX=0 turns this off" in caplog.text
    have = cpu.features("mxnet")
    assert have.names() == list(cpu.FEATURES) and have.limit is None


@pytest.mark.parametrize("limit, requested, amx", [("AVX2", 0, False),
                                                   ("AVX512_CORE_BF16", 0, False),
                                                   ("AVX512_CORE_AMX", 1, True)])
def test_a_limit_the_user_set_is_kept(amx_cpu, monkeypatch, caplog, limit, requested, amx):
    """mxamp leaves a user's DNNL_MAX_CPU_ISA as it is; under the AMX limit it
    asks for the tile state, without which MXNet would die with SIGILL."""
    latched, linux = amx_cpu
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", limit)
    with caplog.at_level(logging.INFO, logger="mxamp.cpu"):
        cpu.enable_mxnet_amx()
    assert latched == [] and linux.requests == requested and caplog.text == ""
    assert os.environ["DNNL_MAX_CPU_ISA"] == limit
    assert cpu.features("mxnet").amx is amx


def test_the_switch_turns_it_off(amx_cpu, monkeypatch, caplog):
    latched, linux = amx_cpu
    monkeypatch.setenv(cpu.AMX_SWITCH, "0")
    with caplog.at_level(logging.INFO, logger="mxamp.cpu"):
        cpu.enable_mxnet_amx()
    assert latched == [] and linux.requests == 0 and caplog.text == ""
    assert not cpu.features("mxnet").amx


@pytest.mark.parametrize("jit_bytes, grants, says", [
    (3 << 20, True, "kernels were made in this process before mxamp was imported"),
    (4096, False, "Linux refused this process the AMX tile state"),
])
def test_where_amx_cannot_be_had_one_warning_says_why(amx_cpu, monkeypatch, caplog,
                                                       jit_bytes, grants, says):
    """MXNet already made kernels (its ISA is fixed), or Linux refuses the
    tile state (an older kernel): MXNet's kernels stay as they were, never
    an AMX kernel without the tile state (SIGILL)."""
    latched, linux = amx_cpu
    monkeypatch.setattr(cpu, "_jit_code_bytes", lambda: jit_bytes)
    linux.grants = grants
    with caplog.at_level(logging.INFO, logger="mxamp.cpu"):
        cpu.enable_mxnet_amx()
    assert latched == [] and [r.levelname for r in caplog.records] == ["WARNING"]
    assert says in caplog.text
    assert not cpu.features("mxnet").amx


def test_a_failing_first_kernel_is_a_warning(amx_cpu, monkeypatch, caplog):
    """MXNet's error from the kernel that fixes its ISA (its library broken,
    say) must not stop mxamp's import: one warning, AMX not claimed."""
    def fails(isa):
        raise mx.base.MXNetError("Error in operator FullyConnected: out of memory")
    monkeypatch.setattr(cpu, "_latch_mxnet_isa", fails)
    cpu.enable_mxnet_amx()
    assert "its first kernel failed (Error in operator FullyConnected: out of memory)" \
        in caplog.text
    assert not cpu.features("mxnet").amx


def test_a_refused_tile_state_under_the_users_amx_limit_is_a_warning(amx_cpu, monkeypatch,
                                                                     caplog):
    latched, linux = amx_cpu
    linux.grants = False
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE_AMX")
    cpu.enable_mxnet_amx()
    assert latched == [] and "will stop it with SIGILL; unset the variable" in caplog.text
    assert not cpu.features("mxnet").amx


def test_nothing_changes_on_a_cpu_without_amx(amx_cpu, monkeypatch, caplog):
    latched, linux = amx_cpu
    monkeypatch.setattr(cpu, "_fields", lambda: {"flags": ZEN4_FLAGS})
    with caplog.at_level(logging.INFO, logger="mxamp.cpu"):
        cpu.enable_mxnet_amx()
    assert latched == [] and linux.requests == 0 and caplog.text == ""


def test_mxnets_onednn_keeps_the_limit_it_read_first():
    """The step that gives MXNet's oneDNN its limit, on any CPU: after it the
    variable is gone (a child process does not see it), and MXNet's own
    verbose output names the ISA of the limit it read (AVX2 here, which every
    CPU class has)."""
    out = subprocess.run([sys.executable, "-c", """
import os, subprocess, sys
import mxnet as mx
from mxamp import cpu
cpu._latch_mxnet_isa("AVX2")
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('DNNL_MAX_CPU_ISA'))"],
                       capture_output=True, text=True).stdout.strip()
x, w = mx.nd.ones((1, 4, 6, 6)), mx.nd.ones((4, 4, 3, 3))
mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True).wait_to_read()
print("child", child, os.environ.get("DNNL_MAX_CPU_ISA"))
"""], env={**{k: v for k, v in os.environ.items() if not k.endswith("_MAX_CPU_ISA")},
           "DNNL_VERBOSE": "1", cpu.AMX_SWITCH: "0"},
        check=True, capture_output=True, text=True).stdout
    isa = next(line.split(",isa:", 1)[1] for line in out.splitlines()
               if line.startswith("dnnl_verbose,info,cpu,isa:"))
    assert isa == "Intel AVX2" and out.splitlines()[-1] == "child None None"


def test_kernels_made_before_mxamp_are_seen():
    """What tells mxamp that MXNet already fixed its ISA: importing mxamp
    (its AMX step off) makes no kernel, so the process holds no JIT code;
    one MXNet convolution later it does."""
    out = subprocess.run([sys.executable, "-c", """
import mxnet as mx
from mxamp import cpu
before = cpu._jit_code_bytes()
x, w = mx.nd.ones((1, 4, 6, 6)), mx.nd.ones((4, 4, 3, 3))
mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True).wait_to_read()
print(before <= cpu._JIT_BYTES < cpu._jit_code_bytes())
"""], env={**os.environ, cpu.AMX_SWITCH: "0"}, check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["True"]
