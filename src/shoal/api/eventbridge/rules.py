"""EventBridge rules and their targets, on the one event bus `default`.

A rule's pattern is validated and compiled when it is put (InvalidEventPatternException with
AWS's wording); targets are validated as a whole request, so a bad one writes nothing. Every
change sets `ctx.rules_changed`, which makes the router reload its index after the commit.
"""

from __future__ import annotations

import json

from sqlalchemy import delete, insert, select, update

from shoal.api.operations import Context, dumps, eventbridge
from shoal.api.ecs.common import page as ecs_page
from shoal.domain.errors import ApiError, NotFound
from shoal.events.dispatcher import RULES_VERSION
from shoal.events.patterns import InvalidEventPattern, compile_pattern
from shoal.events.transform import validate_target
from shoal.store.tables import event_cursors, event_rules, event_targets

BUS = "default"
MAX_TARGETS = 5  # per rule, as on AWS


def invalid(message: str) -> ApiError:
    return ApiError(message, "ValidationException")


def rules_changed(ctx: Context) -> None:
    """Bump the rules' version in this transaction: every server's router reloads its index
    before routing another event (so a rule made through one server applies on all), and this
    server's router is woken at once."""
    row = ctx.conn.execute(select(event_cursors.c.cursor).where(event_cursors.c.name == RULES_VERSION)
                           .with_for_update()).first()
    if row is None:
        ctx.conn.execute(insert(event_cursors).values(name=RULES_VERSION, cursor="1"))
    else:
        ctx.conn.execute(update(event_cursors).where(event_cursors.c.name == RULES_VERSION)
                         .values(cursor=str(int(row.cursor) + 1)))
    ctx.rules_changed = True


def check_pattern(text: str) -> None:
    try:
        compile_pattern(text)
    except InvalidEventPattern as err:
        raise ApiError(err.message, "InvalidEventPatternException") from None


def page(items: list, req: dict) -> tuple[list, str | None]:
    try:
        return ecs_page(items, {"maxResults": req.get("Limit"), "nextToken": req.get("NextToken")})
    except ApiError:
        raise invalid("Parameter NextToken is not valid.") from None


def _bus(ctx: Context, req: dict) -> str:
    name = req.get("EventBusName") or BUS
    if name not in (BUS, bus_arn(ctx)):
        raise NotFound(f"Event bus {name} does not exist.")
    return BUS


def bus_arn(ctx: Context) -> str:
    return ctx.arns.make("event-bus", BUS, service="events")


def _rule(ctx: Context, req: dict, key: str = "Name", *, for_update: bool = False):
    stmt = select(event_rules).where(event_rules.c.bus == _bus(ctx, req), event_rules.c.name == req[key])
    row = ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()
    if row is None:
        raise NotFound(f"Rule {req[key]} does not exist on EventBus {BUS}.")
    return row


@eventbridge.op("PutRule")
def put_rule(ctx: Context, req: dict) -> dict:
    bus, name = _bus(ctx, req), req["Name"]
    if req.get("ScheduleExpression"):
        raise invalid("Parameter ScheduleExpression is not supported: shoal's rules match events.")
    pattern = req.get("EventPattern")
    if not pattern:
        raise invalid("Parameter(s) EventPattern or ScheduleExpression must be specified.")
    check_pattern(pattern)
    state = req.get("State", "ENABLED")
    if state not in ("ENABLED", "DISABLED"):
        raise invalid(f"Parameter State is not valid: shoal supports ENABLED and DISABLED, not {state}.")
    arn = ctx.arns.make("rule", name, service="events")
    doc = {"Name": name, "Arn": arn, "EventPattern": pattern, "State": state, "EventBusName": bus,
           "CreatedBy": ctx.arns.account}
    for key in ("Description", "RoleArn"):
        if req.get(key):
            doc[key] = req[key]
    row = ctx.conn.execute(select(event_rules.c.version).where(event_rules.c.arn == arn).with_for_update()).first()
    if row is None:
        ctx.conn.execute(insert(event_rules).values(bus=bus, name=name, arn=arn, state=state, pattern=pattern,
                                                    version=1, doc=dumps(doc)))
    else:
        ctx.conn.execute(update(event_rules).where(event_rules.c.arn == arn).values(
            state=state, pattern=pattern, version=row.version + 1, doc=dumps(doc)))
    rules_changed(ctx)
    return {"RuleArn": arn}


@eventbridge.op("DescribeRule", write=False)
def describe_rule(ctx: Context, req: dict) -> dict:
    return json.loads(_rule(ctx, req).doc)


@eventbridge.op("ListRules", write=False)
def list_rules(ctx: Context, req: dict) -> dict:
    stmt = select(event_rules.c.doc).where(event_rules.c.bus == _bus(ctx, req)).order_by(event_rules.c.name)
    if req.get("NamePrefix"):
        stmt = stmt.where(event_rules.c.name.startswith(req["NamePrefix"], autoescape=True))
    docs = [json.loads(d) for d in ctx.conn.execute(stmt).scalars()]
    rules, token = page(docs, req)
    return {"Rules": [{k: v for k, v in r.items() if k != "CreatedBy"} for r in rules],
            **({"NextToken": token} if token else {})}


def _set_state(ctx: Context, req: dict, state: str) -> dict:
    row = _rule(ctx, req, for_update=True)
    doc = json.loads(row.doc)
    doc["State"] = state
    ctx.conn.execute(update(event_rules).where(event_rules.c.arn == row.arn).values(
        state=state, version=row.version + 1, doc=dumps(doc)))
    rules_changed(ctx)
    return {}


@eventbridge.op("EnableRule")
def enable_rule(ctx: Context, req: dict) -> dict:
    return _set_state(ctx, req, "ENABLED")


@eventbridge.op("DisableRule")
def disable_rule(ctx: Context, req: dict) -> dict:
    return _set_state(ctx, req, "DISABLED")


@eventbridge.op("DeleteRule")
def delete_rule(ctx: Context, req: dict) -> dict:
    try:
        row = _rule(ctx, req, for_update=True)
    except NotFound:
        return {}  # as on AWS: deleting a rule that is not there succeeds
    if not req.get("Force") and ctx.conn.execute(
            select(event_targets.c.target_id).where(event_targets.c.rule_arn == row.arn)).first():
        raise invalid("Rule can't be deleted since it has targets.")
    ctx.conn.execute(delete(event_targets).where(event_targets.c.rule_arn == row.arn))
    ctx.conn.execute(delete(event_rules).where(event_rules.c.arn == row.arn))
    rules_changed(ctx)
    return {}


@eventbridge.op("PutTargets")
def put_targets(ctx: Context, req: dict) -> dict:
    row = _rule(ctx, req, "Rule", for_update=True)
    ids = [t["Id"] for t in req["Targets"]]
    if len(set(ids)) != len(ids):
        raise invalid("Parameter Targets contains the same Id twice.")
    for i, target in enumerate(req["Targets"]):
        try:
            validate_target(target, index=i)
        except ValueError as err:
            raise invalid(str(err)) from None
        dlq = (target.get("DeadLetterConfig") or {}).get("Arn")
        if dlq and not dlq.startswith("queue:"):  # the dispatcher can only put dead letters on a queue
            raise invalid(f"Targets[{i}].DeadLetterConfig.Arn: a dead-letter queue is a shoal queue, "
                          f"queue:<name>; got {dlq[:80]!r}")
    existing = set(ctx.conn.execute(select(event_targets.c.target_id)
                                    .where(event_targets.c.rule_arn == row.arn)).scalars())
    if len(existing | set(ids)) > MAX_TARGETS:
        raise ApiError(f"The requested resource exceeds the maximum number allowed: a rule has at most "
                       f"{MAX_TARGETS} targets.", "LimitExceededException")
    for target in req["Targets"]:
        ctx.conn.execute(delete(event_targets).where(event_targets.c.rule_arn == row.arn,
                                                     event_targets.c.target_id == target["Id"]))
        ctx.conn.execute(insert(event_targets).values(rule_arn=row.arn, target_id=target["Id"], doc=dumps(target)))
    rules_changed(ctx)
    return {"FailedEntryCount": 0, "FailedEntries": []}


@eventbridge.op("RemoveTargets")
def remove_targets(ctx: Context, req: dict) -> dict:
    row = _rule(ctx, req, "Rule", for_update=True)
    ctx.conn.execute(delete(event_targets).where(event_targets.c.rule_arn == row.arn,
                                                 event_targets.c.target_id.in_(req["Ids"])))
    rules_changed(ctx)
    return {"FailedEntryCount": 0, "FailedEntries": []}


@eventbridge.op("ListTargetsByRule", write=False)
def list_targets_by_rule(ctx: Context, req: dict) -> dict:
    row = _rule(ctx, req, "Rule")
    docs = [json.loads(d) for d in ctx.conn.execute(
        select(event_targets.c.doc).where(event_targets.c.rule_arn == row.arn)
        .order_by(event_targets.c.target_id)).scalars()]
    targets, token = page(docs, req)
    return {"Targets": targets, **({"NextToken": token} if token else {})}
