"""Test marks derived from mxamp.cpu, the one answer to what this CPU can do,
and from what mxamp.native finds installed."""
import pytest

from mxamp import cpu, native


def needs(feature, engine="onednn"):
    """The marks of a test that needs `feature` (a name in mxamp.cpu.FEATURES)
    of `engine`'s kernels ("mxnet" or "onednn"): it is CPU-sensitive (rerun
    under ISA limits) and skips, naming the feature, where the CPU or the
    limit lacks it. Use as a decorator, or as ``pytest.param(..., marks=...)``."""
    have = cpu.features(engine)
    reason = f"needs {feature} in {engine}'s kernels; this CPU offers: {have}"
    return _Marks([pytest.mark.cpu, pytest.mark.skipif(not getattr(have, feature), reason=reason)])


def require_onednn3():
    """Skips the calling test module where the oneDNN 3 packages the
    backend builds against are not installed."""
    try:
        native.onednn_prefix()
    except RuntimeError:
        pytest.skip("oneDNN 3 packages not installed", allow_module_level=True)


class _Marks(list):
    def __call__(self, test):
        for mark in self:
            test = mark(test)
        return test
