"""What published outputs look like on disk, for the command-line tests."""
import os
import shutil

from mxamp.tools import publish


def listing(directory):
    """The sorted names in `directory`. A work directory there (.NAME.mxamp,
    where files are published) must hold only ``current`` and the version
    it names: no staging directory or superseded version left behind."""
    names = sorted(os.listdir(directory))
    for name in names:
        if name.endswith(publish.WORK_SUFFIX):
            work = os.path.join(directory, name)
            current = os.readlink(os.path.join(work, publish.CURRENT))
            assert sorted(os.listdir(work)) == sorted([publish.CURRENT, current]), work
    return names


# What publishing changes on disk; each call is one step (shutil.rmtree's own
# removals inside it are not counted apart).
CHANGES = [(os, name) for name in ("rename", "replace", "remove", "unlink", "rmdir", "symlink",
                                   "link", "mkdir")]
CHANGES += [(shutil, "rmtree"), (shutil, "copy2"), (publish, "_renameat2")]


def signal_at_step(step, signum):
    """From now on, this process sends itself `signum` at the `step`-th file
    system change (0: the first) that publishing's commit makes: at exactly
    that point of a publishing, whatever the speed of the machine."""
    calls, depth = [0], [0]

    def counted(original):
        def call(*args, **kwargs):
            if depth[0] == 0:
                if calls[0] == step:
                    os.kill(os.getpid(), signum)
                calls[0] += 1
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        return call

    def hooked(commit):
        def run(*args):
            saved = [(module, name, getattr(module, name)) for module, name in CHANGES]
            for module, name, original in saved:
                setattr(module, name, counted(original))
            try:
                return commit(*args)
            finally:
                for module, name, original in saved:
                    setattr(module, name, original)
        return run

    for name in ("_commit_files", "_commit_directory"):
        setattr(publish, name, hooked(getattr(publish, name)))
