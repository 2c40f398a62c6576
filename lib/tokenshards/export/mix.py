"""Pure: how many tokens each run of a mixture gives, in whole epochs and a top-up.

Weights are exact fractions of the numbers typed (``0.7`` is 7/10), normalised to sum 1, so
targets do not depend on float rounding. Source i takes ``ceil(w_i × N)`` train tokens: every
document ``target // T_i`` times (its epochs), then the shortest prefix of its own seeded order
holding the rest, overshooting by less than one document. The default N is the largest total
that needs no source twice: ``min_i floor(T_i / w_i)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from ..errors import UserError


@dataclass(frozen=True, kw_only=True)
class Share:
    """One source's part of the train stream."""

    weight: Fraction
    available: int
    """Its train tokens (after its validation documents are taken out)."""
    target: int
    epochs: int
    """Whole passes over every train document."""
    remainder: int
    """Tokens of the top-up after the whole passes (0: none)."""


def weights_of(given: tuple[float, ...] | None, sizes: list[int], runs: list[str]) -> list[Fraction]:
    """Normalised weights; none given means each run's share of all tokens (each taken once)."""
    if given is None:
        raw = [Fraction(s) for s in sizes]
    else:
        if len(given) != len(runs):
            raise UserError(f"--weights has {len(given)} values for {len(runs)} runs; give one weight per run, in the same order")
        for run, w in zip(runs, given):
            if not (math.isfinite(w) and w > 0):
                raise UserError(f"weight {w!r} for {run} must be a positive number")
        raw = [Fraction(repr(float(w))) for w in given]
    total = sum(raw)
    return [w / total for w in raw]


def split_val(val_tokens: int, weights: list[Fraction]) -> list[int]:
    """``val_tokens`` divided by weight, largest remainders first (ties to the earlier run)."""
    exact = [val_tokens * w for w in weights]
    parts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[:val_tokens - sum(parts)]:
        parts[i] += 1
    return parts


def default_total(available: list[int], weights: list[Fraction]) -> int:
    return min(math.floor(a / w) for a, w in zip(available, weights))


def shares(*, available: list[int], weights: list[Fraction], total: int, runs: list[str]) -> list[Share]:
    out = []
    for run, a, w in zip(runs, available, weights):
        if a <= 0:
            raise UserError(f"{run} has no train tokens left after its validation documents; lower --val-tokens")
        target = math.ceil(w * total)
        out.append(Share(weight=w, available=a, target=target, epochs=target // a, remainder=target % a))
    return out
