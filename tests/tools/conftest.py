import pytest

from graphs import tiny_net


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Prefix of an exported float32 Conv -> BatchNorm -> relu -> pool -> Dense
    (graphs.tiny_net) that the command-line tests convert."""
    prefix = str(tmp_path_factory.mktemp("model") / "tiny")
    tiny_net().export(prefix)
    return prefix
