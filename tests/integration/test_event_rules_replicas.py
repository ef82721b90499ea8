"""Two servers on one PostgreSQL database share rules: a rule made through one applies to events
put through the other (each router reloads its index when the rules' version moves)."""

from __future__ import annotations

import json

import pytest

from tests.support import POSTGRES_URL, ServerProcess, fresh_postgres_database, wait_for

pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="SHOAL_TEST_POSTGRES_URL is not set "
                                                          "(.ci/run starts a PostgreSQL and sets it)")


def test_a_rule_made_through_one_server_routes_events_put_through_the_other(tmp_path):
    url = fresh_postgres_database()
    a = ServerProcess(tmp_path / "a", url).start()
    b = ServerProcess(tmp_path / "b", url).start()
    try:
        out = tmp_path / "out.jsonl"
        a.client("events").put_rule(Name="r", EventPattern=json.dumps({"source": ["custom.x"]}))
        a.client("events").put_targets(Rule="r", Targets=[{"Id": "f", "Arn": f"file:{out}"}])
        ids = [b.client("events").put_events(Entries=[{"Source": "custom.x", "DetailType": "t",
                                                      "Detail": json.dumps({"i": i})}])["Entries"][0]["EventId"]
               for i in range(10)]

        def delivered() -> set[str]:
            return {json.loads(line)["id"] for line in out.read_text().splitlines()} if out.exists() else set()

        wait_for(lambda: set(ids) <= delivered(), timeout=15, message="every event put through B")
        assert len(out.read_text().splitlines()) >= len(ids)
    finally:
        a.stop()
        b.stop()
