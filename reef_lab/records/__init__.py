"""The records: the append-only store (log, segments, index), its reader, and retention."""


def __getattr__(name: str):
    """reef_lab.records was a module until issue 19: its names resolve from reef_lab.records.record, with a
    DeprecationWarning, until 0.3.0 (reef_lab/_moved.py)."""
    from reef_lab._moved import old_name

    return old_name(__name__, name)
