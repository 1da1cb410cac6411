"""Commands and conversions under a cgroup memory limit (containers,
systemd, Kubernetes): each completes, or ends with one error naming out of
memory and the cgroup; never the kernel's SIGKILL (which ended `mxamp
convert` with -9 and its staging directory left behind). mxamp reads the
cgroup's limit and use (v1 and v2) and limits its address space to what the
cgroup leaves."""
import contextlib
import logging
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from mxamp import address_space
from test_address_space import BIG_DENSE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 2 ** 20
V1_NO_LIMIT = 9223372036854771712


def fake_tree(root, proc_lines, files):
    """A file system under `root` holding /proc/self/cgroup and the cgroup
    files `files` ({path under sys/fs/cgroup: content})."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("".join(f"{line}\n" for line in proc_lines))
    for path, content in files.items():
        (root / "sys/fs/cgroup" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "sys/fs/cgroup" / path).write_text(content)
    return str(root)


def test_v2_the_cgroup_with_least_left_of_the_path_and_its_ancestors(tmp_path):
    root = fake_tree(tmp_path, ["0::/app/job"], {
        "app/memory.max": f"{1000 * MIB}\n", "app/memory.current": f"{900 * MIB}\n",
        "app/memory.stat": f"anon 1\nfile {130 * MIB}\nshmem {30 * MIB}\nactive_file 5\n",
        "app/job/memory.max": "max\n", "app/job/memory.current": f"{500 * MIB}\n",
        "memory.current": f"{10_000 * MIB}\n"})  # the root has no memory.max
    assert address_space.cgroup_memory(root) == address_space.Cgroup(
        "/app", 1000 * MIB, 800 * MIB)  # the page cache but shared memory is not held
    (tmp_path / "sys/fs/cgroup/app/job/memory.max").write_text(f"{600 * MIB}\n")
    group = address_space.cgroup_memory(root)
    assert group.path == "/app/job" and group.headroom == 100 * MIB


def test_v2_at_the_unified_mount_of_a_hybrid_system(tmp_path):
    root = fake_tree(tmp_path, ["1:cpu:/", "0::/svc"], {
        "unified/svc/memory.max": f"{300 * MIB}", "unified/svc/memory.current": f"{MIB}"})
    assert address_space.cgroup_memory(root) == address_space.Cgroup("/svc", 300 * MIB, MIB)


def test_v1_nested_with_unlimited_levels(tmp_path):
    root = fake_tree(tmp_path, ["5:cpu,cpuacct:/x", "4:memory:/pod/box", "0::/"], {
        "memory/memory.limit_in_bytes": f"{V1_NO_LIMIT}",
        "memory/memory.usage_in_bytes": f"{5000 * MIB}",
        "memory/pod/memory.limit_in_bytes": f"{2000 * MIB}",
        "memory/pod/memory.usage_in_bytes": f"{1200 * MIB}",
        "memory/pod/memory.stat": f"cache 7\ntotal_cache {250 * MIB}\ntotal_shmem {50 * MIB}\n",
        "memory/pod/box/memory.limit_in_bytes": f"{V1_NO_LIMIT}",
        "memory/pod/box/memory.usage_in_bytes": f"{700 * MIB}"})
    assert address_space.cgroup_memory(root) == address_space.Cgroup(
        "/pod", 2000 * MIB, 1000 * MIB)


def test_v1_in_a_container_showing_the_hosts_path(tmp_path):
    """Without its own cgroup namespace a container sees the host's path,
    and its own cgroup mounted at the hierarchy's root."""
    root = fake_tree(tmp_path, ["4:memory:/docker/0123abc"], {
        "memory/memory.limit_in_bytes": f"{512 * MIB}",
        "memory/memory.usage_in_bytes": f"{12 * MIB}"})
    assert address_space.cgroup_memory(root) == address_space.Cgroup("/", 512 * MIB, 12 * MIB)


def test_no_limit_known_where_nothing_can_be_read(tmp_path):
    assert address_space.cgroup_memory(str(tmp_path)) is None  # no /proc/self/cgroup
    root = fake_tree(tmp_path, ["4:memory:/a", "0::/a"], {
        "memory/a/memory.limit_in_bytes": f"{V1_NO_LIMIT}",
        "memory/a/memory.usage_in_bytes": "1",
        "a/memory.max": "max", "a/memory.current": "1",
        "unified/a/memory.max": "garbage", "unified/a/memory.current": "1"})
    assert address_space.cgroup_memory(root) is None
    limit = tmp_path / "sys/fs/cgroup/a/memory.max"
    limit.write_text(f"{64 * MIB}")
    assert address_space.cgroup_memory(root).limit == 64 * MIB
    if os.geteuid() != 0:  # root reads a file whatever its mode
        limit.chmod(0)
        assert address_space.cgroup_memory(root) is None
    limit.unlink()
    (tmp_path / "sys/fs/cgroup/a/memory.max").mkdir()  # a directory: unreadable
    assert address_space.cgroup_memory(root) is None


@pytest.fixture
def fake_cgroup(tmp_path, monkeypatch):
    """This process in a fake v2 cgroup leaving 64 GiB (harmless as an
    address-space limit); the limit restored after the test."""
    root = fake_tree(tmp_path, ["0::/big"], {
        "big/memory.max": f"{65 * 1024 * MIB}", "big/memory.current": f"{1024 * MIB}"})
    if address_space.limit_kib() is not None:
        pytest.skip("ulimit -v is set: it, not the fake cgroup, limits this process")
    monkeypatch.setattr(address_space, "FILESYSTEM_ROOT", root)
    monkeypatch.delenv(address_space.CGROUP_SWITCH, raising=False)
    monkeypatch.setitem(address_space._lowered, "logged", False)
    before = resource.getrlimit(resource.RLIMIT_AS)
    yield
    resource.setrlimit(resource.RLIMIT_AS, before)


def test_the_api_limits_the_address_space_only_while_it_works(fake_cgroup, caplog):
    from mxamp.errors import memory_for
    before = resource.getrlimit(resource.RLIMIT_AS)
    assert address_space.note() == ""
    with caplog.at_level(logging.INFO, logger="mxamp.address_space"):
        with memory_for("converting"):
            soft = resource.getrlimit(resource.RLIMIT_AS)[0]
            assert 63 * 2 ** 20 < soft // 1024 - address_space._used_kib() <= 64 * 2 ** 20
            with memory_for("converting a part"):  # nested: the outer block's limit stays
                assert resource.getrlimit(resource.RLIMIT_AS)[0] == soft
            assert resource.getrlimit(resource.RLIMIT_AS)[0] == soft
            assert address_space.note() == (
                f" (the address space is limited to {soft // 1024:,} KiB to stay within the "
                "memory limit of 66,560 MiB of the cgroup /big; MXAMP_CGROUP_LIMIT=0 turns "
                "this off)")
        assert resource.getrlimit(resource.RLIMIT_AS) == before and address_space.note() == ""
        with pytest.raises(ValueError):  # restored on errors too
            with memory_for("converting"):
                raise ValueError("not about memory")
        assert resource.getrlimit(resource.RLIMIT_AS) == before
    said = [r.getMessage() for r in caplog.records if "cgroup" in r.getMessage()]
    assert said == ["the cgroup /big limits memory to 66,560 MiB: mxamp's work runs with its "
                    "address space limited to what the cgroup leaves (MXAMP_CGROUP_LIMIT=0 "
                    "turns this off)"]


def test_a_lower_ulimit_is_kept_and_named(fake_cgroup):
    from mxamp.errors import memory_for
    low = (address_space._used_kib() + 2 ** 20) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (low, resource.getrlimit(resource.RLIMIT_AS)[1]))
    with memory_for("converting"):
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == low
        assert address_space.note().endswith("KiB by ulimit -v)")


def test_the_switch_turns_it_off(fake_cgroup, monkeypatch):
    from mxamp.errors import memory_for
    before = resource.getrlimit(resource.RLIMIT_AS)
    assert address_space.cgroup_cap() is not None
    monkeypatch.setenv(address_space.CGROUP_SWITCH, "0")
    assert address_space.cgroup_cap() is None
    with memory_for("converting"):
        assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_where_mxnet_sees_a_gpu_the_limit_is_left_as_it_is(fake_cgroup, monkeypatch):
    """A CUDA context reserves far more address space than memory."""
    from mxamp import errors
    before = resource.getrlimit(resource.RLIMIT_AS)
    monkeypatch.setattr(errors, "no_gpus", lambda: False)
    with errors.memory_for("converting"):
        assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_a_process_wide_change_that_fails_to_start_leaves_no_block_open():
    from mxamp.process_wide import ProcessWide
    made = []

    def start():
        if not made:
            made.append("failed")
            raise OSError("no")
        made.append("made")
        return lambda: made.append("undone")
    change = ProcessWide(start)
    with pytest.raises(OSError):
        with change():
            pass
    with change():
        with change():  # nested: made once
            pass
    assert made == ["failed", "made", "undone"]


def test_zoo_workers_share_the_headroom(fake_cgroup, monkeypatch):
    alone = address_space.cgroup_cap()[0] - address_space._used_kib()
    monkeypatch.setitem(address_space._lowered, "processes", 1)
    address_space.share_cgroup_headroom(4)
    shared = address_space.cgroup_cap()[0] - address_space._used_kib()
    assert abs(shared - alone // 4) < 16 * 1024  # VmSize may move a little between the calls


# --- In a real memory cgroup -------------------------------------------------

def _own_memory_cgroup():
    """(directory, version) of this process's memory cgroup, or a reason
    why a child cgroup cannot be made."""
    if os.geteuid() != 0:
        return None, "making a memory cgroup needs root"
    with open("/proc/self/cgroup") as listing:
        lines = [line.rstrip("\n").split(":", 2) for line in listing]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            where = "/sys/fs/cgroup/memory" + path
            if os.access(os.path.join(where, "memory.limit_in_bytes"), os.W_OK):
                return (where, "v1"), None
    for _, controllers, path in lines:
        where = "/sys/fs/cgroup" + path
        with contextlib.suppress(OSError), open(os.path.join(where, "cgroup.subtree_control")) as f:
            if "memory" in f.read().split():
                return (where, "v2"), None
    return None, "no memory cgroup controller this process can make a child cgroup in"


@contextlib.contextmanager
def memory_cgroup(name, limit_bytes):
    """A child memory cgroup of this process's, limited to `limit_bytes`;
    its directory, removed after (its processes ended)."""
    found, why = _own_memory_cgroup()
    if found is None:
        pytest.skip(why)
    parent, version = found
    where = os.path.join(parent, f"mxamp-test-{os.getpid()}-{name}")
    try:
        os.mkdir(where)
    except OSError as err:
        pytest.skip(f"cannot make a memory cgroup in {parent}: {err}")
    try:
        set_limit(where, limit_bytes)
        yield where
    finally:
        os.rmdir(where)


def set_limit(where, limit_bytes):
    name = "memory.max" if os.path.exists(os.path.join(where, "memory.max")) else \
        "memory.limit_in_bytes"
    with open(os.path.join(where, name), "w") as limit:
        limit.write(str(limit_bytes))


def in_cgroup(where, args, cwd, argv=(), **env):
    """A child Python started inside the cgroup `where`: the console script
    (a list of arguments) or code (a string, given `argv`)."""
    python = [sys.executable, "-c", args, *argv] if isinstance(args, str) else \
        [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()", *args]
    paths = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return subprocess.run(
        ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', where, *python],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != address_space.CGROUP_SWITCH},
             "PYTHONPATH": os.pathsep.join(paths), **env})


# A child's memory once mxamp's command line and MXNet are loaded, in bytes.
LOADED = ("import mxamp.tools.cli; print(next(int(l.split()[1]) for l in "
          "open('/proc/self/status') if l.startswith('VmRSS')) * 1024)")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A Dense(5000) model (a 100 MB weight) saved as `big`."""
    import mxnet as mx
    where = tmp_path_factory.mktemp("cgroup")
    net = mx.gluon.nn.Dense(5000, in_units=5000, prefix="fc_")
    net.initialize(mx.init.Uniform(1.0))
    net.hybridize()
    net(mx.nd.ones((1, 5000)))
    net.export(str(where / "big"))
    np.save(where / "unused.npy", np.zeros(1))
    return where


def test_convert_in_a_memory_cgroup_completes_or_says_so(big):
    loaded = int(subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": ROOT}).stdout.split()[-1])
    args = ["convert", "big", "--dtype", "float16", "--shape", "data:1,5000", "--out", "c",
            "--overwrite"]
    # Far less than a command's start needs beyond what MXNet holds once
    # loaded; less than the conversion's float32 and float16 copies, where
    # the page cache the kernel drops may still make room; plenty (it peaked
    # at 340 MiB more).
    for extra, name in ((40 * MIB, "tiny"), (150 * MIB, "short"), (1000 * MIB, "ample")):
        with memory_cgroup(name, loaded + extra) as where:
            done = in_cgroup(where, args, big)
        assert done.returncode != -9, (name, "SIGKILL", done.stderr[-2000:])
        if done.returncode == 0 and name != "tiny":
            assert os.path.exists(big / "c-symbol.json")
            continue
        assert name != "ample", done.stderr[-3000:]
        lines = [line for line in done.stderr.splitlines() if not line.startswith("[")]
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert len(lines) == 1 and lines[0].startswith("Error: out of memory"), lines
        assert "of the cgroup /" in lines[0] and f"/{os.path.basename(where)}" in lines[0], lines
        assert sorted(os.listdir(big)) == ["big-0000.params", "big-symbol.json", "unused.npy"]


# BIG_DENSE converted once its cgroup (argv[1]) leaves `extra` (argv[2])
# bytes: it prints the outcome and, with the limit lifted, whether the
# caller's weight is still float32 and unchanged.
CONVERT_IN_CGROUP = BIG_DENSE + """
from mxamp import address_space
where, extra = sys.argv[1], int(sys.argv[2])
limit = "memory.max" if "memory.max" in __import__("os").listdir(where) else "memory.limit_in_bytes"
def set_limit(value):
    with open(f"{where}/{limit}", "w") as file:
        file.write(str(value))
version = "v2" if limit == "memory.max" else "v1"  # its own use, whatever its ancestors'
set_limit(address_space._read_cgroup(where, "/", version).used + extra)
try:
    _, out, _ = mxamp.convert_model(sym, params, {}, target_dtype="float16",
                                     cast_optional_params=True)
    print("converted", out["fc_weight"].dtype.__name__)
except MemoryError as err:
    print(type(err).__name__, err)
set_limit(2 ** 40)
print(weight.dtype.__name__, weight.asnumpy().tobytes() == before)
"""


def test_convert_model_in_a_memory_cgroup_says_what_it_was_doing(tmp_path):
    outcomes = {}
    for extra in (40 * MIB, 1500 * MIB):  # under the cast's 50 MB; far above the model
        with memory_cgroup(f"api{extra}", 2 ** 40) as where:
            done = in_cgroup(where, CONVERT_IN_CGROUP, tmp_path, argv=(where, str(extra)))
        assert done.returncode == 0 and "Traceback" not in done.stderr, \
            (extra, done.returncode, done.stderr[-3000:])
        first, caller = done.stdout.splitlines()[-2:]
        assert caller == "float32 True"  # the caller's weight is untouched either way
        outcomes[extra] = first
    assert outcomes[1500 * MIB] == "converted float16"
    assert outcomes[40 * MIB].startswith("OutOfMemory out of memory while "), outcomes
    assert "of the cgroup /" in outcomes[40 * MIB], outcomes


SWITCH = """
import resource
import mxamp.tools.cli
from mxamp import address_space
unlimited = resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY
address_space.limit_to_cgroup()
print(unlimited, resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY)
"""


def test_the_switch_leaves_the_address_space_unlimited_in_a_cgroup(tmp_path):
    with memory_cgroup("switch", 4096 * MIB) as where:
        on = in_cgroup(where, SWITCH, tmp_path)
        off = in_cgroup(where, SWITCH, tmp_path, MXAMP_CGROUP_LIMIT="0")
    assert on.stdout.split() == ["True", "True"], on.stderr[-2000:]
    assert off.stdout.split() == ["True", "False"], off.stderr[-2000:]
