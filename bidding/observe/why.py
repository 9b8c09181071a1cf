"""Why the winner of an auction won, in sentences (pure): its score against the runner-up's
and the terms that made the difference, and what kept every other node out (not eligible,
refused, late, silent). ``bidding explain`` prints them; the dashboard shows them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bidding.lifecycle import states

#: Scores closer than this are a tie (the strategies' own epsilon, ``TIE_EPSILON``).
TIE = 1e-9
#: Term differences smaller than this are not worth a word.
NOTABLE = 0.0005
#: At most this many terms are named as the difference.
TERMS_SHOWN = 3


class ScoredBid(Protocol):
    """A bid or refusal as the award stored it (``observe.explain.BidView`` is one)."""

    @property
    def node(self) -> str: ...  # noqa: D102
    @property
    def will_bid(self) -> bool: ...  # noqa: D102
    @property
    def reason(self) -> str: ...  # noqa: D102
    @property
    def score(self) -> float | None: ...  # noqa: D102
    @property
    def breakdown(self) -> Mapping[str, Any]: ...  # noqa: D102
    @property
    def is_winner(self) -> bool: ...  # noqa: D102
    @property
    def late(self) -> bool: ...  # noqa: D102


def _eligible(b: ScoredBid) -> bool:
    return (b.will_bid and not b.late and b.score is not None
            and bool(b.breakdown.get("eligible", True)))


def _difference(winner: ScoredBid, rival: ScoredBid) -> str:
    """The terms and multipliers in which the winner's score differs from the rival's."""
    mine: Mapping[str, float] = winner.breakdown.get("terms") or {}
    theirs: Mapping[str, float] = rival.breakdown.get("terms") or {}
    deltas = [(name, mine.get(name, 0.0) - theirs.get(name, 0.0))
              for name in sorted({*mine, *theirs})]
    notable = sorted((d for d in deltas if abs(d[1]) >= NOTABLE), key=lambda d: -abs(d[1]))
    parts = [f"{name} {delta:+.3f}" for name, delta in notable[:TERMS_SHOWN]]
    mine_x: Mapping[str, float] = winner.breakdown.get("multipliers") or {}
    theirs_x: Mapping[str, float] = rival.breakdown.get("multipliers") or {}
    parts += [f"{name} x{mine_x.get(name, 1.0):g} against x{theirs_x.get(name, 1.0):g}"
              for name in sorted({*mine_x, *theirs_x})
              if abs(mine_x.get(name, 1.0) - theirs_x.get(name, 1.0)) > TIE]
    return ", ".join(parts)


def _verdict(bids: Sequence[ScoredBid], winner: str, outcome: str | None) -> str:
    """The sentence about the winner."""
    if outcome == "fallback":
        return (f"{winner} runs it as the fallback: no bid was eligible, so the least-loaded "
                "live node with every required skill took it")
    mine = next((b for b in bids if b.node == winner and (b.is_winner or _eligible(b))), None)
    if mine is None or mine.score is None:
        return f"{winner} won"
    rivals = sorted((b for b in bids if _eligible(b) and b.node != winner),
                    key=lambda b: -(b.score or 0.0))
    if not rivals:
        return f"{winner} won with {mine.score:.3f}: the only eligible bid"
    rival = rivals[0]
    assert rival.score is not None  # an eligible bid is scored
    margin = mine.score - rival.score
    if margin <= TIE:
        return (f"{winner} won a tie with {rival.node} at {mine.score:.3f}: equal scores go "
                "to the least busy node, then to chance")
    text = (f"{winner} won with {mine.score:.3f}, {margin:.3f} ahead of {rival.node} "
            f"({rival.score:.3f})")
    difference = _difference(mine, rival)
    return f"{text}; the difference: {difference}" if difference else text


def why_won(bids: Sequence[ScoredBid], *, winner: str | None, outcome: str | None = None,
            error: str | None = None, candidates: Sequence[str] = (), state: str = "",
            moved_from: tuple[str, str] | None = None,
            excluded: Mapping[str, str] | None = None) -> list[str]:
    """Sentences saying why ``winner`` won the auction of ``bids`` (one attempt's answers) and
    why each other candidate did not: not eligible, refused, late, or silent.

    ``state`` is the task's state now (BIDDING: the auction is open; RETRYING, DEFERRED or
    PENDING without a winner: this attempt is not announced yet). ``moved_from`` is
    (node, reason) when a watchdog moved the task from the auction's winner to ``winner``, the
    next-best bidder. ``excluded`` maps each node the auction was to leave out (it failed the
    task or lost it: the announcement's ``exclude_nodes``) to why.
    """
    closed = state != states.BIDDING
    if moved_from is not None and winner is not None:
        lines = [f"{winner} holds it as the next-best bidder: it was moved from "
                 f"{moved_from[0]} ({moved_from[1]})"]
    elif winner is not None:
        lines = [_verdict(bids, winner, outcome)]
    elif not closed:
        lines = ["no winner yet: the auction is open"]
    elif state in states.DUE_STATES and not bids:
        return [f"no auction yet: the task is {state}, waiting to be announced"]
    else:
        lines = [f"no award: {error}" if error else "no award"]
    for b in sorted(bids, key=lambda b: b.node):
        if b.late:
            lines.append(f"{b.node} answered after the auction closed, too late to count")
        elif not b.will_bid:
            lines.append(f"{b.node} refused: {b.reason or 'no reason given'}")
        elif not b.breakdown.get("eligible", True):
            lines.append(f"{b.node} was not eligible: "
                         f"{b.breakdown.get('reason') or 'no reason given'}")
    for node, reason in (excluded or {}).items():
        if node in candidates:  # the reason says it was asked all the same
            lines.append(f"{node} was to be left out: {reason}")
        else:
            lines.append(f"{node} was not asked: {reason}")
    answered = {b.node for b in bids}
    for node in candidates:
        if node not in answered:
            lines.append(f"{node} did not answer within the bidding window" if closed
                         else f"{node} has not answered yet")
    return lines
