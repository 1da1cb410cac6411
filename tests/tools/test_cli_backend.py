"""`mxamp convert --backend onednn`: the conversion planned for the backend,
partitioned, written, reloaded and run against float32."""
import json

import mxnet as mx
import pytest
from click.testing import CliRunner

from mxamp import cpu
from mxamp.backends import onednn
from mxamp.tools.cli import main

SHAPE = ["--shape", "data:1,3,8,8"]


@pytest.mark.cpu
def test_convert_for_the_backend_writes_one_region(tiny, tmp_path):
    """The tiny Conv -> BatchNorm -> relu -> pool -> Dense is one region; its
    error against float32 is bfloat16's (3e-2), or float32's where oneDNN 3
    has no bfloat16 (float32 regions)."""
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", tiny, "--dtype", "bfloat16", *SHAPE,
                                       "--backend", "onednn", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["operators"] == {"backend regions": 1, "on MXNet": 0}
    sym = mx.sym.load(f"{out}-symbol.json")
    assert [n["op"] for n in json.loads(sym.tojson())["nodes"] if n["op"] != "null"] == \
        [onednn.REGION_OP]
    assert summary["errors"][0] < (3e-2 if cpu.features("onednn").bf16 else 1e-5)


def test_convert_for_the_backend_refuses_float16(tiny, tmp_path):
    result = CliRunner().invoke(main, ["convert", tiny, "--dtype", "float16", *SHAPE,
                                       "--backend", "onednn", "--out", str(tmp_path / "o")])
    assert result.exit_code != 0
    assert "backend 'onednn' runs bfloat16 models; got target_dtype='float16'" in result.output
    assert not list(tmp_path.iterdir())
