"""GPU exclusivity, the one rule: the guaranteed shares on one GPU sum to at most 1.

The node core asks it over the claims of registered workers and placements alike: may a guaranteed placement
start on these GPUs, may this worker register, or be promoted, as guaranteed? Today every
guaranteed claim is a whole GPU (share 1.0), so this is "one guaranteed job per GPU"; a claim with a smaller
share (several guaranteed partitions of one GPU) needs no other change here. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

WHOLE = 1.0
_EPS = 1e-9


@dataclass(frozen=True)
class Claim:
    """``owner`` (a job id, a placement key: whatever the caller compares) holds ``share`` of GPU ``gpu``."""

    gpu: int
    owner: str
    share: float = WHOLE


def conflict(claims: Iterable[Claim], gpus: Iterable[int], owner: str, share: float = WHOLE) -> Claim | None:
    """The first claim of another owner on a GPU of ``gpus`` where adding ``share`` for ``owner`` would put the
    guaranteed total over 1 (the lowest such GPU), else None. Claims of ``owner`` itself do not count."""
    wanted = set(gpus)
    totals: dict[int, float] = {}
    first: dict[int, Claim] = {}
    for c in claims:
        if c.gpu in wanted and c.owner != owner:
            totals[c.gpu] = totals.get(c.gpu, 0.0) + c.share
            first.setdefault(c.gpu, c)
    for gpu in sorted(totals):
        if totals[gpu] + share > WHOLE + _EPS:
            return first[gpu]
    return None
