"""What a learner reads of the store: its own scenario's records, by kind or by id; nothing it can write."""

from __future__ import annotations


class RecordsReader:
    def __init__(self, store, scenario: str, since: float = 0.0):
        self._store, self.scenario, self._since = store, scenario, since

    @property
    def since(self) -> float:
        """When the scenario was created: records (and change requests) older than that are a deleted namesake's."""
        return self._since

    def ids(self, kind: str | None = None) -> list[str]:
        """Ids of the scenario's records (of one kind), oldest first."""
        return self._store.ids(self.scenario, kind, since=self._since)

    def get_many(self, ids: list[str]) -> list[dict]:
        """The records with these ids that exist (referenced records, typically), in the order asked."""
        return self._store.get_many(ids)

    def get(self, record_id: str) -> dict:
        return self._store.get(record_id)
