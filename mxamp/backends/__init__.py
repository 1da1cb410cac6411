"""Execution backends for converted models, looked up by name: a backend's
module (and its native library) loads only when a conversion asks for it."""
import importlib

from ..errors import OptionError

NAMES = ("onednn",)


def get(name):
    """The backend module of a name, its library loaded.

    Parameters
    ----------
    name : str or None
        ``"onednn"`` (:mod:`mxamp.backends.onednn`), or None for no backend.

    Returns
    -------
    module or None

    Raises
    ------
    mxamp.OptionError
        For a name that is no backend.
    """
    if name is None:
        return None
    check(name)
    module = importlib.import_module(f".{name}", __name__)
    module.load()
    return module


def check(name):
    """Checks a backend's name without loading anything.

    Parameters
    ----------
    name : str or None
        ``"onednn"``, or None for no backend.

    Raises
    ------
    mxamp.OptionError
        For a name that is no backend.
    """
    if name is not None and name not in NAMES:
        raise OptionError(f"backend must be None or {' or '.join(map(repr, NAMES))}, "
                          f"got {name!r}")
