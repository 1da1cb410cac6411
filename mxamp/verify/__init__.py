"""Accuracy: running a converted model on any machine (low-precision kernels
emulated), comparing it with its float32 original, and the accuracy-guided
search over which nodes may run in low precision (:func:`mxamp.tune`)."""
from .compare import (SELECTION_OPS, after_selection, compare, feeds_for, missing_kernels,
                      pre_selection_errors, relative_error, run, selection_errors)
from .emulate import emulated, no_graph_fusion, run_emulated
from .tune import TuneResult, tune

__all__ = ["SELECTION_OPS", "after_selection", "compare", "feeds_for", "missing_kernels",
           "pre_selection_errors", "relative_error", "run", "selection_errors", "emulated",
           "no_graph_fusion", "run_emulated", "TuneResult", "tune"]
