"""Random device mixes and their balanced optimum, for `bench/hetero_dp.py --random-sets`.

Pure functions, no jobs run here:

  draw_speed_sets   seeded, reproducible emulated speed sets (2-4 devices, widely spread)
  fit_cost_curve    t(b) = a + c * b through a device's step time measured alone at two batches
  balanced_shares   the integer water-filling: shares with sum B, each >= 1, max_i t_i(b_i) least
  distribution      min, median and max of one ratio over the sets
"""

import math
import random
import statistics

# The fastest device of a set is 1 before scaling; the slowest is 1 / SPREAD, SPREAD drawn
# log-uniformly in this range, and the others lie log-uniformly between them.
SPREAD_RANGE = (4.0, 12.0)
DEVICE_COUNTS = (2, 4)  # inclusive
SPEED_DECIMALS = 3  # the speeds are written as `cpu@0.043`
MIN_SPEED = 0.01


def draw_device_counts(rng, sets):
    """How many devices each set has: 2, 3, 4, 2, 3, 4, ... shuffled, so every count occurs."""
    low, high = DEVICE_COUNTS
    counts = [low + i % (high - low + 1) for i in range(sets)]
    rng.shuffle(counts)
    return counts


def draw_speed_set(rng, count, max_speed_sum):
    """`count` speeds, fastest first, scaled so that they sum to at most max_speed_sum."""
    spread = math.exp(rng.uniform(*(math.log(x) for x in SPREAD_RANGE)))
    relative = [1.0, 1.0 / spread]
    relative += [math.exp(rng.uniform(-math.log(spread), 0.0)) for _ in range(count - 2)]
    scale = max_speed_sum / sum(relative)
    unit = 10 ** SPEED_DECIMALS
    # Rounded down, so the sum stays within max_speed_sum.
    speeds = [max(MIN_SPEED, math.floor(r * scale * unit) / unit) for r in relative]
    return sorted(speeds, reverse=True)


def draw_speed_sets(count, seed, max_speed_sum):
    """`count` speed sets; the same seed gives the same sets on any machine."""
    rng = random.Random(seed)
    return [draw_speed_set(rng, devices, max_speed_sum)
            for devices in draw_device_counts(rng, count)]


def fit_cost_curve(small_batch, small_step_s, large_batch, large_step_s):
    """The line t(b) = a + c * b through two (batch, step seconds) points, as a dict.

    If noise makes the slope non-positive (it should not: a larger batch costs more), the
    curve falls back to proportional, t(b) = b * large_step_s / large_batch, and says so.
    """
    slope = (large_step_s - small_step_s) / (large_batch - small_batch)
    if slope > 0:
        fixed, kind = small_step_s - slope * small_batch, "two-point"
    else:
        slope, fixed, kind = large_step_s / large_batch, 0.0, "proportional (slope <= 0)"
    return {"fixed_s": fixed, "per_sample_s": slope, "fit": kind,
            "points": [[small_batch, small_step_s], [large_batch, large_step_s]]}


def step_time(curve, batch):
    """A device's step time at this batch according to its cost curve."""
    return curve["fixed_s"] + curve["per_sample_s"] * batch


def balanced_shares(curves, global_batch):
    """Integer shares, sum global_batch, each >= 1, that minimise max_i t_i(b_i).

    Water-filling one sample at a time: every sample goes to the device whose step would then
    end first.  With increasing t_i this greedy choice is optimal for the largest step time.
    Returns (shares, the balanced step seconds).
    """
    if global_batch < len(curves):
        raise ValueError(f"a batch of {global_batch} cannot give {len(curves)} devices one each")
    shares = [1] * len(curves)
    for _ in range(global_batch - len(curves)):
        best = min(range(len(curves)), key=lambda i: step_time(curves[i], shares[i] + 1))
        shares[best] += 1
    return shares, max(step_time(c, b) for c, b in zip(curves, shares))


def distribution(values):
    """min, median and max of a ratio over the sets, plus every value in set order."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "values": list(values)}
