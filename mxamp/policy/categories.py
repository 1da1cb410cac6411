"""The closed set of precision categories a node can be in."""
import enum


class Category(enum.Enum):
    """What a node does with the dtype of its float inputs."""
    LOW = "low precision"      # cast float inputs to the target dtype
    FP32 = "float32"           # cast float inputs to float32
    WIDEST = "widest"          # run in the widest float dtype among the inputs
    CONDITIONAL = "conditional float32"  # float32 when an attribute matches
    NEUTRAL = "neutral"        # run in whatever dtype arrives
    FOLLOW = "follow"          # low precision only if every float input already is


# What a per-node rule may return (CONDITIONAL is the lists' own mechanism).
RULE_CATEGORIES = (Category.LOW, Category.FP32, Category.FOLLOW, Category.WIDEST,
                   Category.NEUTRAL)
