"""Test marks derived from mxamp.cpu, the one answer to what this CPU can do."""
import pytest

from mxamp import cpu


def needs(feature, engine="onednn"):
    """Marks a test that needs `feature` (a name in mxamp.cpu.FEATURES) of
    `engine`'s kernels ("mxnet" or "onednn"): it runs among the CPU-sensitive
    tests and skips, naming the feature, where the CPU or the ISA limit lacks it."""
    have = cpu.features(engine)
    reason = f"needs {feature} in {engine}'s kernels; this CPU offers: {have}"
    return [pytest.mark.cpu, pytest.mark.skipif(not getattr(have, feature), reason=reason)]
