"""Decode throughput by layout and concurrency, calibrated to the field numbers (docs/facts.md §1).

For a layout with single-request speed s1 (tok/s) and saturated aggregate A (tok/s), the aggregate at
concurrency b is  agg(b) = A * (1 - exp(-k*b)),  k = -ln(1 - s1/A),  so agg(1) = s1 exactly and agg -> A;
each of the b requests decodes at agg(b)/b. Prefill runs at 5*A tokens/s.
"""

from __future__ import annotations

import math

# (single-request tok/s, saturated aggregate tok/s) for 8 GPUs; TP2-EP4's single figure is an estimate
CALIBRATION = {
    "tp8": (26.0, 808.0),
    "pp8": (37.0, 396.0),
    "ep8": (65.0, 960.0),
    "tp8ep4": (48.0, 1531.0),
    "tp8ep2": (34.0, 1100.0),
}


def layout_key(tp: int, pp: int, ep: int) -> str:
    if pp > 1 and tp == 1:
        return "pp8"
    if ep > 1 and ep == tp:
        return "ep8"
    if ep > 1 and tp // ep == 2:
        return "tp8ep4"
    if ep > 1:
        return "tp8ep2"
    return "tp8"


def layout_rates(tp: int, pp: int, ep: int, dp: int = 1, dp_attention: bool = False) -> tuple[float, float]:
    s1, agg = CALIBRATION[layout_key(tp, pp, ep)]
    world = tp * pp * (1 if dp_attention else dp)
    agg *= world / 8.0  # more replicas or GPUs, proportionally more aggregate
    if dp_attention:
        agg *= 1.15  # DP attention removes the attention all-reduce; helps at high concurrency only
    if tp > 1 and pp > 1:  # mixed TP/PP: between the two
        s1 = (26.0 + 37.0) / 2
    return s1, max(agg, s1 * 1.01)


def aggregate(b: int, s1: float, agg: float) -> float:
    if b <= 0:
        return 0.0
    k = -math.log(1.0 - s1 / agg)
    return agg * (1.0 - math.exp(-k * b))


def per_request(b: int, s1: float, agg: float) -> float:
    return aggregate(b, s1, agg) / max(b, 1)
