"""The process's address-space limit (``ulimit -v``, RLIMIT_AS). It imports
nothing of MXNet's: the package sets it up before MXNet starts its threads,
and the command line reads it when MXNet could not start."""
import ctypes
import os
import resource

# glibc's mallopt parameter for the most malloc arenas a process makes.
_M_ARENA_MAX = -8


def limit_kib():
    """The soft address-space limit in KiB, or None where there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft // 1024


def share_malloc_arenas():
    """Under an address-space limit, glibc's malloc keeps to one arena
    (unless MALLOC_ARENA_MAX is set): a thread that allocates may get an
    arena of its own, which reserves 64 MiB of address space, and MXNet's
    engine and OpenMP threads then ran out of it (under 1,000,000 KiB the
    commands aborted with "terminate called without an active exception");
    with one, what a command needs is the same from run to run."""
    if limit_kib() is None or "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1)
    except (OSError, AttributeError):  # a C library without mallopt
        pass


def note():
    """Where the address space is limited, a sentence saying so for an error
    message about memory; else an empty string."""
    limit = limit_kib()
    return "" if limit is None else \
        f" (the address space is limited to {limit:,} KiB by ulimit -v)"


# Address space a command needs beyond MXNet's import: a share for its work,
# and for each thread of its OpenMP teams a stack (`ulimit -s`) and 4 MiB.
# Measured with a small model under `ulimit -v` (8 MiB stacks), what was left
# once MXNet was loaded: `mxamp quantize`, on one CPU with two OpenMP threads,
# completed with 210,960 KiB, ended with an out-of-memory error with 161,052
# KiB and died inside MXNet's engine (SIGSEGV) with 110,960 KiB; `mxamp
# convert` completed with 61,064 KiB (one thread) and 73,032 KiB (two), and
# died (SIGABRT, starting MXNet's threads) with 48,036 KiB (two). The share
# is quantize's, the heaviest of the two.
WORK_KIB = 176 * 1024
# `mxamp zoo` builds a GluonCV network and runs it in float32 first. With
# resnet18_v1 at 1x3x64x64 (two threads) it completed with 494,800 KiB left,
# ended with an out-of-memory error with 465,000 or less, and died inside
# MXNet (SIGSEGV building the network) with 374,800 and with 224,800.
WORK_KIB_OF = {"zoo": 480 * 1024}
THREAD_EXTRA_KIB = 4 * 1024


def shortfall(command=None):
    """Where the address space is limited and what is left of it once MXNet
    is loaded is less than `command` (a CLI command's name) needs, a message
    saying so; else None."""
    limit, used = limit_kib(), _used_kib()
    if limit is None or used is None:
        return None
    needed = needed_kib(command)
    if limit - used >= needed:
        return None
    return (f"out of memory: the address space is limited to {limit:,} KiB by ulimit -v, and "
            f"{max(limit - used, 0):,} KiB of it are left once MXNet is loaded; a command "
            f"needs {needed:,} KiB more to start its threads: raise the limit")


def needed_kib(command=None):
    """What shortfall asks to be left for `command`: its work's share, and a
    stack and THREAD_EXTRA_KIB per thread of an OpenMP team."""
    stack, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stack_kib = 8 * 1024 if stack == resource.RLIM_INFINITY else stack // 1024
    work = WORK_KIB_OF.get(command, WORK_KIB)
    return work + (stack_kib + THREAD_EXTRA_KIB) * _team_size()


def _team_size():
    """The threads of an OpenMP team: OMP_NUM_THREADS where it is a number,
    else (as MXNet and oneDNN count) the CPUs this process may run on."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        return len(os.sched_getaffinity(0))


def _used_kib():
    """The process's address space in use (VmSize), or None where /proc
    does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
