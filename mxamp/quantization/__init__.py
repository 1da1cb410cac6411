"""INT8 post-training quantization on mxamp's oneDNN 3 backend, a drop-in for
``mxnet.contrib.quantization``: calibration inputs (``data``), per-tensor
thresholds (``calibrate``) and the API (``api``)."""
from .api import quantize_model, quantize_model_mkldnn, quantize_net, quantize_net_v2
from .tune import Int8TuneResult, tune_int8

__all__ = ["quantize_model", "quantize_model_mkldnn", "quantize_net", "quantize_net_v2",
           "tune_int8", "Int8TuneResult"]
