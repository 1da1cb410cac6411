"""How the examples time a model: the fastest of a few calls after a first
one (which builds the backend's primitives and MXNet's cached graph)."""
import time

import mxamp.cpu


def best_ms(fn, repeat=5):
    """The fastest of `repeat` calls of `fn`, in milliseconds, after one more."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def print_speed(dtype, native, float32_fn, low_fn):
    """Prints `low_fn`'s speed against `float32_fn`'s where this CPU runs
    `dtype` natively (`native`); else that it was not measured, and why."""
    if not native:
        print(f"speed: not measured, this CPU runs {dtype} only emulated "
              f"(MXNet sees {mxamp.cpu.features('mxnet')})")
        return
    fp32, low = best_ms(float32_fn), best_ms(low_fn)
    print(f"speed: float32 {fp32:.1f} ms, {dtype} {low:.1f} ms "
          f"({fp32 / low:.2f}x) on {mxamp.cpu.describe()}")
