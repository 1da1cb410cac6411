"""Conversion: the decision walk over a graph (with device probing), the
wire format to the C++ pass that inserts the casts, the options every entry
point builds (ConversionOptions), and the public convert_symbol /
convert_model / convert_bucketing_module."""
from .api import convert_bucketing_module, convert_model, convert_symbol
from .marker import MARKER, converted_dtype, unconverted

__all__ = ["convert_symbol", "convert_model", "convert_bucketing_module", "MARKER",
           "converted_dtype", "unconverted"]
