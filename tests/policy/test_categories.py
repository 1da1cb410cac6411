"""The category table and the Policy methods conversion, training and the
reports share: precedence, matched conditions, reasons, moved ops."""
from mxamp.policy import BEHAVIOUR, Cast, Category, resolve

SOFTRELU = [("Activation", "act_type", ["softrelu"])]


def test_every_category_has_one_row():
    assert set(BEHAVIOUR) == set(Category)
    assert {c: b.cast for c, b in BEHAVIOUR.items()} == {
        Category.LOW: Cast.TARGET, Category.FP32: Cast.FLOAT32, Category.WIDEST: Cast.WIDEST,
        Category.CONDITIONAL: Cast.FLOAT32, Category.NEUTRAL: Cast.NONE,
        Category.FOLLOW: Cast.NONE}


def test_a_condition_decides_the_category_and_names_itself_in_the_reason():
    policy = resolve("float16", conditional_fp32_ops=SOFTRELU)
    softrelu, relu = {"act_type": "softrelu"}, {"act_type": "relu"}
    assert policy.category("Activation", "act", softrelu) is Category.CONDITIONAL
    assert policy.category("Activation", "act", relu) is Category.NEUTRAL
    assert policy.reason("Activation", softrelu, Category.CONDITIONAL) == \
        "condition act_type=softrelu"
    assert policy.reason("Convolution", {}, Category.LOW) == "low-precision list"


def test_with_fp32_moves_ops_out_of_the_low_list():
    policy = resolve("bfloat16", target_dtype_ops=["Convolution", "FullyConnected"],
                     fp32_ops=[], conditional_fp32_ops=SOFTRELU, widest_dtype_ops=[])
    moved = policy.with_fp32({"Convolution", "Deconvolution"})
    assert moved.low == {"FullyConnected"}
    assert moved.fp32 == {"Convolution", "Deconvolution"}
    assert moved.category("Deconvolution", "", {}) is Category.FP32
    assert moved.listed_ops == {"Convolution", "Deconvolution", "FullyConnected", "Activation"}
    assert policy.low == {"Convolution", "FullyConnected"}  # the original is unchanged
