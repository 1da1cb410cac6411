"""The default operator lists per target dtype (data in ``lists/``) and the
``list_*`` accessors of ``mxnet.contrib.amp``."""
from ..dtypes import normalize_dtype
from .lists import symbol_bf16, symbol_fp16


# Per target dtype: the list module and the names of its category lists.
_LISTS = {
    "float16": (symbol_fp16, "FP16_FUNCS", "FP16_FP32_FUNCS"),
    "bfloat16": (symbol_bf16, "BF16_FUNCS", "BF16_FP32_FUNCS"),
}


def _lists(target_dtype):
    module, low, neutral = _LISTS[normalize_dtype(target_dtype)]
    return module, low, neutral


def list_lp16_ops(target_dtype):
    """Default ops that run in the target (low precision) dtype."""
    module, low, _ = _lists(target_dtype)
    return list(getattr(module, low))


def list_fp32_ops(target_dtype):
    """Default ops that always run in float32."""
    return list(_lists(target_dtype)[0].FP32_FUNCS)


def list_lp16_fp32_ops(target_dtype):
    """Default ops that run in whichever float dtype they receive."""
    module, _, neutral = _lists(target_dtype)
    return list(getattr(module, neutral))


def list_conditional_fp32_ops(target_dtype):
    """Default (op, attribute, values) rules that switch an op to float32."""
    return list(_lists(target_dtype)[0].CONDITIONAL_FP32_FUNCS)


def list_widest_type_cast(target_dtype):
    """Default ops that run in the widest float dtype among their inputs."""
    return list(_lists(target_dtype)[0].WIDEST_TYPE_CASTS)


def list_loss_output_functions(target_dtype):
    """Loss output ops (informational; they are float32 ops)."""
    return list(_lists(target_dtype)[0].LOSS_OUTPUT_FUNCTIONS)


def list_lp16_use_fp32_params(target_dtype):
    """{op: input names kept in float32} for AMP training, as the reference
    gives it: None for float16."""
    module = _lists(target_dtype)[0]
    params = getattr(module, "BF16_USE_FP32_PARAMS", None)
    return None if params is None else {op: list(names) for op, names in params.items()}


# Spellings from MXNet releases before 1.9.
list_fp16_ops = list_lp16_ops


list_fp16_fp32_ops = list_lp16_fp32_ops
