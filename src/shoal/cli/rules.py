"""`shoal rules …`: event rules and their targets, a thin layer over the server's EventBridge API
(the same calls as `aws events … --endpoint-url $SHOAL_ENDPOINT`).

Target Arns name where events go: `webhook+https://host/path`, `command:/abs/path`,
`file:/abs/path.jsonl` or `queue:<name>` (read with `shoal events consume <name>`).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Annotated, Optional

import typer
from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from shoal.cli import client
from shoal.cli.client import fail
from shoal.cli.events import text_arg

app = typer.Typer(no_args_is_help=True, help="Event rules and their targets (EventBridge API).")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's response as JSON.")]


@contextmanager
def _api():
    """Yield the events client; an API error prints `error: <Code>: <message>` and exits 1."""
    try:
        yield client.aws("events")
    except ClientError as err:
        error = err.response.get("Error", {})
        fail(f"{error.get('Code', 'Error')}: {error.get('Message', str(err))}")
    except ParamValidationError as err:
        fail(f"invalid parameters: {err}", 2)
    except BotoCoreError as err:
        fail(f"cannot reach shoal at {client.endpoint()}: {err}")


def _clean(resp: dict) -> dict:
    return {k: v for k, v in resp.items() if k != "ResponseMetadata"}


def _print_json(doc) -> None:
    typer.echo(json.dumps(doc, indent=2, default=str))


def _json(value: str, what: str):
    text = text_arg(value, what)
    try:
        return json.loads(text)
    except ValueError as err:
        fail(f"{what} is not valid JSON: {err}", 2)


@app.command("put")
def put(
    name: Annotated[str, typer.Argument(help="The rule's name (a new one, or one to replace).")],
    pattern: Annotated[str, typer.Option(help="The event pattern (JSON, or @file; @- for stdin).")],
    description: Annotated[Optional[str], typer.Option(help="A description.")] = None,
    disabled: Annotated[bool, typer.Option("--disabled", help="Create it disabled.")] = False,
) -> None:
    """Create or replace a rule matching events; print its Arn."""
    req = {"Name": name, "EventPattern": text_arg(pattern, "the pattern"),
           "State": "DISABLED" if disabled else "ENABLED"}
    if description is not None:
        req["Description"] = description
    with _api() as events:
        typer.echo(events.put_rule(**req)["RuleArn"])


@app.command("list")
def list_rules(
    prefix: Annotated[Optional[str], typer.Option(help="Only rules whose name starts with this.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List rules, by name."""
    rules: list[dict] = []
    req = {"NamePrefix": prefix} if prefix else {}
    with _api() as events:
        while True:
            resp = events.list_rules(**req)
            rules += resp["Rules"]
            if not resp.get("NextToken"):
                break
            req["NextToken"] = resp["NextToken"]
    if as_json:
        _print_json(rules)
        return
    width = max([len(r["Name"]) for r in rules] + [4])
    for r in rules:
        typer.echo(f"{r['Name']:<{width}}  {r['State']:<8}  {r.get('EventPattern', '')}")


@app.command("describe")
def describe(name: Annotated[str, typer.Argument(help="The rule's name.")]) -> None:
    """Print a rule as JSON."""
    with _api() as events:
        _print_json(_clean(events.describe_rule(Name=name)))


@app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="The rule's name.")],
    force: Annotated[bool, typer.Option("--force", help="Delete it even if it still has targets.")] = False,
) -> None:
    """Delete a rule (it must have no targets, unless --force)."""
    with _api() as events:
        events.delete_rule(Name=name, Force=force)


@app.command("enable")
def enable(name: Annotated[str, typer.Argument(help="The rule's name.")]) -> None:
    """Enable a rule: matching events go to its targets again."""
    with _api() as events:
        events.enable_rule(Name=name)


@app.command("disable")
def disable(name: Annotated[str, typer.Argument(help="The rule's name.")]) -> None:
    """Disable a rule: events stop going to its targets."""
    with _api() as events:
        events.disable_rule(Name=name)


def _failed(resp: dict) -> None:
    if resp.get("FailedEntryCount"):
        for entry in resp.get("FailedEntries", []):
            typer.echo(f"error: {entry.get('TargetId')}: {entry.get('ErrorCode')}: {entry.get('ErrorMessage')}",
                       err=True)
        raise typer.Exit(1)


@app.command("put-target")
def put_target(
    rule: Annotated[str, typer.Argument(help="The rule's name.")],
    target_id: Annotated[str, typer.Option("--id", help="The target's id within the rule (replaced if there).")],
    arn: Annotated[str, typer.Option(help="Where events go: webhook+https://…, command:/abs/path, "
                                          "file:/abs/path or queue:<name>.")],
    input_path: Annotated[Optional[str], typer.Option(
        help="Send only this JSONPath of the event, e.g. $.detail.")] = None,
    input_text: Annotated[Optional[str], typer.Option(
        "--input", help="Send this constant JSON instead of the event.")] = None,
    input_transformer: Annotated[Optional[str], typer.Option(
        help='{"InputPathsMap": {…}, "InputTemplate": "…"} (JSON, or @file).')] = None,
    max_attempts: Annotated[Optional[int], typer.Option(
        help="Retry a failed delivery at most this many times (RetryPolicy.MaximumRetryAttempts).")] = None,
    max_age: Annotated[Optional[int], typer.Option(
        help="Stop retrying an event this many seconds old (RetryPolicy.MaximumEventAgeInSeconds).")] = None,
    dlq: Annotated[Optional[str], typer.Option(
        help="Where events go when retries run out (a target Arn, e.g. queue:<name>).")] = None,
) -> None:
    """Add a target to a rule, or replace the one with the same id."""
    target: dict = {"Id": target_id, "Arn": arn}
    if input_path is not None:
        target["InputPath"] = input_path
    if input_text is not None:
        target["Input"] = text_arg(input_text, "the input")
    if input_transformer is not None:
        target["InputTransformer"] = _json(input_transformer, "the input transformer")
    retry = {k: v for k, v in (("MaximumRetryAttempts", max_attempts), ("MaximumEventAgeInSeconds", max_age))
             if v is not None}
    if retry:
        target["RetryPolicy"] = retry
    if dlq is not None:
        target["DeadLetterConfig"] = {"Arn": dlq}
    with _api() as events:
        _failed(events.put_targets(Rule=rule, Targets=[target]))


@app.command("remove-target")
def remove_target(
    rule: Annotated[str, typer.Argument(help="The rule's name.")],
    ids: Annotated[list[str], typer.Argument(help="The ids of the targets to remove.")],
) -> None:
    """Remove targets from a rule."""
    with _api() as events:
        _failed(events.remove_targets(Rule=rule, Ids=ids))


@app.command("targets")
def targets(
    rule: Annotated[str, typer.Argument(help="The rule's name.")],
    as_json: JsonOpt = False,
) -> None:
    """List a rule's targets."""
    found: list[dict] = []
    req: dict = {"Rule": rule}
    with _api() as events:
        while True:
            resp = events.list_targets_by_rule(**req)
            found += resp["Targets"]
            if not resp.get("NextToken"):
                break
            req["NextToken"] = resp["NextToken"]
    if as_json:
        _print_json(found)
        return
    width = max([len(t["Id"]) for t in found] + [2])
    for t in found:
        extras = [f"{k}={json.dumps(t[k], separators=(',', ':')) if not isinstance(t[k], str) else t[k]}"
                  for k in ("InputPath", "Input", "InputTransformer", "RetryPolicy", "DeadLetterConfig") if k in t]
        typer.echo("  ".join([f"{t['Id']:<{width}}", t["Arn"], *extras]).rstrip())
