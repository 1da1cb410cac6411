"""The process's address-space limit (``ulimit -v``, RLIMIT_AS), and the one
mxamp derives from its cgroup's memory limit. It imports nothing of MXNet's:
the package sets it up before MXNet starts its threads, and the command line
reads it when MXNet could not start."""
import ctypes
import logging
import os
import resource
from typing import NamedTuple

from .process_wide import ProcessWide

_log = logging.getLogger(__name__)

# glibc's mallopt parameter for the most malloc arenas a process makes.
_M_ARENA_MAX = -8


def limit_kib():
    """The soft address-space limit in KiB, or None where there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft // 1024


def share_malloc_arenas():
    """Under an address-space limit, glibc's malloc keeps to one arena
    (unless MALLOC_ARENA_MAX is set), as under a cgroup memory limit, which
    mxamp turns into one (see :func:`cgroup_limited`): a thread that allocates may get an
    arena of its own, which reserves 64 MiB of address space, and MXNet's
    engine and OpenMP threads then ran out of it (under 1,000,000 KiB the
    commands aborted with "terminate called without an active exception");
    with one, what a command needs is the same from run to run."""
    if limit_kib() is not None:
        _one_arena()


def _one_arena():
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1)
    except (OSError, AttributeError):  # a C library without mallopt
        pass


def note():
    """Where the address space is limited, a sentence saying so (and by
    what) for an error message about memory; else an empty string."""
    limit = limit_kib()
    if limit is None:
        return ""
    return f" (the address space is limited to {limit:,} KiB {_cause(limit)})"


def _cause(limit):
    """What set the soft limit `limit` (KiB): a cgroup's memory limit where
    mxamp lowered it to that value, else ulimit -v."""
    cgroup = _lowered["cgroup"]
    if cgroup is None or _lowered["kib"] != limit:
        return "by ulimit -v"
    return (f"to stay within the memory limit of {cgroup.limit // 2**20:,} MiB "
            f"of the cgroup {cgroup.path}; {CGROUP_SWITCH}=0 turns this off")


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
    return (f"out of memory: the address space is limited to {limit:,} KiB {_cause(limit)}, and "
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


# --- A cgroup's memory limit, as an address-space limit ----------------------
#
# Where a cgroup's memory limit is reached, the kernel's OOM killer ends the
# process with SIGKILL, which no process can turn into an error. The address
# space a process holds grows at least as fast as the memory it holds, so a
# process whose address space may grow by at most what its cgroup has left
# never makes the cgroup reach its limit: a failed allocation instead, which
# the address-space machinery above turns into one error.

# "0" leaves the address space as it is.
CGROUP_SWITCH = "MXAMP_CGROUP_LIMIT"
# The file system the cgroup files are read from (a fake tree in the tests).
FILESYSTEM_ROOT = "/"
# cgroup v1 writes "no limit" as the largest page count in bytes
# (9223372036854771712 with 4 KiB pages).
_V1_UNLIMITED = 1 << 62
# Per version: the limit's file, the usage's, and memory.stat's counts of the
# page cache and of its part the kernel cannot drop (tmpfs, shared memory):
# the rest is cache counted in the usage that the kernel reclaims, not held.
_FILES = {"v2": ("memory.max", "memory.current", ("file", "shmem")),
          "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes",
                 ("total_cache", "total_shmem"))}


class Cgroup(NamedTuple):
    """A memory cgroup: its path in its hierarchy, its limit and the memory
    its processes hold (without reclaimable cache), in bytes."""
    path: str
    limit: int
    used: int

    @property
    def headroom(self):
        return max(self.limit - self.used, 0)


def cgroup_memory(root=None):
    """Of the memory cgroups this process is in (v1 and v2) and their
    ancestors, the one with the least headroom, or None where no limit can
    be read. `root`: the file system holding /proc and /sys/fs/cgroup."""
    root = root or FILESYSTEM_ROOT
    found = [group for mount, path, version in _hierarchies(root)
             for group in _ancestors(mount, path, version)]
    return min(found, key=lambda group: group.headroom, default=None)


def _hierarchies(root):
    """(mount directory, path of this process's cgroup, version) of each
    hierarchy that may hold the memory controller."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as listing:
            lines = listing.read().splitlines()
    except OSError:
        return []
    mounts = os.path.join(root, "sys/fs/cgroup")
    found = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # the unified hierarchy, at either usual mount
            found += [(mounts, path, "v2"), (os.path.join(mounts, "unified"), path, "v2")]
        elif "memory" in controllers.split(","):
            found.append((os.path.join(mounts, "memory"), path, "v1"))
    return found


def _ancestors(mount, path, version):
    """The cgroup at `path` and each above it that has a limit. A directory
    that is missing is skipped: in a container without its own cgroup
    namespace the path is the host's, and the container's cgroup is the
    mount's root."""
    parts = [part for part in path.split("/") if part]
    for depth in range(len(parts), -1, -1):
        group = _read_cgroup(os.path.join(mount, *parts[:depth]),
                             "/" + "/".join(parts[:depth]), version)
        if group is not None:
            yield group


def _read_cgroup(directory, path, version):
    limit_file, usage_file, reclaimable = _FILES[version]
    limit = _read_number(os.path.join(directory, limit_file))
    used = _read_number(os.path.join(directory, usage_file))
    if limit is None or used is None or limit >= _V1_UNLIMITED:
        return None
    cache, kept = (_stat(directory, key) for key in reclaimable)
    return Cgroup(path, limit, max(used - max(cache - kept, 0), 0))


def _read_number(path):
    """The number a cgroup file holds; None for "max", or a file that is
    missing or cannot be read."""
    try:
        with open(path) as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return None


def _stat(directory, key):
    """memory.stat's value of `key` in bytes; 0 where it does not say."""
    try:
        with open(os.path.join(directory, "memory.stat")) as stat:
            for line in stat:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


# The soft limit mxamp set from a cgroup (KiB) and that cgroup; how many
# processes share the cgroup's headroom (zoo's workers); whether it was logged.
_lowered = {"kib": None, "cgroup": None, "processes": 1, "logged": False}


def cgroup_cap():
    """(soft limit in KiB, cgroup) where a cgroup leaves this process less
    memory than its address-space limit allows: the address space in use
    plus its share of the cgroup's headroom. Else None, as with
    MXAMP_CGROUP_LIMIT=0."""
    if os.environ.get(CGROUP_SWITCH, "").strip() == "0":
        return None
    group, used = cgroup_memory(), _used_kib()
    if group is None or used is None:
        return None
    cap = used + group.headroom // 1024 // _lowered["processes"]
    limit = limit_kib()
    return None if limit is not None and limit <= cap else (cap, group)


def share_cgroup_headroom(processes):
    """In each of `processes` processes working at once in one cgroup (zoo's
    workers), each takes that share of the headroom it finds."""
    _lowered["processes"] = max(1, processes)


def limit_to_cgroup():
    """The command line's: lowers the soft address-space limit to
    :func:`cgroup_cap`'s for the rest of the process."""
    capped = cgroup_cap()
    if capped:
        _lower(*capped)


def _lower_for_now():
    """Lowers the limit to the cgroup's cap; returns what puts it back
    (unless something else changed it meanwhile)."""
    capped = cgroup_cap()
    if not capped:
        return lambda: None
    previous = resource.getrlimit(resource.RLIMIT_AS)
    was = _lowered["kib"], _lowered["cgroup"]
    _lower(*capped)

    def restore():
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == capped[0] * 1024:  # else changed meanwhile: that one holds
            below_hard = hard == resource.RLIM_INFINITY or \
                previous[0] != resource.RLIM_INFINITY and previous[0] <= hard
            resource.setrlimit(resource.RLIMIT_AS, (previous[0] if below_hard else hard, hard))
        _lowered["kib"], _lowered["cgroup"] = was
    return restore


# Within it the soft address-space limit is cgroup_cap's, as in
# limit_to_cgroup, and the previous one after: the library's work runs under
# it without keeping a user's process limited. Blocks nest, in any thread:
# the outermost lowers and restores the limit (it belongs to the whole
# process).
cgroup_limited = ProcessWide(_lower_for_now)


def _lower(cap_kib, group):
    _, hard = resource.getrlimit(resource.RLIMIT_AS)  # cgroup_cap's is below it
    resource.setrlimit(resource.RLIMIT_AS, (cap_kib * 1024, hard))
    _lowered["kib"], _lowered["cgroup"] = cap_kib, group
    _one_arena()
    if not _lowered["logged"]:
        _lowered["logged"] = True
        _log.info("the cgroup %s limits memory to %s MiB: mxamp's work runs with its address "
                  "space limited to what the cgroup leaves (%s=0 turns this off)",
                  group.path, f"{group.limit // 2**20:,}", CGROUP_SWITCH)
