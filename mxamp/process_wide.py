"""Changes that belong to the whole process (a file descriptor, a resource
limit) made for blocks of mxamp's work that nest and run in any thread."""
import contextlib
import threading


class ProcessWide:
    """A context manager factory (and decorator) for a process-wide change:
    ``start()`` makes it and returns what undoes it. Blocks nest, in any
    thread: the outermost open block makes the change, and the last to end
    undoes it, so no block ends it under another still running."""

    def __init__(self, start):
        self._start = start
        self._lock = threading.Lock()
        self._depth = 0
        self._undo = None

    @contextlib.contextmanager
    def __call__(self):
        with self._lock:
            if self._depth == 0:  # a start() that raises leaves no block open
                self._undo = self._start()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    undo, self._undo = self._undo, None
                    undo()
