"""errors.mxnet_message on error texts MXNet really produces: the line
saying what went wrong, without traceback headers, source frames, stack
traces or repeated "MXNetError:" tags."""
import json
import re

import mxnet as mx
import pytest
from mxnet.base import MXNetError

from mxamp.errors import mxnet_message


def _raised(action):
    with pytest.raises(MXNetError) as err:
        action()
    return err.value


def test_path_error_has_no_traceback_header(tmp_path):
    """A file that cannot be written (here: in a missing directory; also a
    read-only one) is a bare "Traceback (most recent call last):" block."""
    err = _raised(lambda: mx.nd.save(str(tmp_path / "no" / "x.params"), {"a": mx.nd.ones(1)}))
    assert str(err).startswith("Traceback (most recent call last):\n  File \"")
    assert mxnet_message(err) == (f'LocalFileSystem: Check failed: allow_null: :Open '
                                  f'"{tmp_path / "no" / "x.params"}": No such file or directory')


def test_node_without_inputs():
    graph = {"nodes": [{"op": "null", "name": "x"}, {"op": "relu", "name": "r"}],
             "heads": [[1, 0, 0]], "arg_nodes": [0]}
    err = _raised(lambda: mx.sym.load_json(json.dumps(graph)))
    assert mxnet_message(err) == ('JSONReader: Check failed: visited.count(it->first) != 0U '
                                  '(0 vs. 0) : Missing field "inputs"')


def test_tagged_line_after_a_source_frame(tmp_path):
    path = tmp_path / "short.params"
    path.write_bytes(b"\x12\x01\x00\x00\x00\x00\x00\x00abc")
    err = _raised(lambda: mx.nd.load(str(path)))
    assert mxnet_message(err) == "Check failed: fi->Read(&reserved): Invalid NDArray file format"


def test_operator_error_keeps_its_text_without_time_and_source_line():
    """MXNet puts its check's time and C++ file inside the message:
    "Error in operator fc: [21:57:16] ../src/io/../operator/elemwise_op_common.h:NN: ..."."""
    sym = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=2, name="fc")
    err = _raised(lambda: sym.infer_type(x="float32", fc_weight="float16"))
    assert re.search(r"Error in operator fc: \[\d\d:\d\d:\d\d\] \S+\.h:\d+: ", str(err))
    assert mxnet_message(err) == ("Error in operator fc: Check failed: assign(&dattr, "
                                  "vec.at(i)): Incompatible attr in node fc at 1-th input: "
                                  "expected float32, got float16")


def test_repeated_tag_and_stack_trace_are_stripped():
    """A message raised again inside another MXNetError carries the tag twice;
    builds with stack traces add "Stack trace:" and "[bt]" lines."""
    inner = _raised(lambda: mx.nd.ones((2, 3)).reshape((4, 4)))
    wrapped = MXNetError(f"MXNetError: MXNetError: {mxnet_message(inner)}\nStack trace:\n"
                         "  [bt] (0) /usr/lib/libmxnet.so(+0x1234) [0x7f00]")
    assert mxnet_message(wrapped) == ("NDArray.Reshape: Check failed: shape_.Size() >= "
                                      "shape.Size() (6 vs. 16) : target shape size is larger "
                                      "than the current shape")


def test_empty_message_names_the_type():
    assert mxnet_message(MXNetError("")) == "MXNetError"


def test_zoo_failure_names_the_error_once():
    """resnet50_v1b_gn's GroupNorm emits a Reshape MXNet 1.9.1 rejects; the
    zoo report said "MXNetError: MXNetError: Invalid Parameter format ..."."""
    from mxamp.tools import zoo
    (result,) = zoo.run_model("resnet50_v1b_gn", ["bfloat16"], shape=(1, 3, 32, 32))
    assert result["failed_in"] == "float32"
    assert result["error"].startswith("MXNetError: Invalid Parameter format for keep_highest "
                                      "expect boolean but value='-1', in operator Reshape(")
