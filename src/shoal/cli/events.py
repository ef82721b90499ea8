"""`shoal events …`: read the event log of a running server, follow it, test event patterns, and
consume the durable queues that `queue:<name>` targets fill."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from shoal.cli import client
from shoal.cli.client import fail
from shoal.events.patterns import InvalidEventPattern, Pattern, compile_pattern

app = typer.Typer(no_args_is_help=True,
                  help="Read and follow shoal's event log, test event patterns, consume event queues.")
PAGE = 500
TAIL_IDLE_S = 0.2  # between polls of the event log when nothing new came
QUEUE_IDLE_S = 0.25  # between receives from an empty queue with --follow
QUEUE_BATCH = 100  # the most one receive returns (shoal.api.queues.MAX_RECEIVE)
QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")  # as shoal.api.queues.NAME


def text_arg(value: str, what: str) -> str:
    """A `JSON|@file` argument: the text itself, or the contents of a file (`@-`: standard input).
    A file that cannot be read exits 2."""
    if not value.startswith("@"):
        return value
    name = value[1:]
    try:
        return sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as err:
        fail(f"cannot read {what} from {name}: {err.strerror or err}", 2)


def _pattern(value: str) -> Pattern:
    try:
        return compile_pattern(text_arg(value, "the pattern"))
    except InvalidEventPattern as err:
        fail(f"InvalidEventPatternException: {err.message}", 2)


def _line(env: dict) -> str:
    detail = env["detail"]
    state = detail.get("lastStatus") or detail.get("status") or detail.get("eventName") or ""
    resource = env["resources"][0] if env["resources"] else ""
    return f"{env['time']}  {env['id']}  {env['detail-type']:<36} {state:<12} {resource}"


@app.command("list")
def list_events(
    since: Annotated[Optional[str], typer.Option(help="Start after this event id (or cursor).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many events.", min=1)] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array of full envelopes.")] = False,
) -> None:
    """List events, oldest first."""
    found: list[dict] = []
    after = since
    while len(found) < limit:
        page = client.call("GET", "/v1/events", {"after": after, "limit": min(PAGE, limit - len(found))})
        found.extend(page["events"])
        if len(page["events"]) == 0 or page["cursor"] == after:
            break
        after = page["cursor"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for env in found:
        typer.echo(_line(env))


def _end_cursor() -> str | None:
    """The cursor after the last event in the log now."""
    after = None
    while True:
        page = client.call("GET", "/v1/events", {"after": after, "limit": 1000})
        if not page["events"]:
            return page["cursor"] if after is None else after
        after = page["cursor"]


@app.command("tail")
def tail(
    pattern: Annotated[Optional[str], typer.Option(
        help="Print only events matching this EventBridge pattern (JSON, or @file).")] = None,
    since: Annotated[Optional[str], typer.Option(
        help="Start after this event id (or cursor) instead of at the end of the log.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print each event's full envelope as one JSON line.")] = False,
) -> None:
    """Follow the event log: print new events as they happen, until Ctrl-C.

    Starts at the end of the log (only events from now on) unless --since is given.
    """
    matcher = _pattern(pattern) if pattern is not None else None
    # SIGINT stops it even when it was started with SIGINT ignored (a background job, a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        after = since if since is not None else _end_cursor()
        while True:
            page = client.call("GET", "/v1/events", {"after": after, "limit": PAGE})
            for env in page["events"]:
                if matcher is None or matcher.matches(env):
                    typer.echo(json.dumps(env, separators=(",", ":")) if as_json else _line(env))
            if not page["events"]:
                time.sleep(TAIL_IDLE_S)
            after = page["cursor"]
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command("test-pattern")
def test_pattern(
    pattern: Annotated[str, typer.Option(help="The EventBridge event pattern (JSON, or @file; @- for stdin).")],
    event: Annotated[str, typer.Option(help="The event to test (a JSON object, or @file; @- for stdin).")],
) -> None:
    """Print `true` if the event matches the pattern, else `false`.

    Runs locally with the server's own matcher: no server needed. An invalid pattern prints
    EventBridge's error and exits 2, as does an event that is not a JSON object.
    """
    compiled = _pattern(pattern)
    text = text_arg(event, "the event")
    try:
        doc = json.loads(text)
    except ValueError as err:
        fail(f"the event is not valid JSON: {err}", 2)
    if not isinstance(doc, dict):
        fail("the event must be a JSON object", 2)
    typer.echo("true" if compiled.matches(doc) else "false")


def _body(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: printed as a JSON string, still one line


@app.command("consume")
def consume(
    queue: Annotated[str, typer.Argument(help="The queue's name (a `queue:<name>` target's <name>).")],
    max_messages: Annotated[Optional[int], typer.Option(
        "--max", min=1, help="Stop after this many messages (default: all there are; with --follow, never).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new messages until Ctrl-C.")] = False,
    ack: Annotated[bool, typer.Option("--ack/--no-ack", help="Acknowledge (delete) each message once printed.")] = True,
    visibility: Annotated[float, typer.Option(
        min=0, max=43200, help="Seconds a received message stays hidden from other readers before it comes "
                               "back unless acknowledged.")] = 30,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Print the whole message (id, event id, receive count, attributes, body).")] = False,
) -> None:
    """Receive messages from a durable queue and print each body as one JSON line.

    Messages are acknowledged after they are printed, unless --no-ack: then they come back after
    --visibility seconds. Without --follow, stops when the queue has nothing more to give.
    """
    if not QUEUE_NAME.fullmatch(queue):
        fail(f"invalid queue name {queue!r}: 1 to 80 letters, digits, '-' or '_'", 2)
    path = f"/v1/queues/{queue}"
    done = 0
    try:
        while max_messages is None or done < max_messages:
            batch = QUEUE_BATCH if max_messages is None else min(QUEUE_BATCH, max_messages - done)
            messages = client.call("GET", path + "/messages", {"max": batch, "visibility": visibility})["messages"]
            for msg in messages:
                body = _body(msg["body"])
                out = {**msg, "body": body} if verbose else body
                if verbose:
                    out.pop("receipt", None)
                typer.echo(json.dumps(out, separators=(",", ":")))
            if messages and ack:
                _ack(path, [m["receipt"] for m in messages])
            done += len(messages)
            if not messages:
                if not follow:
                    break
                time.sleep(QUEUE_IDLE_S)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def _ack(path: str, receipts: list[str]) -> None:
    client.call("POST", path + "/ack", body={"receipts": receipts})
