"""Runs an ONNX model in OpenVINO (bfloat16) and ONNX Runtime (float32) on request.

The outside anchors of bench/bf16_speed.py. This script runs in its own
virtual environment (bench/requirements-anchor.txt; neither runtime is a
dependency of mxamp) as a child process of the benchmark, which drives it
with one JSON request per line on stdin and reads one JSON answer per line on
stdout, so that its timings interleave with the MXNet ones round by round:

    {"cmd": "load", "onnx": PATH, "input": NPY, "threads": 2,
     "runtimes": ["openvino", "onnxruntime"], "out_dir": DIR}
        -> {"ok": true, "load_s": {...}, "outputs": {runtime: NPY}, "versions": {...}}
    {"cmd": "time", "runtime": "openvino"}   -> {"ok": true, "seconds": 0.21}
    {"cmd": "quit"}

A runtime that fails to load is reported in "errors" and left out; any other
failure answers {"ok": false, "error": "..."} and the process goes on.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np


def openvino_runner(path, threads):
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads,
              "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(core.read_model(path), "CPU", config)
    request = compiled.create_infer_request()

    def run(x):
        request.infer({0: x})
        return request.get_output_tensor(0).data.copy()
    return run, ov.__version__


def onnxruntime_runner(path, threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: not the exporter's unused initializers
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return (lambda x: session.run(None, {name: x})[0]), ort.__version__


RUNTIMES = {"openvino": openvino_runner, "onnxruntime": onnxruntime_runner}


class Anchor:
    def __init__(self):
        self.runners = {}
        self.input = None

    def load(self, onnx, input, threads, runtimes, out_dir):
        self.input = np.load(input)
        self.runners = {}
        answer = {"load_s": {}, "outputs": {}, "versions": {}, "errors": {}}
        for runtime in runtimes:
            if runtime not in RUNTIMES:
                answer["errors"][runtime] = f"unknown runtime; known: {sorted(RUNTIMES)}"
                continue
            start = time.perf_counter()
            try:
                run, version = RUNTIMES[runtime](onnx, threads)
                out = run(self.input)  # first run also warms up
            except Exception as err:  # one runtime failing must not stop the other
                answer["errors"][runtime] = f"{type(err).__name__}: {err}"
                continue
            answer["load_s"][runtime] = time.perf_counter() - start
            answer["versions"][runtime] = version
            path = Path(out_dir) / f"{runtime}_out.npy"
            np.save(path, out.astype(np.float32))
            answer["outputs"][runtime] = str(path)
            self.runners[runtime] = run
        return answer

    def time(self, runtime):
        run = self.runners[runtime]
        start = time.perf_counter()
        run(self.input)
        return {"seconds": time.perf_counter() - start}


def main():
    anchor = Anchor()
    commands = {"load": anchor.load, "time": anchor.time}
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request.pop("cmd")
        if cmd == "quit":
            break
        try:
            answer = {"ok": True, **commands[cmd](**request)}
        except Exception as err:
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
