"""What this CPU can do, as MXNet's and oneDNN's kernels see it.

The one place mxamp reads the CPU: its flags, capped by the ISA limit each
kernel library honours, read exactly as that library reads it (measured
with each library's own answer, tests/test_cpu.py):

- MXNet 1.9.1's bundled oneDNN v2.4 reads ``DNNL_MAX_CPU_ISA`` only, and
  only a name spelled exactly as it knows it (``avx2``, `` AVX2`` and
  unknown names are ignored: the whole CPU);
- oneDNN 3 (the backend) reads ``ONEDNN_MAX_CPU_ISA`` when it is set and
  not empty, else ``DNNL_MAX_CPU_ISA``, in any case but without spaces; a
  name it does not know is ignored (the whole CPU; it does not fall back to
  ``DNNL_MAX_CPU_ISA``).

Both read their limit once, when first used, so set it before the process
starts: with ``AVX2`` on a bfloat16 CPU, mxamp behaves as on an AVX2 CPU.

MXNet's oneDNN v2.4 leaves AMX out unless its limit is ``AVX512_CORE_AMX``,
and never asks Linux for the AMX tile state, so under that limit alone its
first AMX kernel dies with SIGILL. :func:`enable_mxnet_amx`, run when mxamp
is imported, asks for the tile state and has MXNet's oneDNN read that limit
(``MXAMP_MXNET_AMX=0`` turns it off).
"""
import ctypes
import dataclasses
import functools
import logging
import os
import platform

import mxnet as mx

from .errors import OptionError

log = logging.getLogger(__name__)

#: The features :func:`features` reports, in its order.
FEATURES = ("avx2", "avx512", "vnni", "bf16", "amx")
#: The kernel libraries, each with the ISA-limit variables it reads, in order.
ENGINES = {"mxnet": ("DNNL_MAX_CPU_ISA",),
           "onednn": ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}

_AVX512 = {"avx2", "avx512"}
#: The features each oneDNN ISA limit leaves (by its names; each ISA
#: includes the instructions of the ones it extends).
LIMITS = {
    "SSE41": set(), "AVX": set(), "AVX2": {"avx2"},
    "AVX2_VNNI": {"avx2", "vnni"}, "AVX2_VNNI_2": {"avx2", "vnni"},
    "AVX512_CORE": _AVX512, "AVX512_CORE_VNNI": _AVX512 | {"vnni"},
    "AVX512_CORE_BF16": _AVX512 | {"vnni", "bf16"}, "AVX512_CORE_FP16": _AVX512 | {"vnni", "bf16"},
    "AVX512_CORE_AMX": set(FEATURES), "AVX512_CORE_AMX_FP16": set(FEATURES),
    "ALL": set(FEATURES),
}
# How each library reads its limit: whether it ignores case, and the names
# it knows. oneDNN v2.4 (MXNet's) also knows the Xeon Phi ISAs (AVX-512
# without BW/VL/DQ: avx2 here), and not those named after it; its ALL, like
# no limit, leaves AMX out (AMX was a preview there, run only when named).
_MXNET_NAMES = {**{n: f for n, f in LIMITS.items()
                   if n not in ("AVX2_VNNI_2", "AVX512_CORE_FP16", "AVX512_CORE_AMX_FP16")},
                "ALL": set(FEATURES) - {"amx"},
                "AVX512_MIC": {"avx2"}, "AVX512_MIC_4OPS": {"avx2"}}
_READERS = {"mxnet": (False, _MXNET_NAMES), "onednn": (True, LIMITS)}
# Linux /proc/cpuinfo flags behind each feature (any one group suffices).
_FLAGS = {
    "avx2": [{"avx2", "fma"}],
    "avx512": [{"avx512f", "avx512bw", "avx512vl", "avx512dq"}],
    "vnni": [{"avx512_vnni"}, {"avx_vnni"}, {"amx_int8"}],
    "bf16": [{"avx512_bf16"}, {"amx_bf16"}],
    "amx": [{"amx_tile", "amx_bf16", "amx_int8"}],
}


@dataclasses.dataclass(frozen=True)
class Features:
    """The instruction sets a kernel library uses on this CPU.

    Each is capped by the ISA limit the library honours.

    Attributes
    ----------
    avx2 : bool
        AVX2 with FMA.
    avx512 : bool
        AVX-512 F, BW, VL and DQ (oneDNN's ``avx512_core``).
    vnni : bool
        INT8 dot products: AVX512-VNNI, AVX-VNNI or AMX.
    bf16 : bool
        bfloat16 dot products: AVX512-BF16 or AMX.
    amx : bool
        AMX tiles.
    limit : str or None
        ``"NAME=VALUE"`` of the ISA limit in force, if any.
    """
    avx2: bool
    avx512: bool
    vnni: bool
    bf16: bool
    amx: bool
    limit: str = None  # "NAME=VALUE" of the ISA limit in force, if any

    def names(self):
        """The names of the features present.

        Returns
        -------
        list of str
            In the order of :data:`FEATURES`.
        """
        return [f for f in FEATURES if getattr(self, f)]

    def __str__(self):
        text = " ".join(self.names()) or "no AVX2"
        return f"{text} (limit {self.limit})" if self.limit else text


@functools.lru_cache(maxsize=None)
def _fields():
    """The fields of /proc/cpuinfo (of its last processor: all are alike);
    empty where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in fields.items()}


def _cpuinfo():
    """(model name, set of flags) from /proc/cpuinfo."""
    fields = _fields()
    return fields.get("model name", "unknown CPU"), frozenset(fields.get("flags", "").split())


def _usable(found):
    """`found` without the features that lack the ones they extend (a
    hypervisor may show a subset; an ISA limit may take AVX-512 away)."""
    if "avx2" not in found:
        return set()
    if "avx512" not in found:
        found = found - {"bf16", "amx"}
        if "avx_vnni" not in _cpuinfo()[1]:
            # Below AVX-512, INT8 dot products need their VEX form (AVX-VNNI):
            # AMD Zen 4 has AVX512-VNNI only, so AVX2_VNNI leaves it AVX2.
            found = found - {"vnni"}
    return found


def _hardware():
    flags = _cpuinfo()[1]
    return _usable({f for f, groups in _FLAGS.items() if any(g <= flags for g in groups)})


def _limit(engine):
    """(variable, ISA name, features it leaves) of the limit `engine` honours,
    or Nones: the first of its variables that is set and not empty is the
    one it reads, and a value it does not know means no limit."""
    ignore_case, names = _READERS[engine]
    variable = next((v for v in ENGINES[engine] if os.environ.get(v)), None)
    if variable is None:
        return None, None, None
    value = os.environ[variable].upper() if ignore_case else os.environ[variable]
    if value not in names:
        return None, None, None
    return variable, value, names[value]


def features(engine="onednn"):
    """This CPU's features as a kernel library sees them, ISA limits included.

    Parameters
    ----------
    engine : str
        ``"mxnet"`` (MXNet 1.9.1's own kernels, its bundled oneDNN 2) or
        ``"onednn"`` (oneDNN 3, mxamp's backend).

    Returns
    -------
    Features

    Raises
    ------
    mxamp.OptionError
        For an unknown engine.
    """
    if engine not in ENGINES:
        raise OptionError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    found = _hardware()
    name, value, allowed = _limit(engine)
    if value is not None:
        found = _usable(found & allowed)
    if engine == "mxnet" and not _mxnet_runs_amx(value):
        found = found - {"amx"}
    return Features(**{f: f in found for f in FEATURES},
                    limit=f"{name}={value}" if value else None)


def model():
    """The CPU's model name (from ``/proc/cpuinfo``).

    Returns
    -------
    str or None
    """
    return _cpuinfo()[0]


def identity():
    """The CPU's make, finer than its ISA class.

    The same ISA class holds CPUs whose kernels run at very different speeds:
    this is the key of per-CPU speed data.

    Returns
    -------
    str or None
        ``"<vendor> family <f> model <m>"`` from ``/proc/cpuinfo``; None where
        it does not say.
    """
    fields = _fields()
    parts = [fields.get(k) for k in ("vendor_id", "cpu family", "model")]
    if not all(parts):
        return None
    return f"{parts[0]} family {parts[1]} model {parts[2]}"


def describe():
    """One line naming the CPU and what each kernel library uses of it.

    Returns
    -------
    str
        E.g. ``"Intel(R) Xeon(R) Processor @ 2.80GHz: avx2 avx512 vnni"``;
        each library's features where they differ (under an ISA limit).
    """
    mxnet, onednn = features("mxnet"), features("onednn")
    seen = f"{mxnet}" if mxnet == onednn else f"MXNet: {mxnet}; oneDNN 3: {onednn}"
    return f"{model()}: {seen}"


def mxnet_has_bfloat16():
    """Whether MXNet 1.9.1 runs bfloat16 Convolution and FullyConnected here.

    Its oneDNN 2 kernels need AVX-512: natively with AVX512-BF16 or AMX,
    emulated by oneDNN without them.

    Returns
    -------
    bool
    """
    return features("mxnet").avx512


#: The CPU classes below AMX as ISA limits (AVX2 only, AVX-512 with VNNI
#: and without bfloat16, AVX-512 with bfloat16 and without AMX).
CLASSES = ("AVX2", "AVX512_CORE_VNNI", "AVX512_CORE_BF16")


def lower_classes():
    """The CPU classes this CPU can stand for under an ISA limit.

    Returns
    -------
    list of str
        The limits of :data:`CLASSES` that remove some feature this CPU has:
        what CI reruns the CPU-sensitive tests under, so that one machine
        covers several classes.
    """
    have = _hardware()
    return [isa for isa in CLASSES if have & LIMITS[isa] != have]


def rerun_limits():
    """The ISA limits CI reruns the CPU-sensitive tests under.

    Returns
    -------
    list of str
        :func:`lower_classes`, and on a CPU with AMX :data:`MXNET_AMX_LIMIT`
        too: MXNet's oneDNN runs AMX only under that limit set by the user
        (mxamp then asks Linux for the tile state), a path of its own.
    """
    return lower_classes() + ([MXNET_AMX_LIMIT] if "amx" in _hardware() else [])


def limited(isa):
    """The environment that caps both kernel libraries at an ISA.

    Parameters
    ----------
    isa : str
        A name of :data:`LIMITS` (``"AVX2"``, ``"AVX512_CORE_VNNI"``, ...).

    Returns
    -------
    dict of str to str
        The variables to set (before the process starts: both libraries read
        them once).

    Raises
    ------
    mxamp.OptionError
        For an unknown ISA name.
    """
    if isa not in LIMITS:
        raise OptionError(f"isa must be one of {', '.join(LIMITS)}, got {isa!r}")
    return {name: isa for names in ENGINES.values() for name in names}


# Linux's arch_prctl: the syscall's number on x86-64, its requests for the
# extended state a process may use, and the AMX tile data's component.
_ARCH_PRCTL, _GET_XCOMP_PERM, _REQ_XCOMP_PERM, _XTILEDATA = 158, 0x1022, 0x1023, 18
#: The only ISA limit under which MXNet's oneDNN v2.4 runs AMX kernels.
MXNET_AMX_LIMIT = "AVX512_CORE_AMX"
#: The environment variable that, set to 0, keeps :func:`enable_mxnet_amx` off.
AMX_SWITCH = "MXAMP_MXNET_AMX"
_mxnet_latched = None  # the limit mxamp had MXNet's oneDNN read (enable_mxnet_amx)
# Run-time code larger than this is a JIT's (oneDNN's kernels take 256 KiB
# and more); ctypes' trampolines take a page or two.
_JIT_BYTES = 64 << 10


def _arch_prctl(request, arg):
    """Linux's answer to arch_prctl(request, arg): 0 on success; -1 where it
    fails or is not there (another OS or architecture, an older kernel)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return -1
    syscall = ctypes.CDLL(None).syscall
    syscall.restype = ctypes.c_long
    return syscall(*(ctypes.c_long(a) for a in (_ARCH_PRCTL, request, arg)))


def _tiles_permitted():
    """Whether Linux lets this process use the AMX tile state."""
    perm = ctypes.c_uint64(0)
    if _arch_prctl(_GET_XCOMP_PERM, ctypes.addressof(perm)) != 0:
        return False
    return bool(perm.value >> _XTILEDATA & 1)


def _request_tiles():
    """Asks Linux for the AMX tile state (once per process is enough; asking
    again is harmless); whether it is now permitted."""
    return _arch_prctl(_REQ_XCOMP_PERM, _XTILEDATA) == 0 or _tiles_permitted()


def _mxnet_runs_amx(limit):
    """Whether MXNet's oneDNN runs AMX kernels under `limit` (the value of its
    variable it honours, or None): only under AVX512_CORE_AMX, set by the user
    or by mxamp, with the tile state permitted."""
    return (limit or _mxnet_latched) == MXNET_AMX_LIMIT and _tiles_permitted()


def _jit_code_bytes():
    """The bytes of anonymous executable memory in this process: code made
    at run time, as oneDNN makes its kernels."""
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if "x" in fields[1] and len(fields) == 5:  # no file, no [vdso]
                start, end = (int(a, 16) for a in fields[0].split("-"))
                total += end - start
    return total


def _latch_mxnet_isa(isa):
    """Has MXNet's oneDNN take `isa` as its limit for the rest of the process.
    It reads DNNL_MAX_CPU_ISA once, when it makes its first kernel: set the
    variable, make one, and put it back, so that child processes (which lack
    this one's tile permission) do not inherit it."""
    saved = os.environ.get("DNNL_MAX_CPU_ISA")
    os.environ["DNNL_MAX_CPU_ISA"] = isa
    try:
        one = mx.nd.ones((1, 1))
        mx.nd.FullyConnected(one, one, no_bias=True, num_hidden=1).wait_to_read()
    finally:
        if saved is None:
            del os.environ["DNNL_MAX_CPU_ISA"]
        else:
            os.environ["DNNL_MAX_CPU_ISA"] = saved


def enable_mxnet_amx():
    """Lets MXNet 1.9.1's own kernels run on AMX where the CPU has it.

    mxamp runs this when it is imported, before anything runs a kernel of
    MXNet's: it asks Linux for the AMX tile state, then has MXNet's oneDNN
    read :data:`MXNET_AMX_LIMIT` as its limit (and removes the variable
    again, so that child processes, which lack the permission, do not
    inherit it), and logs one INFO line. A ``DNNL_MAX_CPU_ISA`` the user set
    is kept as it is; under :data:`MXNET_AMX_LIMIT` the tile state is asked
    for, which MXNet's oneDNN never does. ``MXAMP_MXNET_AMX=0``
    (:data:`AMX_SWITCH`) turns the rest off. Where it cannot be done (MXNet
    made kernels before mxamp was imported, or Linux refuses the tile
    state), one WARNING says so and MXNet runs as it would without mxamp.
    Calling it again does nothing.
    """
    global _mxnet_latched
    if "amx" not in _hardware() or _mxnet_latched:
        return
    user_limit = os.environ.get("DNNL_MAX_CPU_ISA")
    if user_limit:
        if user_limit == MXNET_AMX_LIMIT and not _request_tiles():
            log.warning("DNNL_MAX_CPU_ISA=%s, but Linux refused this process the AMX tile "
                        "state: MXNet's first AMX kernel will stop it with SIGILL; unset the "
                        "variable", user_limit)
        return
    if os.environ.get(AMX_SWITCH) == "0":
        return
    if _jit_code_bytes() > _JIT_BYTES:
        log.warning("MXNet's kernels cannot use this CPU's AMX: kernels were made in this "
                    "process before mxamp was imported (MXNet's oneDNN fixes its ISA with its "
                    "first); import mxamp before running MXNet")
        return
    if not _request_tiles():
        log.warning("MXNet's kernels cannot use this CPU's AMX: Linux refused this process "
                    "the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM needs Linux 5.16 "
                    "or later)")
        return
    try:
        _latch_mxnet_isa(MXNET_AMX_LIMIT)
    except mx.base.MXNetError as err:
        log.warning("MXNet's kernels cannot use this CPU's AMX: its first kernel failed (%s)",
                    str(err).strip().splitlines()[-1])
        return
    _mxnet_latched = MXNET_AMX_LIMIT
    log.info("MXNet's kernels run on AMX: mxamp gave its oneDNN the limit %s and asked "
             "Linux for the AMX tile state (%s=0 turns this off)", MXNET_AMX_LIMIT, AMX_SWITCH)
