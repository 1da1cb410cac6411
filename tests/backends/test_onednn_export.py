"""Exporting the blocks mxamp makes (converted, on the backend, INT8) before
their first call: MXNet 1.9.1's export reads the parameters from the cached
op, which exists only once a block has run, and wrote a params file holding
none, which mxamp.load took and whose first call failed. The export holds
every parameter and loads into a block computing what the original does."""
import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxamp
from isa import needs, require_onednn3
from mxamp import quantization

require_onednn3()


def _net():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.GlobalAvgPool2D(), nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 3, 8, 8)))
    net(x)
    return net, x


MAKERS = {
    "converted": lambda net, x: mxamp.convert_hybrid_block(net, target_dtype="bfloat16"),
    "backend": lambda net, x: mxamp.gluon.apply_backend_block(net, compute="float32"),
    "int8": lambda net, x: quantization.quantize_net_v2(net, calib_data=[x],
                                                        calib_mode="naive"),
}


@pytest.mark.parametrize("kind", [pytest.param("converted", marks=pytest.mark.cpu),
                                  pytest.param("backend", marks=pytest.mark.cpu),
                                  pytest.param("int8", marks=needs("avx2"))])
def test_a_block_exported_before_its_first_call_loads_and_runs(kind, tmp_path):
    net, x = _net()
    block = MAKERS[kind](net, x)
    block.export(str(tmp_path / kind))
    saved = mx.nd.load(str(tmp_path / f"{kind}-0000.params"))
    names = {p.name for p in block.collect_params().values()}
    assert {k.split(":", 1)[1] for k in saved} == names and names
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{kind}-0000.params",
                                                         f"{kind}-symbol.json"]
    loaded = mxamp.load(str(tmp_path / kind))
    np.testing.assert_array_equal(loaded(x).asnumpy(), block(x).asnumpy())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_conversion_saved_without_its_casts_loads_as_float32(dtype, tmp_path, caplog):
    """mx.model.save_checkpoint (Symbol.save) drops amp_cast nodes: the
    marker stays but the graph computes float32, which mxamp.load names;
    saved with its casts, the conversion is named by its dtype."""
    net, x = _net()
    sym, args, aux = mxamp.convert_model(*mxamp.gluon.model_of(net, "saving it")[:3],
                                         target_dtype=dtype)
    mx.model.save_checkpoint(str(tmp_path / "dropped"), 0, sym, args, aux)
    loaded = mxamp.load(str(tmp_path / "dropped"))
    assert loaded.mxamp_format == "float32"
    np.testing.assert_array_equal(loaded(x).asnumpy(), net(x).asnumpy())
    assert f"the graph carries mxamp's {dtype} marker but no cast to {dtype}" in caplog.text
    mx.model.save_checkpoint(str(tmp_path / "kept"), 0, sym, args, aux, remove_amp_cast=False)
    assert mxamp.load(str(tmp_path / "kept")).mxamp_format == dtype
