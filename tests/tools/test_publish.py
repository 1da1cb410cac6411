"""Publishing outputs whole (mxamp.tools.publish): every reader finds the
previous output or the new one, after a kill at each step and while
another process republishes; runs that are gone are cleaned up after, live
ones never touched."""
import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import mxnet as mx
import numpy as np
import pytest

import mxamp
from graphs import tiny_net
from mxamp import verify
from mxamp.tools import checkpoint, publish
from published import listing, signal_at_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.dirname(
    os.path.abspath(__file__))])}
X = mx.nd.array(np.random.default_rng(0).uniform(size=(1, 3, 8, 8)))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two float32 pairs whose symbols and parameters both differ, so that a
    mixed pair (A's symbol, B's params) loads and runs, giving outputs that
    match neither: {name: (symbol bytes, params bytes, output on X)}."""
    directory = tmp_path_factory.mktemp("models")
    net = tiny_net()
    net.export(str(directory / "a"))
    sym, args, aux = mx.model.load_checkpoint(str(directory / "a"), 0)
    checkpoint.save_checkpoint(str(directory / "b"), mx.sym.relu(sym) * 3,
                               {k: v * 2 for k, v in args.items()}, aux)
    found = {}
    for name in "ab":
        sym_bytes, params_bytes = (open(p, "rb").read() for p in
                                   checkpoint.checkpoint_files(str(directory / name), 0))
        found[name] = (sym_bytes, params_bytes, mxamp.load(str(directory / name))(X).asnumpy())
    return found


def write_pair(staging, name, model):
    for path, data in zip(checkpoint.checkpoint_files(os.path.join(staging, name), 0), model):
        with open(path, "wb") as f:
            f.write(data)


def publish_pair(directory, model, name="q"):
    files = checkpoint.checkpoint_files(str(directory / name), 0)
    with publish.output(files, overwrite=True, key=name) as staging:
        write_pair(staging, name, model)


def pair_bytes(directory, name="q"):
    return tuple(open(p, "rb").read() for p in
                 checkpoint.checkpoint_files(str(directory / name), 0))


def plain_pair(directory, model, name="q"):
    """The pair as plain files (MXNet's save_checkpoint, another program),
    with no work directory beside it."""
    for path, data in zip(checkpoint.checkpoint_files(str(directory / name), 0), model):
        if os.path.lexists(path):
            os.remove(path)
        with open(path, "wb") as f:
            f.write(data)


def killed_at(step, publishing):
    """Runs `publishing()` in a forked child killed (SIGKILL) at its
    `step`-th file system change; whether the kill came before the end."""
    pid = os.fork()
    if pid == 0:  # the child only renames and links files: no MXNet after the fork
        try:
            signal_at_step(step, signal.SIGKILL)
            publishing()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


def kill_at_every_step(directory, before, publishing, check):
    """SIGKILL at each step of `publishing` in turn, the directory made as
    `before()` first; `check()` after each; the number of steps."""
    step = 0
    while True:
        before()
        killed = killed_at(step, publishing)
        check(step)
        if not killed:
            return step
        step += 1


def test_a_kill_while_taking_over_plain_files_leaves_a_whole_pair(models, tmp_path):
    """A plain pair is first taken into a version of its own, then each file
    becomes a link into it, then the new version is switched in: after a
    kill at any step, the bytes at both paths are one pair, old or new, and
    mxamp's loader reads it."""
    def before():
        shutil.rmtree(tmp_path / ".q.mxamp", ignore_errors=True)
        plain_pair(tmp_path, models["a"][:2])

    def check(step):
        assert pair_bytes(tmp_path) in (models["a"][:2], models["b"][:2]), step
        checkpoint.load_checkpoint(str(tmp_path / "q"))
    # the plain files' version (made, 2 links), switched to (3), each file a
    # link (3 each); the new version in, switched to, the plain files' out
    assert kill_at_every_step(tmp_path, before, lambda: publish_pair(tmp_path, models["b"][:2]),
                              check) == 17


def test_a_kill_after_the_switch_leaves_the_new_pair_and_the_next_run_cleans_up(models,
                                                                                tmp_path):
    publish_pair(tmp_path, models["a"][:2])
    steps = kill_at_every_step(tmp_path, lambda: publish_pair(tmp_path, models["a"][:2]),
                               lambda: publish_pair(tmp_path, models["b"][:2]),
                               lambda step: None)
    assert steps == 5
    assert pair_bytes(tmp_path) == models["b"][:2]
    publish_pair(tmp_path, models["a"][:2])
    assert listing(tmp_path) == [".q.mxamp", "q-0000.params", "q-symbol.json"]


def test_files_not_written_keep_their_content(models, tmp_path):
    """Another epoch's params stay loadable when one epoch is published; a
    file of the group the run did not write keeps its previous bytes."""
    publish_pair(tmp_path, models["a"][:2])
    files = checkpoint.checkpoint_files(str(tmp_path / "q"), 1)
    with publish.output([*files, str(tmp_path / "q.json")], overwrite=True, key="q") as staging:
        write_pair(staging, "q", models["b"][:2])
        os.rename(os.path.join(staging, "q-0000.params"), os.path.join(staging, "q-0001.params"))
    assert open(files[1], "rb").read() == models["b"][1]
    assert open(tmp_path / "q-0000.params", "rb").read() == models["a"][1]
    assert not os.path.lexists(tmp_path / "q.json")
    assert listing(tmp_path) == [".q.mxamp", "q-0000.params", "q-0001.params", "q-symbol.json"]


def test_a_directory_without_exchange_is_put_back_after_a_kill(tmp_path, monkeypatch):
    """Where the file system cannot exchange two directories, the previous
    one is renamed aside; killed before the new one is in, the next run
    puts it back, with a WARNING."""
    def unsupported(*_):
        raise OSError(errno.EINVAL, "not supported")
    monkeypatch.setattr(publish, "_renameat2", unsupported)
    out = tmp_path / "rep"

    def before():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        (out / "previous").write_text("x")

    def publishing():
        with publish.output([out], overwrite=True, directory=True) as staging:
            open(os.path.join(staging, "new"), "w").close()

    def check(step):
        names = os.listdir(out) if out.exists() else []
        if step == 2:  # after the exchange tried, between the two renames: nothing there
            assert names == []
            with publish.output([out], overwrite=True, directory=True):
                assert os.listdir(out) == ["previous"]  # put back before the run goes on
        else:
            assert names in (["previous"], ["new"])
    assert kill_at_every_step(tmp_path, before, publishing, check) == 4


def test_a_live_writers_staging_is_left_alone_and_a_dead_ones_removed(models, tmp_path,
                                                                     caplog):
    """A writer's staging directory is named after its process id and start
    time: another run never removes a live writer's, removes a gone
    writer's, and tells a later process with a reused id apart."""
    sleeper = subprocess.Popen(["sleep", "60"])
    work = tmp_path / ".q.mxamp"
    work.mkdir()
    live = work / f"{sleeper.pid}-{publish._start_time(sleeper.pid)}-live"
    reused = work / f"{os.getpid()}-1-reused"  # this process's id, another start time
    for path in (live, reused):
        path.mkdir()
    publish_pair(tmp_path, models["a"][:2])
    assert live.exists() and not reused.exists()
    assert f"removed {reused}, left by a killed run" in caplog.text
    sleeper.kill()
    sleeper.wait()
    publish_pair(tmp_path, models["b"][:2])
    assert not live.exists()
    assert listing(tmp_path) == [".q.mxamp", "q-0000.params", "q-symbol.json"]


def test_a_pinned_version_stays_until_released(models, tmp_path):
    publish_pair(tmp_path, models["a"][:2])
    files = checkpoint.checkpoint_files(str(tmp_path / "q"), 0)
    with publish.pinned(files) as real:
        publish_pair(tmp_path, models["b"][:2])
        assert tuple(open(p, "rb").read() for p in real) == models["a"][:2]
        sym, args, _ = mx.model.load_checkpoint(real[0][:-len("-symbol.json")], 0)
    publish_pair(tmp_path, models["a"][:2])  # removes the version released meanwhile
    assert not os.path.exists(os.path.dirname(real[0]))
    assert listing(tmp_path) == [".q.mxamp", "q-0000.params", "q-symbol.json"]


def test_a_link_to_a_version_without_the_file_is_not_an_output(tmp_path):
    (tmp_path / ".q.mxamp" / "v-1-1-x").mkdir(parents=True)
    os.symlink("v-1-1-x", tmp_path / ".q.mxamp" / "current")
    os.symlink(".q.mxamp/current/q-symbol.json", tmp_path / "q-symbol.json")
    publish.refuse_existing([str(tmp_path / "q-symbol.json")], overwrite=False)
    (tmp_path / ".q.mxamp" / "v-1-1-x" / "q-symbol.json").write_text("{}")
    with pytest.raises(publish.OutputExists, match="q-symbol.json exists; pass --overwrite"):
        publish.refuse_existing([str(tmp_path / "q-symbol.json")], overwrite=False)


# ---- a reader while another process republishes -------------------------------------------

WRITER = textwrap.dedent("""
    import os, sys, time
    from mxamp.tools import checkpoint, publish
    directory, seconds = sys.argv[1], float(sys.argv[2])
    pairs = [[open(os.path.join(directory, f"{name}{suffix}"), "rb").read()
              for suffix in ("-symbol.json", "-0000.params")] for name in "ab"]
    files = checkpoint.checkpoint_files(os.path.join(directory, "q"), 0)
    count, end = 0, time.monotonic() + seconds
    print("started", flush=True)
    while time.monotonic() < end:
        with publish.output(files, overwrite=True, key="q") as staging:
            for path, data in zip(checkpoint.checkpoint_files(os.path.join(staging, "q"), 0),
                                  pairs[count % 2]):
                with open(path, "wb") as f:
                    f.write(data)
        count += 1
    print(count)
""")


def test_readers_see_one_pair_while_another_process_republishes(models, tmp_path):
    """A writer process publishes A and B in turn, as fast as it can, while
    this process loads in a loop: mxamp.load gives A's outputs or B's, never
    those of a mixed pair, and MXNet's loaders read a whole pair through
    publish.pinned. (Before, mxamp.load now and then gave the symbol of one
    and the params of the other, and its recovery completed the live
    writer's publishing under it, failing the writer.)"""
    for name in "ab":
        plain_pair(tmp_path, models[name][:2], name)
    publish_pair(tmp_path, models["a"][:2])
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "20"], env=ENV,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert writer.stdout.readline() == "started\n", writer.communicate()[1]
    files = checkpoint.checkpoint_files(str(tmp_path / "q"), 0)
    seen = {"a": 0, "b": 0}
    while writer.poll() is None:
        out = mxamp.load(str(tmp_path / "q"))(X).asnumpy()
        with publish.pinned(files) as (sym_file, params_file):
            sym, args, aux = mx.model.load_checkpoint(sym_file[:-len("-symbol.json")], 0)
            imported = mx.gluon.SymbolBlock.imports(sym_file, ["data"], params_file)
        # each read at its own time: each is one pair, A or B
        outs = [out, imported(X).asnumpy(),
                verify.run((sym, args, aux), {"data": X})[0].asnumpy()]
        for got in outs:
            name = next((n for n in "ab" if np.allclose(got, models[n][2], rtol=1e-6)), None)
            assert name is not None, "a loader read a model that is neither pair"
            seen[name] += 1
    stdout, stderr = writer.communicate()
    assert writer.returncode == 0, stderr
    assert int(stdout) > 50 and seen["a"] and seen["b"], (stdout, seen)
    # versions this process held when the writer replaced them stay (no
    # staging directory does); the next run removes them
    work = tmp_path / ".q.mxamp"
    left = set(os.listdir(work)) - {publish.CURRENT, os.readlink(work / publish.CURRENT)}
    assert all(n.startswith(publish.PUBLISHED) for n in left), left
    publish_pair(tmp_path, models["a"][:2])
    assert not left & set(os.listdir(work))
    assert listing(tmp_path)[:3] == [".q.mxamp", "a-0000.params", "a-symbol.json"]


def test_mxamp_load_while_mxamp_quantize_republishes(tiny, tmp_path):
    """The case as a user meets it: mxamp.load('q') in one process while
    `mxamp quantize --overwrite` republishes q, calibrated on other data each
    time. Every run exits 0, and every model the reader loaded gives the
    outputs of one of the published runs."""
    rng = np.random.default_rng(1)
    reader = textwrap.dedent(f"""
        import os, sys
        import numpy as np, mxnet as mx, mxamp
        x = mx.nd.array(np.load({str(tmp_path / 'x.npy')!r}))
        outputs = []
        while not os.path.exists({str(tmp_path / 'stop')!r}):
            outputs.append(mxamp.load({str(tmp_path / 'q')!r})(x).asnumpy())
        np.save({str(tmp_path / 'seen.npy')!r}, np.stack(outputs))
    """)
    np.save(tmp_path / "x.npy", X.asnumpy())
    published = []
    for run in range(4):
        np.save(tmp_path / f"c{run}.npy", rng.uniform(0, 1 + run, (4, 3, 8, 8)).astype("f4"))
        done = subprocess.run([sys.executable, "-m", "mxamp", "quantize", tiny, "--calib",
                               str(tmp_path / f"c{run}.npy"), "--calib-mode", "naive", "--out",
                               str(tmp_path / "q"), "--overwrite"], env=ENV,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        published.append(mxamp.load(str(tmp_path / "q"))(X).asnumpy())
        if run == 0:
            loading = subprocess.Popen([sys.executable, "-c", reader], env=ENV, text=True,
                                       stderr=subprocess.PIPE)
            time.sleep(3)
    (tmp_path / "stop").touch()
    _, stderr = loading.communicate(timeout=600)
    assert loading.returncode == 0, stderr
    seen = np.load(tmp_path / "seen.npy")
    assert len(seen) > 3
    for out in seen:
        assert any(np.allclose(out, p, rtol=0, atol=1e-6) for p in published)


def test_convert_over_a_quantized_output_takes_its_report_away(tiny, tmp_path):
    """`mxamp quantize --out q`, then `mxamp convert --out q --overwrite`: the
    INT8 report described the quantized model, so it goes with it; the new
    pair is the bfloat16 one and nothing else of the old output is left."""
    np.save(tmp_path / "c.npy", np.random.default_rng(0).uniform(0, 1, (4, 3, 8, 8)).astype("f4"))
    commands = [["quantize", tiny, "--calib", str(tmp_path / "c.npy"), "--calib-mode", "naive"],
                ["convert", tiny, "--dtype", "bfloat16", "--shape", "data:4,3,8,8",
                 "--overwrite"]]
    for command in commands:
        done = subprocess.run([sys.executable, "-m", "mxamp", *command, "--out",
                               str(tmp_path / "q")], env=ENV, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
    assert listing(tmp_path) == [".q.mxamp", "c.npy", "q-0000.params", "q-symbol.json"]
    assert mxamp.load(str(tmp_path / "q")).mxamp_format == "bfloat16"
