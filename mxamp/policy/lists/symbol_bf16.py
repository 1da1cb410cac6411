"""mxamp's own bfloat16 placement (CPU: oneDNN, AVX512-BF16/AMX): the
operators mxnet.contrib.amp's bfloat16 lists omit, and the deliberate
differences from its placement (policy.defaults.OWN_PLACEMENT, each with its
reason). Every other operator is placed where the installed reference's lists
put it (policy/defaults.py); tests/policy/test_lists.py fails if an entry here
is one the reference's placement would override.

An op here is dtype-neutral or widest-type only if it was run on MXNet 1.9.1
(CPU) with bfloat16 inputs and matched float32; many ops have no bfloat16 CPU
kernel and stay float32.
"""

__all__ = [
    "BF16_FP32_FUNCS",
    "BF16_FUNCS",
    "CONDITIONAL_FP32_FUNCS",
    "FP32_FUNCS",
    "LOSS_OUTPUT_FUNCTIONS",
    "WIDEST_TYPE_CASTS",
]

# Run in bfloat16: none beyond the reference's.
BF16_FUNCS = []

# Run in whichever float dtype they receive; each one was run here with bfloat16 inputs.
BF16_FP32_FUNCS = [
    # AMP's own casts and explicit casts: they set the dtype themselves.
    "amp_cast",
    "amp_multicast",

    # Control flow and cached graphs: their bodies carry their own dtypes.
    "_CachedOpThreadSafe",

    # Identity-like ops and storage casts: copy values through unchanged.
    "_np_copy",

    # Shape and layout ops: move values, no arithmetic. Not transpose: the reference's
    # lists put it in float32, and MXNet 1.9.1's bfloat16 transpose corrupts memory
    # (convert/probe.py's CORRUPTING keeps it float32 whatever the lists say).
    "Flatten",
    "_np_atleast_1d",
    "_np_atleast_2d",
    "_np_atleast_3d",
    "_np_diag",
    "_np_diagflat",
    "_np_diagonal",
    "_np_moveaxis",
    "_np_reshape",
    "_np_roll",
    "_np_squeeze",
    "_np_transpose",
    "_npi_broadcast_to",
    "_npi_flip",
    "_npi_pad",
    "_npi_reshape",
    "_npi_rot90",
    "_npi_tril",
    "_npx_batch_flatten",
    "_npx_reshape",
    "flatten",

    # Slicing, splitting and sequence masking: select values, no arithmetic.
    "_npi_boolean_mask_assign_scalar",
    "_npi_delete",
    "_npi_dsplit",
    "_npi_hsplit",

    # Index, shape and mask producers: their outputs are not floats.
    "_contrib_arange_like",
    "_np_all",
    "_np_any",
    "_np_sometrue",
    "_npi_argmax",
    "_npi_argmin",
    "_npi_diag_indices_from",
    "_npi_full_like",
    "_npi_isfinite",
    "_npi_isinf",
    "_npi_isnan",
    "_npi_isneginf",
    "_npi_isposinf",
    "_npi_logical_not",
    "_npi_nonzero",
    "_npi_share_memory",
    "_npi_unique",
    "_npx_arange_like",
    "_npx_nonzero",

    # Bounded or piecewise-linear activations (relu/sigmoid/tanh via oneDNN eltwise).
    "_contrib_round_ste",
    "_contrib_sign_ste",
    "_npi_tanh",
    "_npx_relu",
    "_npx_sigmoid",
    "_sparse__contrib_round_ste",
    "_sparse__contrib_sign_ste",

    # Element-wise ops whose result keeps the input's precision.
    "_npi_abs",
    "_npi_absolute",
    "_npi_arccos",
    "_npi_arcsin",
    "_npi_arctan",
    "_npi_around",
    "_npi_cbrt",
    "_npi_ceil",
    "_npi_degrees",
    "_npi_diff",
    "_npi_fix",
    "_npi_floor",
    "_npi_nan_to_num",
    "_npi_negative",
    "_npi_radians",
    "_npi_rint",
    "_npi_sign",
    "_npi_sqrt",
    "_npi_trunc",

    # Tensor-scalar arithmetic and comparisons: one tensor input.
    "_npi_add_scalar",
    "_npi_arctan2_scalar",
    "_npi_copysign_scalar",
    "_npi_equal_scalar",
    "_npi_greater_equal_scalar",
    "_npi_greater_scalar",
    "_npi_less_equal_scalar",
    "_npi_less_scalar",
    "_npi_mod_scalar",
    "_npi_multiply_scalar",
    "_npi_not_equal_scalar",
    "_npi_rarctan2_scalar",
    "_npi_rcopysign_scalar",
    "_npi_rmod_scalar",
    "_npi_rsubtract_scalar",
    "_npi_subtract_scalar",
    "_npi_where_scalar2",

    # Max/min reductions: pick an element, nothing accumulates.
    "_np_amax",
    "_np_amin",
    "_np_max",
    "_np_min",
]

# Always run in float32: their float inputs are cast to float32.
FP32_FUNCS = [
    # exp/log family: bfloat16 keeps 8 significant bits, exp/log amplify the input rounding.
    "_npi_arccosh",
    "_npi_arcsinh",
    "_npi_arctanh",
    "_npi_cosh",
    "_npi_exp",
    "_npi_expm1",
    "_npi_log",
    "_npi_log10",
    "_npi_log1p",
    "_npi_log2",
    "_npi_sinh",

    # Powers, squares and reciprocals: the pow family stays float32.
    "_npi_hypot",
    "_npi_ldexp",
    "_npi_ldexp_scalar",
    "_npi_polyval",
    "_npi_power",
    "_npi_power_scalar",
    "_npi_reciprocal",
    "_npi_rldexp_scalar",
    "_npi_rpower_scalar",
    "_npi_rtrue_divide_scalar",
    "_npi_square",

    # Trigonometry of unbounded arguments: bfloat16 spacing is 2.0 at 512 (radians).
    "_npi_cos",
    "_npi_sin",
    "_npi_tan",

    # Reductions and scans that accumulate many elements.
    "_contrib_allclose",
    "_np_cumsum",
    "_np_prod",
    "_np_product",
    "_np_sum",
    "_np_trace",
    "_npi_average",
    "_npi_bincount",
    "_npi_einsum",
    "_npi_mean",
    "_npi_norm",
    "_npi_percentile",
    "_npi_std",
    "_npi_var",
    "cumsum",
    "multi_sum_sq",

    # Linear algebra: float32/float64-only kernels, ill-conditioned in low precision.
    "_npi_cholesky",
    "_npi_eig",
    "_npi_eigh",
    "_npi_eigvals",
    "_npi_eigvalsh",
    "_npi_pinv",
    "_npi_pinv_scalar_rcond",
    "_npi_solve",
    "_npi_svd",
    "_npi_tensorinv",
    "_npi_tensorsolve",

    # Random samplers and densities: parameters and densities need float32 resolution.
    "_npi_bernoulli",
    "_npi_choice",
    "_npi_exponential",
    "_npi_gamma",
    "_npi_gumbel",
    "_npi_logistic",
    "_npi_multinomial",
    "_npi_normal",
    "_npi_normal_n",
    "_npi_pareto",
    "_npi_powerd",
    "_npi_rayleigh",
    "_npi_uniform",
    "_npi_uniform_n",
    "_npi_weibull",

    # Optimizer updates: weights and optimizer state are float32.
    "_multi_adamw_update",
    "_multi_lamb_update",
    "_multi_mp_adamw_update",
    "_multi_mp_lamb_update",
    "lamb_update_phase1",
    "lamb_update_phase2",
    "mp_lamb_update_phase1",
    "mp_lamb_update_phase2",
    "mp_nag_mom_update",
    "multi_lars",
    "nag_mom_update",
    "preloaded_multi_mp_sgd_mom_update",
    "preloaded_multi_mp_sgd_update",
    "preloaded_multi_sgd_mom_update",
    "preloaded_multi_sgd_update",
    "reset_arrays",

    # Box geometry, anchors, ROI and grid sampling: image coordinates need sub-pixel precision.
    "_contrib_RROIAlign",
    "_contrib_box_decode",
    "_contrib_box_encode",

    # Quantization: int8 data travels with float32 ranges.
    "_contrib_calibrate_entropy",
    "_contrib_quantize_asym",
    "_contrib_quantized_batch_norm",
    "_contrib_quantized_elemwise_mul",
    "_contrib_quantized_embedding",
    "_contrib_quantized_rnn",

    # Backward-pass ops whose names do not start with _backward: not in inference graphs.
    "_contrib_backward_gradientmultiplier",
    "_contrib_backward_hawkesll",
    "_contrib_backward_index_copy",
    "_contrib_backward_quadratic",
    "_npi_backward_ediff1d",
    "_npi_backward_nan_to_num",
    "_npi_backward_polyval",
    "_npi_hsplit_backward",

    # GEMM-based ops (dot/batch_dot, numpy matmul/tensordot, RNN, attention matmuls,
    # Convolution_v1): no bfloat16 CPU kernel in MXNet 1.9.1 (probed: they fail at run time).
    "_contrib_interleaved_matmul_encdec_qk",
    "_contrib_interleaved_matmul_encdec_valatt",
    "_contrib_interleaved_matmul_selfatt_qk",
    "_contrib_interleaved_matmul_selfatt_valatt",
    "_np_dot",
    "_npi_matmul",
    "_npi_tensordot",
    "_npi_tensordot_int_axes",

    # Corrupt the heap / crash the process with bfloat16 inputs (probed).
    "_sg_mkldnn_selfatt_qk",
    "_sg_mkldnn_selfatt_valatt",

    # No bfloat16 CPU kernel: type inference accepts bfloat16 but the kernel fails (probed).
    "_contrib_BatchNormWithReLU",  # oneDNN-only fused BatchNorm+ReLU
    "_npi_true_divide",
    "_npi_true_divide_scalar",
    "col2im",  # sums only the few overlapping patch values
    "im2col",

    # Type inference rejects bfloat16 (probed).
    "_npi_arctan2",

    # Integer/bool-only inputs: no bfloat16 input possible; float32 is a no-op for them (integer
    # entries are never cast).
    "_npi_bitwise_and",
    "_npi_bitwise_and_scalar",
    "_npi_bitwise_not",
    "_npi_bitwise_or",
    "_npi_bitwise_or_scalar",
    "_npi_bitwise_xor",
    "_npi_bitwise_xor_scalar",
    "_npi_lcm",
    "_npi_lcm_scalar",
    "_npx_constraint_check",

    # No tensor inputs: nothing to cast, so nothing to verify with bfloat16.
    "_npi_arange",
    "_npi_blackman",
    "_npi_eye",
    "_npi_hamming",
    "_npi_hanning",
    "_npi_identity",
    "_npi_indices",
    "_npi_logspace",
    "_npi_ones",
    "_npi_zeros",

    # Not verified with bfloat16 inputs (sparse/graph ops, legacy Python ops, image decoding,
    # kernels of unknown dtype support).
    "_contrib_ModulatedDeformableConvolution",
]

# (operator, attribute, values): float32 when the attribute has one of the values,
# dtype-neutral otherwise. None beyond the reference's.
CONDITIONAL_FP32_FUNCS = []

# Several float inputs that must share one dtype: run in the widest dtype among them.
WIDEST_TYPE_CASTS = [
    # Binary element-wise arithmetic: both operands must share one dtype.
    "_npi_add",
    "_npi_copysign",
    "_npi_mod",
    "_npi_multiply",
    "_npi_subtract",

    # Comparisons and logic on two tensors: compare in the wider dtype.
    "_npi_equal",
    "_npi_greater",
    "_npi_greater_equal",
    "_npi_less",
    "_npi_less_equal",
    "_npi_not_equal",

    # Joins of several tensors (oneDNN bfloat16 concat): one output dtype for all inputs.
    "_npi_column_stack",
    "_npi_concatenate",
    "_npi_dstack",
    "_npi_hstack",
    "_npi_stack",
    "_npi_vstack",

    # Selects and assignments that mix values of several tensors.
    "_npi_boolean_mask_assign_tensor",
    "_npi_ediff1d",
    "_npi_insert_scalar",
    "_npi_insert_slice",
    "_npi_insert_tensor",
    "_npi_where",
    "_npi_where_lscalar",
    "_npi_where_rscalar",
]

# Loss heads whose backward ignores the incoming gradient, so loss scaling has to
# go through them, beyond the reference's. Informational: they are float32 ops.
LOSS_OUTPUT_FUNCTIONS = [
    "MakeLoss",
    "SVMOutput",
    "Softmax",
    "_sparse_LinearRegressionOutput",
    "_sparse_LogisticRegressionOutput",
    "_sparse_MAERegressionOutput",
    "_sparse_make_loss",
    "make_loss",
]
