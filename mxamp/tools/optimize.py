"""One call that picks the fastest way to run a Gluon model on this CPU
within an error budget: :func:`optimize`.

It builds the candidates mxamp offers (float32 on the oneDNN backend,
bfloat16 on MXNet's kernels and on the backend, INT8 with the rest in float32
or bfloat16), measures each on the CPU at hand, interleaved round by round so
that a busy machine slows all alike, and returns the fastest whose error is
within the budget, with the table it measured.
"""
import dataclasses
import logging
import numbers
import statistics
import time

from mxnet.base import MXNetError

from .. import cpu, quantization
from ..errors import OptionError, OptionTypeError, mxnet_logs_to_logging, mxnet_message
from ..gluon import apply_backend_block, convert_hybrid_block, model_of
from ..quantization import data
from ..quantization.tune import eval_metric
from ..verify import relative_error

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Candidate:
    """One way to run the model: its block (None when it could not be built
    here, `note` says why), median milliseconds per calibration batch, and
    its error (relative L2 error of the outputs against float32, or the
    accuracy drop ``eval_fn`` measured)."""
    name: str
    block: object = None
    ms: float = None
    error: float = None
    note: str = ""


@dataclasses.dataclass
class OptimizeResult:
    """What :func:`mxamp.optimize` chose, and every candidate it measured.

    Attributes
    ----------
    name : str
        The chosen candidate: ``"float32"``, ``"float32 backend"``,
        ``"bfloat16"``, ``"bfloat16 backend"``, ``"int8"`` or
        ``"int8 + bfloat16"``.
    block : mxnet.gluon.HybridBlock
        Its block, ready to call.
    candidates : list
        Every candidate, with its time, its error and, where it could not be
        built here, why.
    max_error : float
        The budget it was chosen within.
    error_name : str
        What the error is: ``"rel. error"`` or ``"accuracy drop"``.
    """
    name: str
    block: object
    candidates: list
    max_error: float
    error_name: str

    def table(self):
        """The measurements as a text table, the chosen row marked.

        Returns
        -------
        str
        """
        base = next(c.ms for c in self.candidates if c.name == "float32")
        lines = [f"  {'candidate':18}{'ms/batch':>10}{'vs fp32':>9}{self.error_name:>14}  note",
                 "-" * 70]
        for c in self.candidates:
            mark = "* " if c.name == self.name else "  "
            if c.block is None:
                lines.append(f"{mark}{c.name:18}{'-':>10}{'-':>9}{'-':>14}  {c.note}")
                continue
            lines.append(f"{mark}{c.name:18}{c.ms:10.2f}{base / c.ms:8.2f}x{c.error:14.2e}  "
                         f"{c.note}")
        lines.append(f"* the fastest with {self.error_name} <= {self.max_error:g}; "
                     f"CPU: {cpu.describe()}")
        return "\n".join(lines)


def _outputs(block, inputs):
    out = block(*inputs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for o in outs:
        o.wait_to_read()
    return outs


def _builders(net, batches):
    """(name, build or the reason it cannot run here) per candidate."""
    mxnet_bf16, onednn = cpu.mxnet_has_bfloat16(), cpu.features("onednn")

    def bf16_backend():  # planned for the backend: what it runs is bfloat16, timed here
        return convert_hybrid_block(net, target_dtype="bfloat16", backend="onednn",
                                    backend_compute="bfloat16")

    def int8(rest_dtype):  # what stays out of INT8 in rest_dtype
        return quantization.quantize_net_v2(net, calib_data=batches, calib_mode="naive",
                                            rest_dtype=rest_dtype)
    return [
        ("float32", lambda: net),
        ("float32 backend", lambda: apply_backend_block(net, compute="float32")),
        ("bfloat16", (lambda: convert_hybrid_block(net, target_dtype="bfloat16")) if mxnet_bf16
         else "MXNet has no bfloat16 kernels on this CPU (AVX-512 needed)"),
        ("bfloat16 backend", bf16_backend if onednn.bf16
         else "oneDNN 3 has no bfloat16 instructions on this CPU (AVX512-BF16 or AMX)"),
        ("int8", lambda: int8("float32")),
        ("int8 + bfloat16", (lambda: int8("bfloat16")) if onednn.bf16
         else "oneDNN 3 has no bfloat16 instructions on this CPU (AVX512-BF16 or AMX)"),
    ]


def _time(candidates, inputs, runs, progress):
    """Median milliseconds per forward of each built candidate; the order
    rotates every round so drift hits every candidate alike."""
    live = [c for c in candidates if c.block is not None]
    times = {c.name: [] for c in live}
    # the first round warms up
    for round_index in data.with_progress(range(runs + 1), progress, "timing", "round"):
        shift = round_index % len(live)
        for c in live[shift:] + live[:shift]:
            started = time.perf_counter()
            _outputs(c.block, inputs)
            if round_index:
                times[c.name].append(time.perf_counter() - started)
    for c in live:
        c.ms = 1e3 * statistics.median(times[c.name])


def _check_options(max_error, eval_fn, runs):
    if isinstance(max_error, bool) or not isinstance(max_error, numbers.Real) or \
            not max_error >= 0:
        raise OptionError(f"max_error must be a number >= 0, got {max_error!r}")
    if eval_fn is not None and not callable(eval_fn):
        raise OptionTypeError(f"eval_fn must be callable (block -> accuracy), "
                              f"got {type(eval_fn).__name__}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise OptionError(f"runs must be an integer >= 1, got {runs!r}")


def _candidate(name, build, net, inputs, reference, eval_fn, score):
    """The candidate `name` built (`build`: a function, or why there is none)
    and its error against `net`'s `reference` outputs, or `score`."""
    candidate = Candidate(name)
    if isinstance(build, str):
        candidate.note = build
        return candidate
    try:
        candidate.block = build()
        outs = _outputs(candidate.block, inputs)
    except (MXNetError, RuntimeError, OptionError) as err:
        candidate.block = None
        text = mxnet_message(err) if isinstance(err, MXNetError) else str(err)
        candidate.note = f"failed: {text.splitlines()[0]}"
        return candidate
    if candidate.block is net:
        candidate.error = 0.0  # the reference itself, whatever eval_fn's noise
    else:
        candidate.error = score - eval_metric(eval_fn, candidate.block) if eval_fn else \
            max(relative_error(o, r) for o, r in zip(outs, reference))
    return candidate


def _measured(net, batches, eval_fn, runs, progress):
    """Every candidate built, its error against `net` and its time on the
    first batch measured (a candidate that cannot be built here says why)."""
    inputs = batches[0][:len(model_of(net, "optimizing it")[3])]
    reference = _outputs(net, inputs)
    score = eval_metric(eval_fn, net) if eval_fn else None
    candidates = []
    builders = data.with_progress(_builders(net, batches), progress, "candidates", "candidate")
    for name, build in builders:
        if progress:
            builders.set_postfix_str(name)
        candidates.append(_candidate(name, build, net, inputs, reference, eval_fn, score))
    _time(candidates, inputs, runs, progress)
    return candidates


@mxnet_logs_to_logging()
def optimize(net, calib_data, max_error=0.05, eval_fn=None, runs=5, progress=False):
    """The fastest of mxamp's ways to run a Gluon block on this CPU, within an error budget.

    Builds the candidates the CPU can run (float32 on MXNet and on the oneDNN
    backend, bfloat16 on MXNet's kernels and on the backend, INT8 with naive
    calibration, INT8 with the rest in bfloat16), times them interleaved
    round by round on the first calibration batch, and returns the fastest
    whose error is within `max_error`. Float32 (`net` itself) is the answer
    when nothing else is.

    Parameters
    ----------
    net : mxnet.gluon.HybridBlock
        The float32 block. One that has not run is hybridized and run on the
        first calibration batch while the candidates are made, and put back
        as it was: it is not modified.
    calib_data : mxnet.gluon.data.DataLoader or mxnet.io.DataIter or list
        Calibrates INT8; its first batch is what every candidate is timed and
        compared on.
    max_error : float
        The budget: the largest relative L2 error of the outputs against
        float32 on that batch, or with `eval_fn` the largest accuracy drop.
    eval_fn : callable, optional
        ``eval_fn(block)`` returns an accuracy (higher is better).
    runs : int
        Timed rounds, after one warm-up round.
    progress : bool
        Progress bars of the candidates built and of the timing rounds on
        stderr.

    Returns
    -------
    OptimizeResult
        ``result.block`` is the chosen block, ``result.table()`` what was
        measured (also logged at INFO).

    Raises
    ------
    mxamp.OptionError, mxamp.OptionTypeError
        For an invalid budget, `runs` or `eval_fn`, or no calibration data.
    """
    _check_options(max_error, eval_fn, runs)
    batches = data.batches_of(calib_data)
    batches = None if batches is None else list(batches)
    if not batches:
        raise OptionError("no calibration data: pass calib_data (at least one batch)")
    # a block that has not run is traced for as long as its candidates are
    # built and timed: each is made from its cached graph
    with data.traced(net, batches[0], None):
        candidates = _measured(net, batches, eval_fn, runs, progress)
    fits = [c for c in candidates if c.block is not None and c.error <= max_error]
    best = min(fits, key=lambda c: c.ms)  # float32 always fits (error 0)
    result = OptimizeResult(best.name, best.block, candidates, max_error,
                            "accuracy drop" if eval_fn else "rel. error")
    log.info("mxamp.optimize:\n%s", result.table())
    return result
