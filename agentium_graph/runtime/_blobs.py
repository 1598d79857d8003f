"""Reading content-addressed blobs back, each verified against the digest that names it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agentium_graph._canonical import digest_text
from agentium_graph.store._protocol import DurableTaskStore


@dataclass(frozen=True, slots=True)
class VerifiedBlobs:
    """``texts``: the blobs whose text hashes to their digest. ``missing``: digests the store
    does not have. ``damaged``: digests whose stored text hashes to something else."""

    texts: dict[str, str] = field(default_factory=dict)
    missing: frozenset[str] = frozenset()
    damaged: frozenset[str] = frozenset()

    def problem(self, blob_digest: str) -> str | None:
        """Why ``blob_digest`` cannot be used ("missing" / "damaged"), or None."""
        if blob_digest in self.missing:
            return "missing"
        if blob_digest in self.damaged:
            return "damaged"
        return None


async def read_verified(store: DurableTaskStore, digests: Iterable[str]) -> VerifiedBlobs:
    """Fetch ``digests`` in one call and check every text against its digest.

    A store holds blobs insert-if-absent under their digest, so a text that does not hash
    to its name was changed outside the runtime; callers decide whether that fails a node,
    stops a run or is listed as a problem.
    """
    wanted = sorted(set(digests))
    if not wanted:
        return VerifiedBlobs()
    found = await store.get_blobs(wanted)
    texts: dict[str, str] = {}
    missing: set[str] = set()
    damaged: set[str] = set()
    for want in wanted:
        text = found.get(want)
        if text is None:
            missing.add(want)
        elif digest_text(text) != want:
            damaged.add(want)
        else:
            texts[want] = text
    return VerifiedBlobs(texts, frozenset(missing), frozenset(damaged))
