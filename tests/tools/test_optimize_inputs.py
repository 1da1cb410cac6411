"""mxamp.optimize's inputs as users pass them: an eval_fn returning
something other than a number is one clear error (a raw TypeError from the
subtraction before), and a numpy budget is a number like any other."""
import mxnet as mx
import numpy as np
import pytest

import mxamp
from graphs import tiny_net

BATCHES = [mx.nd.random.uniform(shape=(2, 3, 8, 8))]


@pytest.mark.parametrize("returned, shown", [
    (None, "None"), (mx.nd.array([0.5]), "NDArray: return array.asscalar()"),
    ("0.9", "str")])
def test_an_eval_fn_that_returns_no_number_is_one_error(returned, shown):
    with pytest.raises(mxamp.OptionTypeError) as err:
        mxamp.optimize(tiny_net(), BATCHES, eval_fn=lambda block: returned, runs=1)
    assert str(err.value) == f"eval_fn must return a number (higher is better), got {shown}"


@pytest.mark.parametrize("budget", [np.float32(0.05), np.float64(0.05), np.int64(0)])
def test_a_numpy_budget_is_accepted(budget):
    result = mxamp.optimize(tiny_net(), BATCHES, max_error=budget, runs=1,
                            eval_fn=lambda block: np.float32(1.0))
    assert result.max_error == budget
    assert result.name in [c.name for c in result.candidates if c.block is not None]
