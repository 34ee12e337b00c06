"""Which role each route needs, and where it finds the scenario that the role must cover.

The decision itself (does this token have that role on that scenario?) is reef_lab/tenants.py's `Grant.check`; this
table only translates routes to it. Every route of the app has an entry: a route without one is refused (403) for
every token, and tests/test_tenants.py fails on it, so a new route cannot ship without a role. docs/api.md lists
the same table.

Where a route's scenario comes from:
- `path`: the `<name>` in its URL;
- `header`: `x-reef-scenario` (or `?scenario=`); none given: the role alone is checked, the gateway answers 400;
- `view`: the view checks it (a body field, each imported record, a stored change request's scenario, a list
  filtered to the token's scenarios, a status cut to them);
- None: the route is about no scenario (the model list, token counts).
"""

from __future__ import annotations

from flask import request

from reef_lab.errors import Forbidden
from reef_lab.tenants import Grant
from server.common import scenario

# endpoint -> (role, where its scenario comes from); role None: no token needed
ROUTES: dict[str, tuple[str | None, str | None]] = {
    "healthz": (None, None),
    "inference.count_tokens": ("agent", None),
    "inference.models": ("agent", None),
    "reef.status": ("agent", "view"),  # a token sees its own scenarios; only an admin of every one the deployment
    "reef.list_scenarios": ("reader", "view"),  # the token's own scenarios only
    "reef.create_scenario": ("admin", "view"),  # the body's name
    "reef.get_scenario": ("reader", "path"),
    "reef.delete_scenario": ("admin", "path"),
    "reef.list_records": ("reader", "path"),
    "reef.get_record": ("reader", "path"),
    "reef.import_records": ("admin", "view"),  # each record's scenario
    "reef.train": ("admin", "view"),  # x-reef-scenario or the body's scenario; a change request too
    "reef.get_request": ("reader", "view"),  # the stored request's scenario (404 outside the token's)
    "reef.list_requests": ("reader", "path"),
    "reef.releases": ("reader", "path"),
    "reef.rollback": ("admin", "path"),
    "reef.promote": ("admin", "path"),
    "reef.publish_harness": ("admin", "path"),
    "reef.get_harness": ("reader", "header"),
    "reef.harness_install": ("reader", "header"),
    "reef.get_episode": ("reader", "header"),
    "reef.get_scenario_episode": ("reader", "path"),
}

# the hot routes (server/hot.py, outside Flask's url_map): path -> role; the scenario is x-reef-scenario
HOT_ROUTES: dict[str, str] = {"/v1/chat/completions": "agent", "/v1/responses": "agent", "/v1/messages": "agent",
                              "/reef/report": "agent"}


def check_route(grant: Grant) -> None:
    """Refuse (403) the request Flask routed unless `grant` has the route's role on the route's scenario."""
    if request.url_rule is None:  # no such route or method: Flask answers 404 / 405
        return
    entry = ROUTES.get(request.endpoint)
    if entry is None:
        raise Forbidden(f"{request.method} {request.path} has no role in server/access.py ROUTES: refused for "
                        "every token until it has one")
    role, where = entry
    if role is None:
        return
    name = request.view_args.get("name") if where == "path" else \
        scenario() or request.args.get("scenario") if where == "header" else None
    grant.check(role, name)
