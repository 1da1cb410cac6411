"""INT8 post-training quantization on mxamp's oneDNN 3 backend, a drop-in for
``mxnet.contrib.quantization``: calibration inputs (``data``), per-tensor
thresholds (``calibrate``), MXNet's own INT8 graph format (``mxnet_format``)
and the API (``api``), which also has the reference's lower-level helpers."""
# The reference's private helpers too: MXNet's own tests call them.
from .api import (_calibrate_quantized_sym, _get_optimal_threshold,  # noqa: F401
                  _get_optimal_thresholds, _quantize_params, _quantize_symbol,
                  _smooth_distribution, calib_graph, combine_histogram, quantize_graph,
                  quantize_model, quantize_model_mkldnn, quantize_net, quantize_net_v2)
from .tune import Int8TuneResult, tune_int8

__all__ = ["calib_graph", "combine_histogram", "quantize_graph", "quantize_model",
           "quantize_model_mkldnn", "quantize_net", "quantize_net_v2",
           "tune_int8", "Int8TuneResult"]
