"""Runs an ONNX model in OpenVINO and ONNX Runtime on request, in float32 or
bfloat16 as given, or quantized to INT8 by each engine's own post-training
quantization (NNCF for OpenVINO, quantize_static for ONNX Runtime).

The outside anchors of bench/bf16_speed.py and bench/int8_speed.py. This
script runs in its own virtual environment (bench/requirements-anchor.txt;
none of these packages is a dependency of mxamp) as a child process of the
benchmark, which drives it with one JSON request per line on stdin and reads
one JSON answer per line on stdout, so that its timings interleave with the
MXNet ones round by round. Runners are named; a request replaces the runners
it names and keeps the others, and every runner runs the latest "input":

    {"cmd": "load", "onnx": PATH, "input": NPY, "threads": 2, "out_dir": DIR,
     "runtimes": ["openvino-bf16", "openvino-fp32", "onnxruntime-fp32"]}
        -> {"ok": true, "load_s": {runner: s}, "outputs": {runner: NPY},
            "versions": {runner: "..."}, "errors": {runner: "..."}}
    {"cmd": "quantize", "onnx": PATH, "input": NPY, "calib": NPY, "threads": 2,
     "out_dir": DIR, "runtimes": ["openvino-int8", "onnxruntime-int8"],
     "transformer": false, "vnni": true}
        -> the same, and "calib_s": {runner: s} (the quantization's time)
    {"cmd": "time", "runtime": "openvino-int8", "calls": 10}
        -> {"ok": true, "wall": 0.21, "cpu": 0.4}
        (seconds per call of "calls" calls back to back, default 1: wall-clock,
        and this process's CPU time)
    {"cmd": "profile", "runtime": "openvino-int8", "calls": 5}
        -> {"ok": true, "layers": {"<node type> <kernel>": [count, ms]}, "sums":
            {"calls", "layers", "min_ms", "median_ms", "cpu_ms"}} per call, each
           layer at its fastest call (OpenVINO's PERF_COUNT counters; OpenVINO
           runners only)
    {"cmd": "quit"}

"calib" holds the calibration batches stacked, shape (batches, *input shape);
each runtime calibrates on all of them:

  openvino-int8     nncf.quantize on the model OpenVINO reads from the ONNX
                    file (default preset and min-max statistics, subset_size =
                    the batches, model_type=TRANSFORMER when "transformer"),
                    compiled with INFERENCE_PRECISION_HINT=f32 so the layers
                    NNCF leaves float run in float32 on any CPU
  onnxruntime-int8  onnxruntime.quantization.quant_pre_process, then
                    quantize_static: QDQ format, per_channel=True, min-max
                    calibration, u8 activations and s8 weights (ONNX
                    Runtime's fast path on x86: its default s8 activations
                    ran no faster than float32 on an AVX2 CPU), and
                    reduce_range (7-bit weights) where the CPU has no VNNI
                    ("vnni": false; the caller asks mxamp.cpu, this venv has no mxamp),
                    as ONNX Runtime's documentation advises against
                    vpmaddubsw's saturation (NNCF's overflow fix and mxamp's
                    backend do the same there)

MXNet's exporter lists the weights among the graph's inputs, which keeps ONNX
Runtime from folding them as constants (BatchNorm stays unfused, and the
quantizer sees BatchNorm's scale as a weight): every request first takes
them out of the inputs (the fix ONNX Runtime's warning names), into a copy
of the file that all runners read.

A runner that fails is reported in "errors" and left out; any other failure
answers {"ok": false, "error": "..."} and the process goes on. Anything the
libraries print goes to stderr: stdout carries the answers only.
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# NNCF's telemetry is off in CI jobs (disable_in_ci): a benchmark is one.
os.environ.setdefault("CI", "true")


def without_initializer_inputs(path, out_dir):
    """A copy of the ONNX file at `path` whose graph inputs hold no initializer."""
    import onnx

    model = onnx.load(str(path))
    weights = {init.name for init in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in weights]
    if len(inputs) == len(model.graph.input):
        return path
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    cleaned = Path(out_dir) / f"{Path(path).stem}-weights-not-inputs.onnx"
    if not cleaned.exists():  # a load and a quantize request on the same file
        onnx.save(model, str(cleaned))
    return cleaned


def openvino_compiled(model, threads, precision):
    import openvino as ov

    core = ov.Core()
    if isinstance(model, (str, Path)):
        model = core.read_model(str(model))
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
              "PERFORMANCE_HINT": "LATENCY"}
    request = core.compile_model(model, "CPU", config).create_infer_request()

    def run(x):
        request.infer({0: x})
        return request.get_output_tensor(0).data.copy()

    def profile(x, calls):
        """OpenVINO's own per-layer counters (PERF_COUNT) over `calls` calls,
        compiled apart so that the timed request runs without them: each
        layer at its fastest call (matched by name; preemption only adds
        time), summed per "<layer type> <kernel>" as [count, ms], and the
        sums of the layers' minimum and median times against the fastest CPU
        time of as many calls without the counters, one after each."""
        profiled = core.compile_model(model, "CPU", {**config, "PERF_COUNT": True})
        profiled = profiled.create_infer_request()
        profiled.infer({0: x})
        layers, cpu_ms = {}, []
        for _ in range(calls):
            profiled.infer({0: x})
            started = time.process_time()
            request.infer({0: x})  # the call without the counters
            cpu_ms.append(1e3 * (time.process_time() - started))
            for info in profiled.get_profiling_info():
                if info.status == ov.ProfilingInfo.Status.EXECUTED:
                    key = (info.node_name, f"{info.node_type} {info.exec_type}")
                    layers.setdefault(key, []).append(info.real_time.total_seconds() * 1e3)
        totals = {}
        for (_, kind), times in layers.items():
            entry = totals.setdefault(kind, [0, 0.0])
            entry[0] += 1
            entry[1] += min(times)
        sums = {"calls": calls, "layers": len(layers),
                "min_ms": sum(min(t) for t in layers.values()),
                "median_ms": sum(statistics.median(t) for t in layers.values()),
                "cpu_ms": min(cpu_ms)}
        return totals, sums
    run.profile = profile
    return run, f"openvino {ov.__version__.split('-')[0]}"


def onnxruntime_session(path, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: not the exporter's unused initializers
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return (lambda x: session.run(None, {name: x})[0]), f"onnxruntime {ort.__version__}"


def openvino_int8(path, threads, calib, out_dir, transformer, vnni):
    del vnni  # OpenVINO picks its kernels itself
    import nncf
    import openvino as ov

    started = time.perf_counter()
    model = ov.Core().read_model(str(path))
    options = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    quantized = nncf.quantize(model, nncf.Dataset(list(calib)), subset_size=len(calib),
                              **options)
    calib_s = time.perf_counter() - started
    run, version = openvino_compiled(quantized, threads, "f32")
    return run, f"{version}, nncf {nncf.__version__}", calib_s


def onnxruntime_int8(path, threads, calib, out_dir, transformer, vnni):
    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        def __init__(self):
            name = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]) \
                .get_inputs()[0].name
            self.items = iter([{name: batch} for batch in calib])

        def get_next(self):
            return next(self.items, None)

    started = time.perf_counter()
    prepared = Path(out_dir) / "ort-prepared.onnx"
    quantized = Path(out_dir) / "ort-int8.onnx"
    quant_pre_process(str(path), str(prepared))
    reduce_range = not vnni
    quantize_static(str(prepared), str(quantized), Batches(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, reduce_range=reduce_range)
    calib_s = time.perf_counter() - started
    run, version = onnxruntime_session(quantized, threads)
    return run, f"{version}, u8s8{', reduce_range' if reduce_range else ''}", calib_s


LOADERS = {  # runner -> (onnx path, threads) -> (run, version)
    "openvino-bf16": lambda path, threads: openvino_compiled(path, threads, "bf16"),
    "openvino-fp32": lambda path, threads: openvino_compiled(path, threads, "f32"),
    "onnxruntime-fp32": onnxruntime_session,
}
QUANTIZERS = {"openvino-int8": openvino_int8, "onnxruntime-int8": onnxruntime_int8}


def timed_call(call, calls=1):
    """The "time" command's answer for `calls` calls of call() back to back
    (benchlib.time_interleaved's burst): the wall-clock and CPU seconds per
    call (the CPU time of this process, all of its threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    return {"wall": (time.perf_counter() - wall) / calls,
            "cpu": (time.process_time() - cpu) / calls}


class Anchor:
    def __init__(self):
        self.runners = {}
        self.input = None

    def _prepare(self, runner, make, out_dir, answer):
        """Makes one runner (make() -> (run, version[, calib seconds])), runs
        it once on the input, saves its output; a failure goes to answer."""
        started = time.perf_counter()
        try:
            made = make()
            out = made[0](self.input)  # the first run also warms up
        except Exception as err:  # one runner failing must not stop the others
            self.runners.pop(runner, None)
            answer["errors"][runner] = f"{type(err).__name__}: {str(err).strip()[:300]}"
            return
        run, version = made[:2]
        if len(made) > 2:
            answer["calib_s"][runner] = made[2]
            answer["load_s"][runner] = time.perf_counter() - started - made[2]
        else:
            answer["load_s"][runner] = time.perf_counter() - started
        answer["versions"][runner] = version
        path = Path(out_dir) / f"{runner}_out.npy"
        np.save(path, np.asarray(out, dtype=np.float32))
        answer["outputs"][runner] = str(path)
        self.runners[runner] = run

    def load(self, onnx, input, threads, runtimes, out_dir):
        self.input = np.load(input)
        onnx = without_initializer_inputs(onnx, out_dir)
        answer = {"load_s": {}, "outputs": {}, "versions": {}, "errors": {}}
        for runner in runtimes:
            if runner not in LOADERS:
                answer["errors"][runner] = f"unknown runner; known: {sorted(LOADERS)}"
                continue
            self._prepare(runner, lambda: LOADERS[runner](onnx, threads), out_dir, answer)
        return answer

    def quantize(self, onnx, input, calib, threads, runtimes, out_dir, transformer=False,
                 vnni=False):
        self.input = np.load(input)
        onnx = without_initializer_inputs(onnx, out_dir)
        batches = np.load(calib)
        answer = {"load_s": {}, "calib_s": {}, "outputs": {}, "versions": {}, "errors": {}}
        for runner in runtimes:
            if runner not in QUANTIZERS:
                answer["errors"][runner] = f"unknown runner; known: {sorted(QUANTIZERS)}"
                continue
            self._prepare(runner, lambda: QUANTIZERS[runner](onnx, threads, batches, out_dir,
                                                             transformer, vnni), out_dir, answer)
        return answer

    def profile(self, runtime, calls=5):
        run = self.runners[runtime]
        if not hasattr(run, "profile"):
            raise ValueError(f"{runtime} has no per-layer profile; OpenVINO runners have")
        layers, sums = run.profile(self.input, calls)
        return {"layers": layers, "sums": sums}

    def time(self, runtime, calls=1):
        run = self.runners[runtime]
        return timed_call(lambda: run(self.input), calls)


def answering():
    """The answers' own copy of stdout; file descriptor 1 (and so whatever
    the libraries print) then goes to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return answers


def serve(commands, answers):
    """Answers one JSON request per line on stdin ({"cmd": NAME, ...args})
    with commands[NAME](**args) until {"cmd": "quit"}; a failing command
    answers {"ok": false, "error": ...} and the loop goes on. Also serves
    bench/onednn_versions.py's children."""
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request.pop("cmd")
        if cmd == "quit":
            break
        try:
            answer = {"ok": True, **commands[cmd](**request)}
        except Exception as err:
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main():
    answers = answering()
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)  # errors only, in the quantizer's sessions too
    except ImportError:
        pass
    anchor = Anchor()
    serve({"load": anchor.load, "quantize": anchor.quantize, "time": anchor.time,
           "profile": anchor.profile}, answers)

if __name__ == "__main__":
    main()
