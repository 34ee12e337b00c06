"""The gateway: serving, records and reports of one data dir over one engine, split along the data path
(inference, reports, episodes, admin, learners, relay) under the facade in gateway.py."""


def __getattr__(name: str):
    """reef_lab.gateway was a module until issue 19: its names resolve from reef_lab.gateway.gateway, with a
    DeprecationWarning, until 0.3.0 (reef_lab/_moved.py)."""
    from reef_lab._moved import old_name

    return old_name(__name__, name)
