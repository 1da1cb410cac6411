"""How the examples time a model: the fastest of a few calls after a first
one (which builds the backend's primitives and MXNet's cached graph)."""
import time


def best_ms(fn, repeat=5):
    """The fastest of `repeat` calls of `fn`, in milliseconds, after one more."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)
