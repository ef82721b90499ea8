"""The ECS cluster query language: `memberOf` placement constraints and the ListContainerInstances `filter`.

Grammar (EBNF; whitespace may separate any two tokens):

    expression = conjunction { "||" conjunction } ;
    conjunction = primary { "&&" primary } ;           (* so `&&` binds tighter than `||` *)
    primary    = "(" expression ")" | comparison ;
    comparison = subject ( unary_op | list_op list | binary_op value ) ;
    subject    = "agentConnected" | "agentVersion" | "attribute:" name | "ec2InstanceId"
               | "registeredAt" | "runningTasksCount" | "task:group" ;
    name       = { letter | digit | "." | "-" | "_" | "/" | "\\" } ;   (* 1 to 128 characters *)
    unary_op   = "exists" | "!exists" | "not_exists" ;
    list_op    = "in" | "!in" | "not_in" ;
    binary_op  = "==" | "equals" | "!=" | "not_equals" | ">" | ">=" | "<" | "<="
               | "=~" | "matches" | "!~" | "not_matches" ;
    list       = "[" value { "," value } "]" ;
    value      = bare_word | "'" { any char but "'" } "'" | '"' { any char but '"' } '"' ;
    bare_word  = ? characters up to whitespace, ")", "]", ",", "&&" or "||" ? ;

Why a hand-written recursive-descent parser: the language is tiny, the errors must name the exact
0-based position and the token that was expected (the API returns them to the client), and an
expression is parsed once but evaluated against thousands of hosts. So all the work that does
not depend on the host happens at parse time: operator synonyms are folded into one canonical
form, arguments are converted to the subject's type (booleans, integers, epoch seconds), and
wildcard patterns are compiled to regexes; evaluation then only calls small closures.

Every comparison is evaluated the same way: the subject yields zero or more values for a host
(none when the attribute is missing, one per task for `task:group`), the comparison holds when
ANY value satisfies the positive form of the operator, and the negative operators (`!=`, `!in`,
`!~`, `!exists`) are the negation of the whole thing. That gives both "a missing attribute fails
every comparison except the negative ones" and the any/none semantics of `task:group`.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from shoal.domain.errors import InvalidParameter

MAX_LENGTH = 2000
MAX_DEPTH = 32  # nested parentheses; keeps the recursive parser well inside Python's stack

# subject -> kind: how arguments are converted and how host values are compared
SUBJECTS = {
    "agentConnected": "bool",
    "agentVersion": "str",
    "ec2InstanceId": "str",
    "registeredAt": "date",
    "runningTasksCount": "int",
    "task:group": "str",
}
# operator as written -> (canonical form, positive form, negated)
OPERATORS = {
    "==": ("==", "==", False), "equals": ("==", "==", False),
    "!=": ("!=", "==", True), "not_equals": ("!=", "==", True),
    ">": (">", ">", False), ">=": (">=", ">=", False), "<": ("<", "<", False), "<=": ("<=", "<=", False),
    "in": ("in", "in", False), "!in": ("!in", "in", True), "not_in": ("!in", "in", True),
    "=~": ("=~", "=~", False), "matches": ("=~", "=~", False),
    "!~": ("!~", "=~", True), "not_matches": ("!~", "=~", True),
    "exists": ("exists", "exists", False), "!exists": ("!exists", "exists", True),
    "not_exists": ("!exists", "exists", True),
}
_OPERATOR_LIST = "==, !=, >, >=, <, <=, in, !in, =~, !~, exists, !exists"
_ORDERING = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}

_SUBJECT = re.compile(r"[A-Za-z0-9_.:\-/\\]+")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.\-/\\]{1,128}")
_OPERATOR = re.compile(r"==|!=|>=|<=|=~|!~|>|<|!?[A-Za-z_]+")
_BARE_WORD = re.compile(r"(?:[^\s)\],&|]|&(?!&)|\|(?!\|))+")
_GOT = re.compile(r"[^\s()\[\],]+|.", re.S)
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?")


@dataclass(frozen=True)
class Host:
    """What an expression is evaluated against: one container instance."""

    attributes: dict[str, str | None]
    agent_connected: bool = False
    agent_version: str | None = None
    ec2_instance_id: str | None = None
    registered_at: float | None = None  # epoch seconds, UTC
    running_tasks_count: int = 0
    task_groups: tuple[str, ...] = ()


class Expr:
    """A parsed expression; `Comparison`, `And` and `Or` are its nodes."""

    def matches(self, host: Host) -> bool:
        raise NotImplementedError

    def subjects(self) -> set[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class Comparison(Expr):
    subject: str  # as written, e.g. "attribute:ecs.instance-type"
    operator: str  # canonical: ==, !=, >, >=, <, <=, in, !in, =~, !~, exists, !exists
    argument: str | tuple[str, ...] | None  # as written (unquoted); a tuple for in/!in
    values: Callable[[Host], Any] = field(repr=False, compare=False)  # host -> iterable of values
    test: Callable[[Any], bool] = field(repr=False, compare=False)  # the positive operator
    negated: bool = field(repr=False, compare=False)

    def matches(self, host: Host) -> bool:
        for value in self.values(host):
            if self.test(value):
                return not self.negated
        return self.negated

    def subjects(self) -> set[str]:
        return {self.subject}


@dataclass(frozen=True)
class _Junction(Expr):
    operands: tuple[Expr, ...]

    def subjects(self) -> set[str]:
        return set().union(*(o.subjects() for o in self.operands))


class And(_Junction):
    def matches(self, host: Host) -> bool:
        for operand in self.operands:
            if not operand.matches(host):
                return False
        return True


class Or(_Junction):
    def matches(self, host: Host) -> bool:
        for operand in self.operands:
            if operand.matches(host):
                return True
        return False


def parse(expression: str, field: str = "expression") -> Expr:
    """Parse `expression`; errors are `InvalidParameter` naming `field` and the position."""
    prefix = "Invalid expression" if field == "expression" else f"Invalid expression in {field!r}"
    if len(expression) > MAX_LENGTH:
        raise InvalidParameter(f"{prefix}: at most {MAX_LENGTH} characters, got {len(expression)}.")
    if not expression.strip():
        raise InvalidParameter(f"{prefix}: the expression is empty.")
    return _Parser(expression, prefix).parse()


def _number(text: str) -> float | None:
    return float(text) if _NUMBER.fullmatch(text) else None


def _date(text: str) -> float | None:
    if not _DATE.fullmatch(text):
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def _as_text(kind: str) -> Callable[[Any], str]:
    """How a host value of this kind reads for wildcard matching."""
    if kind == "bool":
        return lambda v: "true" if v else "false"
    if kind == "int":
        return str
    if kind == "date":
        return lambda v: datetime.fromtimestamp(v, timezone.utc).isoformat()
    return lambda v: v


def _values_getter(subject: str, positive: str) -> Callable[[Host], Any]:
    if subject.startswith("attribute:"):
        name = subject[len("attribute:"):]
        if positive == "exists":  # present, even without a value
            return lambda h: (True,) if name in h.attributes else ()

        def attribute(h: Host) -> tuple[str, ...]:
            value = h.attributes.get(name)
            return () if value is None else (value,)

        return attribute
    if subject == "task:group":
        return lambda h: h.task_groups
    if subject == "agentConnected":
        return lambda h: (h.agent_connected,)
    if subject == "runningTasksCount":
        return lambda h: (h.running_tasks_count,)
    attr = {"agentVersion": "agent_version", "ec2InstanceId": "ec2_instance_id", "registeredAt": "registered_at"}[subject]

    def optional(h: Host) -> tuple[Any, ...]:
        value = getattr(h, attr)
        return () if value is None else (value,)

    return optional


class _Parser:
    def __init__(self, text: str, prefix: str):
        self.text, self.prefix, self.pos, self.depth = text, prefix, 0, 0

    def error(self, pos: int, message: str) -> InvalidParameter:
        return InvalidParameter(f"{self.prefix} at position {pos}: {message}")

    def expected(self, what: str, pos: int | None = None) -> InvalidParameter:
        pos = self.pos if pos is None else pos
        if pos >= len(self.text):
            return self.error(pos, f"unexpected end of expression, expected {what}")
        got = _GOT.match(self.text, pos).group()[:40]
        return self.error(pos, f"expected {what}, got {got!r}")

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def eat(self, token: str) -> bool:
        self.skip_ws()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def match(self, pattern: re.Pattern[str]) -> tuple[int, str | None]:
        self.skip_ws()
        start, m = self.pos, pattern.match(self.text, self.pos)
        if not m:
            return start, None
        self.pos = m.end()
        return start, m.group()

    def parse(self) -> Expr:
        expr = self.expression()
        self.skip_ws()
        if self.pos < len(self.text):
            raise self.expected("'&&', '||' or the end of the expression")
        return expr

    def expression(self) -> Expr:
        operands = [self.conjunction()]
        while self.eat("||"):
            operands.append(self.conjunction())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def conjunction(self) -> Expr:
        operands = [self.primary()]
        while self.eat("&&"):
            operands.append(self.primary())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def primary(self) -> Expr:
        if not self.eat("("):
            return self.comparison()
        if self.depth >= MAX_DEPTH:
            raise self.error(self.pos - 1, f"expected at most {MAX_DEPTH} nested parentheses")
        self.depth += 1
        expr = self.expression()
        if not self.eat(")"):
            raise self.expected("')'")
        self.depth -= 1
        return expr

    def comparison(self) -> Comparison:
        subject, kind = self.subject()
        op_pos, written = self.match(_OPERATOR)
        if written not in OPERATORS:
            raise self.expected(f"an operator ({_OPERATOR_LIST})", op_pos)
        canonical, positive, negated = OPERATORS[written]
        if kind == "bool" and positive in _ORDERING:
            raise self.error(op_pos, f"expected an operator usable with agentConnected (==, !=, in, !in, "
                                     f"=~, !~, exists, !exists), got {written!r}")
        argument: str | tuple[str, ...] | None = None
        if positive == "exists":
            test: Callable[[Any], bool] = lambda v: True
        elif positive == "in":
            items = self.value_list()
            argument = tuple(text for _, text in items)
            members = frozenset(self.convert(kind, text, pos) for pos, text in items)
            test = members.__contains__
        else:
            pos, argument = self.value()
            test = self.binary_test(kind, positive, argument, pos)
        return Comparison(subject, canonical, argument, _values_getter(subject, positive), test, negated)

    def subject(self) -> tuple[str, str]:
        pos, word = self.match(_SUBJECT)
        if word is None:
            raise self.expected("a subject (agentConnected, agentVersion, attribute:<name>, ec2InstanceId, "
                                "registeredAt, runningTasksCount or task:group)")
        if word.startswith("attribute:"):
            if not _ATTRIBUTE_NAME.fullmatch(word[len("attribute:"):]):
                raise self.error(pos + len("attribute:"), "expected an attribute name (1 to 128 letters, digits, "
                                 f"'.', '-', '_', '/' or '\\') after 'attribute:', got {word[10:]!r}")
            return word, "str"
        if word not in SUBJECTS:
            raise self.error(pos, f"unknown subject {word!r}, expected agentConnected, agentVersion, "
                                  "attribute:<name>, ec2InstanceId, registeredAt, runningTasksCount or task:group")
        return word, SUBJECTS[word]

    def value(self) -> tuple[int, str]:
        self.skip_ws()
        start = self.pos
        if start < len(self.text) and self.text[start] in "'\"":
            end = self.text.find(self.text[start], start + 1)
            if end < 0:
                raise self.error(len(self.text), f"expected a closing {self.text[start]} for the string "
                                                 f"that starts at position {start}")
            self.pos = end + 1
            return start, self.text[start + 1:end]
        _, word = self.match(_BARE_WORD)
        if word is None:
            raise self.expected("a value")
        return start, word

    def value_list(self) -> list[tuple[int, str]]:
        if not self.eat("["):
            raise self.expected("'[' to start a list of values")
        items = [self.value()]
        while self.eat(","):
            items.append(self.value())
        if not self.eat("]"):
            raise self.expected("',' or ']'")
        return items

    def convert(self, kind: str, text: str, pos: int) -> Any:
        """An argument in the subject's type, for ==, in and the ordering operators."""
        if kind == "bool":
            if text.lower() not in ("true", "false"):
                raise self.error(pos, f"expected true or false, got {text!r}")
            return text.lower() == "true"
        if kind == "int":
            if not _INTEGER.fullmatch(text):
                raise self.error(pos, f"expected an integer, got {text!r}")
            return int(text)
        if kind == "date":
            parsed = _date(text)
            if parsed is None:
                raise self.error(pos, f"expected a date such as 2018-06-18 or 2018-06-18T22:28:28Z, got {text!r}")
            return parsed
        return text

    def binary_test(self, kind: str, positive: str, text: str, pos: int) -> Callable[[Any], bool]:
        if positive == "=~":
            regex, as_text = re.compile(fnmatch.translate(text)), _as_text(kind)
            return lambda v: regex.match(as_text(v)) is not None
        argument = self.convert(kind, text, pos)
        if positive == "==":
            return lambda v: v == argument
        compare = _ORDERING[positive]
        number = _number(text) if kind == "str" else None
        if number is None:
            return lambda v: compare(v, argument)

        def numeric_if_possible(v: str) -> bool:
            value = _number(v)
            return compare(v, argument) if value is None else compare(value, number)

        return numeric_if_possible
