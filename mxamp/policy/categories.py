"""The closed set of precision categories a node can be in, and what each
does: :data:`BEHAVIOUR` is the one table conversion, training and the
reports read.

A node that cannot run as its category asks (MXNet's type inference or the
device rejects the target dtype, a FOLLOW node's inputs are not all low, a
NEUTRAL node's inputs disagree) runs in float32: its float inputs are cast
to float32.
"""
import enum
from dataclasses import dataclass


class Category(enum.Enum):
    """What a node does with the dtype of its float inputs.

    Wherever a category is expected, its name is accepted too.
    """
    LOW = "low precision"      #: cast float inputs to the target dtype
    FP32 = "float32"           #: cast float inputs to float32
    WIDEST = "widest"          #: run in the widest float dtype among the inputs
    CONDITIONAL = "conditional float32"  #: float32 when an attribute matches
    NEUTRAL = "neutral"        #: run in whatever dtype arrives
    FOLLOW = "follow"          #: low precision only if every float input already is


class Cast(enum.Enum):
    """What a node's float inputs are cast to."""
    TARGET = "target"          # the target dtype, in the slots graph.low_slots picks
    FLOAT32 = "float32"
    WIDEST = "widest"          #: the widest among them; amp_multicast where not known yet
    NONE = "none"              # nothing: the node runs in the dtype they arrive in


@dataclass(frozen=True)
class Behaviour:
    """One row of :data:`BEHAVIOUR`."""
    cast: Cast    # what the node's float inputs are cast to
    reason: str   # why it runs so, as reports say; "{condition}": the attributes that matched


BEHAVIOUR = {
    Category.LOW: Behaviour(Cast.TARGET, "low-precision list"),
    Category.FP32: Behaviour(Cast.FLOAT32, "float32 list"),
    Category.WIDEST: Behaviour(Cast.WIDEST, "widest input dtype"),
    Category.CONDITIONAL: Behaviour(Cast.FLOAT32, "condition {condition}"),
    Category.NEUTRAL: Behaviour(Cast.NONE, "runs in its input's dtype"),
    # No cast of its own: it runs low when its inputs arrive low, else float32 (see above).
    Category.FOLLOW: Behaviour(Cast.NONE, "low precision if its inputs are"),
}

# What a per-node rule may return (CONDITIONAL is the lists' own mechanism).
RULE_CATEGORIES = (Category.LOW, Category.FP32, Category.FOLLOW, Category.WIDEST,
                   Category.NEUTRAL)
