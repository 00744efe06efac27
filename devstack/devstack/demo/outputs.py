"""Every output record the running count emitted, against the reference computed from its input.

The running count emits, for each batch that sees a user, the user's new total. So, per user,
the totals a read_committed consumer reads (in offset order: a user's records go to one output
partition) must strictly increase and end at the number of input records of that user. A
total repeated is an update applied twice or a batch emitted twice (a zombie's outputs, a
transaction a restart replayed); a total that goes back is a reordering or a batch reapplied
from an older state; a last total short of the reference is an update lost. Checking only each
user's last total would miss the first two.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass(frozen=True)
class OutputCheck:
    users: int
    records: int
    """Input records (the reference's total)."""
    lost: int
    """Updates of the reference missing from the users' last totals."""
    doubled: int
    """Updates counted more than once in the users' last totals."""
    disordered: int
    """Output records that do not raise their user's total (repeated or going back)."""
    unknown: tuple[str, ...]
    """Users with outputs and no input record."""
    examples: tuple[str, ...] = field(default=())
    """A few of the problems, for the story."""

    @property
    def exact(self) -> bool:
        return not (self.lost or self.doubled or self.disordered or self.unknown)

    def summary(self) -> str:
        verdict = "EXACT" if self.exact else "NOT EXACT"
        return (
            f"{self.users:,} users, {self.records:,} records; {self.lost} updates lost, "
            f"{self.doubled} applied twice, {self.disordered} output records repeated or out "
            f"of order: {verdict}"
        )


def check_outputs(
    reference: Mapping[str, int], outputs: Mapping[str, Iterable[int]], examples: int = 3
) -> OutputCheck:
    """Check every user's totals (`outputs`, in the order emitted) against `reference`."""
    lost = doubled = disordered = 0
    found: list[str] = []
    for user, expected in sorted(reference.items()):
        totals = list(outputs.get(user, ()))
        last = totals[-1] if totals else 0
        lost += max(0, expected - last)
        doubled += max(0, last - expected)
        for before, after in pairwise(totals):
            if after <= before:
                disordered += 1
                if len(found) < examples:
                    found.append(f"{user}: total {after} emitted after {before}")
        if last != expected and len(found) < examples:
            found.append(f"{user}: last total {last}, expected {expected}")
    unknown = tuple(sorted(set(outputs) - set(reference)))
    return OutputCheck(
        users=len(reference),
        records=sum(reference.values()),
        lost=lost,
        doubled=doubled,
        disordered=disordered,
        unknown=unknown,
        examples=tuple(found),
    )
