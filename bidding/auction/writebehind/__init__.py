"""The write-behind journal of new proxy awards (``bidding_award_journal``).

A new task whose candidates the caller may all bid for is decided in the caller, from one
read of the bidders' state; what the award's transaction wrote (the announcement, the scored
bids, the award and their messages) goes instead into a Redis stream, in one Lua call that
also reserves the winner, and the caller sends the execution at once. The node workers'
writers (one loop each, a consumer group) write the entries to the store in batches, one
transaction per batch, and acknowledge them after its commit; the winner waits for its
entry's row before it starts, and writes it itself if no writer has (``settle``).
docs/architecture.md section 19a lists the invariants and the crash points; in short:

- The Lua call is the award: the task, its bids and its winner are in Redis (the ``pending``
  hash and the stream) or in the store, never neither, and nothing else can award the task
  until it is in the store (it has a fresh id: no other closer knows it).
- Writing is idempotent: an entry's announcement is inserted once and the rest only with it,
  so a batch replayed after a writer was killed between its commit and its acknowledgement,
  or an entry a winner wrote first, is written once.
- Reservations: the winner's task id is in its Redis set from the award until its entry is in
  the store, and the next award counts it; the set is read before the store, so an award may
  count a task twice for a moment, never not at all. Each node's reservations have a version,
  counted up by every reserve and release; the award's compare-and-set on its winner's
  version makes concurrent awards spread as the store's row locks do (a count could fall and
  rise back between the read and the append, and two awards take the same slot).
- An append whose reply was lost (a timeout, a reset connection) may have been taken: the
  caller asks the journal before it falls back to the store, and when Redis cannot say, the
  store's award inserts the announcement once, so that it and a writer's never both land
  (``AppendUnknown``, ``announce._award_behind``).
- An entry the store refuses, or that this version cannot read, does not hold up the others
  of its batch (``write_isolated``, ``Writer``): refused, its task ends FAILED and leaves the
  journal (``refused.fail_unrecorded``); unreadable, it waits for a writer that can read it
  (a newer version's), for ``UNREADABLE_GRACE`` at most.
"""


from bidding.auction.writebehind.award import award_behind
from bidding.auction.writebehind.journal import (
    BATCH,
    GROUP,
    STALE,
    UNREADABLE_GRACE,
    WINNER_WAIT,
    WRITER_PAUSE,
    AlreadyJournaled,
    AppendUnknown,
    Entry,
    Journal,
    Reservations,
    Unreadable,
    get_journal,
    read_entry,
)
from bidding.auction.writebehind.writer import (
    Writer,
    Written,
    settle,
    wait_written,
    write_entries,
    write_isolated,
)

__all__ = [
    "BATCH", "GROUP", "STALE", "UNREADABLE_GRACE", "WINNER_WAIT", "WRITER_PAUSE",
    "AlreadyJournaled", "AppendUnknown", "Entry", "Journal", "Reservations", "Unreadable",
    "Writer", "Written", "award_behind", "get_journal", "read_entry", "settle",
    "wait_written", "write_entries", "write_isolated",
]
