"""Publishing a command's output whole: every reader (mxamp's loader,
``mx.model.load_checkpoint``, ``SymbolBlock.imports``, a browser) finds the
previous output or the new one, after a kill at any step of a run.

A command writes its output in full into a staging directory inside a
hidden work directory beside it, ``PARENT/.NAME.mxamp/``, then publishes it
in one rename, through one transaction (:func:`output`) for both kinds of
output:

- **files** (a checkpoint pair, with the INT8 report beside it): each output
  name is a symbolic link ``NAME-symbol.json -> .NAME.mxamp/current/NAME-symbol.json``,
  and ``current`` a symbolic link to one version directory there.
  Publishing replaces ``current``: the files of a pair switch together, at
  the paths the user named. Files a run finds in place (written by another
  program) are first taken into a version of their own, then turned into
  links one at a time, each step showing the bytes it showed before.
- **a directory** (``--out DIR``) is exchanged with the previous one in one
  rename (``renameat2(RENAME_EXCHANGE)``). Where the file system lacks it,
  the old directory is renamed aside first and put back by the next run if
  the second rename never happened.

Published versions are never changed. The one a publishing replaces is
removed then, unless a reader holds it (:func:`pinned`: mxamp's loader
reads both files of a pair from one version this way); a later run removes
it. Staging directories are named after their writer's process id and
start time: a run removes those whose writer is gone, with a WARNING, and
never a live writer's. Writers take an exclusive lock on the output's
directory while they check and publish; readers take no lock there.
"""
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import secrets
import shutil

from . import signals

log = logging.getLogger(__name__)

WORK_SUFFIX = ".mxamp"
CURRENT = "current"
PUBLISHED = "v-"  # a version directory once published; staging ones lack it
ASIDE = "-aside"  # a directory renamed aside where exchanging is not supported
PIN_ATTEMPTS = 100


class OutputExists(ValueError):
    """An output is there already and --overwrite was not given."""


def work_dir(parent, name):
    """The hidden directory beside the output `name` where it is staged."""
    return os.path.join(parent, f".{name}{WORK_SUFFIX}")


def _link_text(work_name, name):
    return os.path.join(work_name, CURRENT, name)


def _our_link(path):
    """Whether `path` is a link into a work directory's current version."""
    if not os.path.islink(path):
        return False
    parts = os.readlink(path).split(os.sep)
    return len(parts) == 3 and parts[0].endswith(WORK_SUFFIX) and parts[1] == CURRENT


def present(path):
    """Whether something is at `path` for a reader: a link of ours whose
    version lacks the file (a run stopped before its first publishing)
    is not."""
    return os.path.exists(path) or (os.path.lexists(path) and not _our_link(path))


def refuse_existing(paths, overwrite):
    """OutputExists for an output already there without `overwrite`;
    ValueError where an output cannot go."""
    existing = [p for p in paths if present(p)]
    if existing and not overwrite:
        raise OutputExists(f"{existing[0]} exists; pass --overwrite to replace it")
    parent = os.path.dirname(os.path.abspath(paths[0]))
    while not os.path.lexists(parent):  # made when the results are written
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{parent} is not a directory; give an --out in one")


# ---- writers: who they are and whether they still run -------------------------------------

def _start_time(pid):
    """Process `pid`'s start time (clock ticks since boot), which tells it
    from a later process given the same id; '0' where /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return "0"


def _writer():
    """The name prefix of this process's staging directories."""
    return f"{os.getpid()}-{_start_time(os.getpid())}-"


def _alive(entry):
    """Whether the writer that named `entry` (PID-START-...) runs; entries
    named otherwise are not a writer's and are left alone."""
    pid, _, rest = entry.removeprefix(PUBLISHED).partition("-")
    start = rest.partition("-")[0]
    if not (pid.isdigit() and start.isdigit()):
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return start == "0" or _start_time(pid) in (start, "0")


# ---- file system steps ---------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD, _RENAME_NOREPLACE, _RENAME_EXCHANGE = -100, 1, 2
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)


def _renameat2(src, dst, flags):
    """Linux's renameat2 (os.rename has no flags)."""
    call = getattr(_libc, "renameat2", None)
    if call is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", src)
    if call(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src, None, dst)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync(path):
    """Flushes a file or directory to disk: a power cut after publishing
    finds the new output whole."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(top):
    for directory, _, names in os.walk(top):
        for name in names:
            if not os.path.islink(os.path.join(directory, name)):
                _fsync(os.path.join(directory, name))
        _fsync(directory)


def _new_dir(parent, prefix):
    """A new directory in `parent` named `prefix` and a random tail, with the
    mode the umask gives (readers of the output may be other users)."""
    while True:
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
            return path


def _link_or_copy(src, dst):
    """`dst` holding `src`'s bytes without a copy where the file system allows."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextlib.contextmanager
def _locked(directory):
    """An exclusive lock on `directory` while a run checks and publishes into
    it, so that concurrent runs cannot interleave those steps. An flock on
    the directory itself: no lock file is left behind, and the lock goes
    with the process."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---- versions ------------------------------------------------------------------------------

def _current(work):
    """The name of the version `work`'s ``current`` links to, or None."""
    try:
        return os.readlink(os.path.join(work, CURRENT))
    except (FileNotFoundError, OSError):
        return None


def _switch(work, version):
    """Points ``current`` at `version` in one rename."""
    temporary = os.path.join(work, f"{_writer()}current")
    with contextlib.suppress(FileNotFoundError):
        os.remove(temporary)
    os.symlink(version, temporary)
    os.replace(temporary, os.path.join(work, CURRENT))


def _link(path, work):
    """Makes `path` a link to its name in `work`'s current version, in one rename."""
    temporary = os.path.join(work, f"{_writer()}link")
    with contextlib.suppress(FileNotFoundError):
        os.remove(temporary)
    os.symlink(_link_text(os.path.basename(work), os.path.basename(path)), temporary)
    os.replace(temporary, path)


def _drop(path):
    """Removes a superseded version unless a reader holds it (:func:`pinned`);
    a later run removes a held one."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    else:
        shutil.rmtree(path)
    finally:
        os.close(fd)


def _clean(work, target):
    """Removes what runs that are gone left in `work`: staging directories
    (a WARNING each) and superseded versions; a directory set aside whose
    output `target` is missing is put back."""
    current = _current(work)
    for entry in sorted(os.listdir(work)):
        path = os.path.join(work, entry)
        if entry in (CURRENT, current):
            continue
        if entry.startswith(PUBLISHED):
            _drop(path)
        elif _alive(entry):
            continue
        elif entry.endswith(ASIDE) and not os.path.lexists(target):
            os.rename(path, target)
            log.warning("restored %s, which a killed run had set aside", target)
        else:
            _remove(path)
            log.warning("removed %s, left by a killed run", path)


# ---- publishing ----------------------------------------------------------------------------

@contextlib.contextmanager
def output(paths, overwrite=False, *, directory=False, key=None, gone=()):
    """Publishes a command's output whole: yields a staging directory that
    the block writes into; when the block ends without an error the output
    takes the previous one's place in one rename.

    The output is files in one directory (a checkpoint pair and what goes
    with it), published together: the block writes each under its base
    name; `key` names the work directory (``.KEY.mxamp``: the checkpoint's
    prefix). A file of `paths` the block does not write keeps its previous
    content; so does any other file an earlier run published there
    (another epoch's params), except those at `gone` (what describes an
    earlier output only, as an INT8 report), which go with the same rename.
    With `directory`, the output is the one directory at `paths`, which the
    block fills (a symbolic link there is replaced, not followed)."""
    if directory:
        path = os.path.abspath(os.path.normpath(paths[0]))  # "lnk/" would follow a link
        parent, key, paths = os.path.dirname(path), os.path.basename(path), [path]

        def commit(work, staging):
            _commit_directory(path, staging)
    else:
        parent = os.path.dirname(os.path.abspath(paths[0]))
        directories = [p for p in paths if os.path.isdir(p) and not os.path.islink(p)]
        if directories:
            raise ValueError(f"{directories[0]} is a directory; give --out a prefix for the "
                             "files")
        names = [os.path.basename(p) for p in paths]
        dropped = {os.path.basename(p) for p in gone}

        def commit(work, staging):
            _commit_files(parent, work, staging, names, dropped)
    with _transaction(parent, key, paths, overwrite, commit) as staging:
        yield staging


@contextlib.contextmanager
def _transaction(parent, key, paths, overwrite, commit):
    """What every publishing shares: `parent` made if missing (and removed
    again if the run fails); a staging directory in the work directory,
    after the leftovers of runs that are gone are removed there; at the
    end of the block `commit(work, staging)`, under the lock with the
    signals held, once `paths` are checked again (another run may have
    written them meanwhile). The staging directory goes however it ends."""
    refuse_existing(paths, overwrite)
    made = _make_parents(parent)
    work, staging = work_dir(parent, key), None
    try:
        with _locked(parent):
            os.makedirs(work, exist_ok=True)
            _clean(work, os.path.join(parent, key))
            staging = _new_dir(work, _writer())
        yield staging
        signals.safe_point()
        with _locked(parent), signals.held():
            refuse_existing(paths, overwrite)
            commit(work, staging)
    except BaseException:
        _discard(parent, work, staging, made)
        raise
    _discard(parent, work, staging, [])


def _make_parents(parent):
    """Makes `parent` and the directories above it that are missing; returns
    those it made, innermost first."""
    made, missing = [], os.path.abspath(parent)
    while not os.path.isdir(missing):
        made.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(parent, exist_ok=True)
    return made


def _discard(parent, work, staging, made):
    """Removes the staging directory, the work directory if nothing else is
    in it, and the directories `made` (each empty unless another run wrote)."""
    if staging:
        shutil.rmtree(staging, ignore_errors=True)
    if os.path.isdir(parent):
        with _locked(parent), contextlib.suppress(OSError):
            os.rmdir(work)
    for created in made:
        with contextlib.suppress(OSError):
            os.rmdir(created)


def _commit_files(parent, work, staging, names, dropped):
    """The staged files become `work`'s current version, the previous
    version's other files carried over but for `dropped`, each of `names` a
    link into it, and the links of `dropped` removed."""
    _adopt(parent, work, names)
    previous = _current(work)
    if previous:
        _carry_over(os.path.join(work, previous), staging, skip=dropped)
    _fsync_tree(staging)
    version = os.path.join(work, PUBLISHED + os.path.basename(staging))
    os.rename(staging, version)
    for name in names:  # new names: links that find nothing until the switch
        path = os.path.join(parent, name)
        if os.path.lexists(os.path.join(version, name)) and not _links_into(path, work):
            _link(path, work)
    _switch(work, os.path.basename(version))
    for name in dropped:  # they found nothing since the switch
        if _links_into(os.path.join(parent, name), work):
            os.remove(os.path.join(parent, name))
    _fsync(work)
    _fsync(parent)
    if previous:
        _drop(os.path.join(work, previous))


def _adopt(parent, work, names):
    """Files at `names` that are not links into `work` (another program's,
    or written before this layout) go into a version of their own, and then
    each becomes a link into it: every step shows each name the bytes it
    showed before."""
    foreign = [n for n in names if os.path.lexists(os.path.join(parent, n))
               and not _links_into(os.path.join(parent, n), work)]
    if not foreign:
        return
    previous = _current(work)
    version = _new_dir(work, PUBLISHED + _writer())
    if previous:
        _carry_over(os.path.join(work, previous), version)
    for name in foreign:
        path, kept = os.path.join(parent, name), os.path.join(version, name)
        _remove(kept)
        if os.path.isfile(path):  # a dangling link has no bytes to keep
            _link_or_copy(path, kept)
    _fsync_tree(version)
    _switch(work, os.path.basename(version))
    for name in foreign:
        _link(os.path.join(parent, name), work)
    if previous:
        _drop(os.path.join(work, previous))


def _carry_over(version, staging, skip=()):
    for entry in os.listdir(version):
        if entry not in skip and not os.path.lexists(os.path.join(staging, entry)):
            _link_or_copy(os.path.join(version, entry), os.path.join(staging, entry))


def _links_into(path, work):
    return os.path.islink(path) and os.readlink(path) == _link_text(
        os.path.basename(work), os.path.basename(path))


def _commit_directory(path, staging):
    """The staged directory takes `path`'s place; the previous one is removed."""
    _fsync_tree(staging)
    if not os.path.lexists(path):
        os.rename(staging, path)
    else:
        try:
            _renameat2(staging, path, _RENAME_EXCHANGE)
        except OSError as err:
            if err.errno not in _UNSUPPORTED:
                raise
            os.rename(path, staging + ASIDE)  # the next run puts it back if killed here
            os.rename(staging, path)
            staging += ASIDE
    _fsync(os.path.dirname(path))
    _remove(staging)  # the previous output


# ---- readers -------------------------------------------------------------------------------

@contextlib.contextmanager
def pinned(paths):
    """The files `paths` as published now: yields their real paths, all in
    one version, which no run removes until the block ends (one publishing
    meanwhile leaves it to a later run). Paths that are not links into a
    work directory are yielded as they are. This is how mxamp's loader reads
    a pair whole while another run republishes it; MXNet's loaders read a
    pair whole this way too (``with pinned(files) as (sym, params):``)."""
    real, fd = _pin(paths)
    try:
        yield real
    finally:
        if fd is not None:
            os.close(fd)


def _pin(paths):
    """(real paths, fd holding their version's shared lock or None)."""
    for _ in range(PIN_ATTEMPTS):
        real = [os.path.realpath(p) for p in paths]
        versions = {os.path.dirname(r) for r in real if _is_version(os.path.dirname(r))}
        if not versions:
            return list(paths), None
        if len(versions) > 1:
            continue  # republished between two of the paths
        version = versions.pop()
        try:
            fd = os.open(version, os.O_RDONLY)
        except FileNotFoundError:
            continue  # superseded and removed since
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(version)):
                return [r if _is_version(os.path.dirname(r)) else p
                        for r, p in zip(real, paths)], fd
        os.close(fd)
    raise OSError(errno.EAGAIN, f"{paths[0]} was republished {PIN_ATTEMPTS} times while "
                  "it was being read")


def _is_version(path):
    return os.path.basename(path).startswith(PUBLISHED) and \
        os.path.basename(os.path.dirname(path)).endswith(WORK_SUFFIX)
