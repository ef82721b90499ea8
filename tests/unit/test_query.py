"""The ECS cluster query language (shoal.domain.query)."""

from datetime import datetime, timezone

import pytest

from shoal.domain.errors import InvalidParameter
from shoal.domain.query import And, Comparison, Expr, Host, Or, parse


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


GPU = Host(
    attributes={
        "ecs.instance-type": "g5.xlarge",
        "ecs.availability-zone": "us-east-1a",
        "stack": "prod",
        "ecs.capability.nvidia": None,  # present without a value
        "memory": "64",
    },
    agent_connected=True,
    agent_version="1.80.0",
    ec2_instance_id="i-0123456789abcdef0",
    registered_at=ts("2018-06-18T22:28:28"),
    running_tasks_count=3,
    task_groups=("service:web", "family:batch"),
)
BARE = Host(attributes={})


def m(expression: str, host: Host = GPU) -> bool:
    return parse(expression).matches(host)


def error(expression: str, field: str = "expression") -> str:
    with pytest.raises(InvalidParameter) as info:
        parse(expression, field)
    return str(info.value)


# -- AWS documentation examples -------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("attribute:ecs.instance-type =~ g5.*", True),
        ("attribute:ecs.availability-zone in [us-east-1a, us-east-1b]", True),
        ("task:group == service:web", True),
        ("attribute:ecs.instance-type == t2.small && attribute:ecs.availability-zone != us-east-1d", False),
        ("attribute:ecs.instance-type == g5.xlarge && attribute:ecs.availability-zone != us-east-1d", True),
        ("registeredAt < 2018-06-18", False),
        ("registeredAt > 2018-06-18", True),
        ("agentConnected == true && runningTasksCount > 1", True),
        ("attribute:stack exists", True),
        ("attribute:stack not_exists", False),
        ("attribute:ecs.instance-type =~ g5.* || attribute:ecs.instance-type =~ p4d.*", True),
        ("ec2InstanceId in ['i-0123456789abcdef0', 'i-abc']", True),
        ("agentVersion != 1.79.0", True),
    ],
)
def test_documented_examples(expression, expected):
    assert m(expression) is expected


def test_parse_returns_expr_nodes():
    expr = parse("attribute:a == 1 && (attribute:b == 2 || task:group == x)")
    assert isinstance(expr, And) and isinstance(expr, Expr)
    left, right = expr.operands
    assert isinstance(left, Comparison) and isinstance(right, Or)
    assert left.subject == "attribute:a" and left.operator == "==" and left.argument == "1"


def test_subjects():
    expr = parse("attribute:ecs.instance-type =~ g5.* && (task:group != x || runningTasksCount < 3)")
    assert expr.subjects() == {"attribute:ecs.instance-type", "task:group", "runningTasksCount"}
    assert parse("agentConnected == true").subjects() == {"agentConnected"}


# -- operators and synonyms -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "written, canonical",
    [
        ("==", "=="), ("equals", "=="), ("!=", "!="), ("not_equals", "!="),
        (">", ">"), (">=", ">="), ("<", "<"), ("<=", "<="),
        ("=~", "=~"), ("matches", "=~"), ("!~", "!~"), ("not_matches", "!~"),
    ],
)
def test_binary_operator_synonyms(written, canonical):
    assert parse(f"attribute:stack {written} prod").operator == canonical


@pytest.mark.parametrize("written, canonical", [("in", "in"), ("!in", "!in"), ("not_in", "!in")])
def test_list_operator_synonyms(written, canonical):
    expr = parse(f"attribute:stack {written} [prod]")
    assert expr.operator == canonical and expr.argument == ("prod",)


@pytest.mark.parametrize("written, canonical", [("exists", "exists"), ("!exists", "!exists"), ("not_exists", "!exists")])
def test_exists_synonyms(written, canonical):
    expr = parse(f"attribute:stack {written}")
    assert expr.operator == canonical and expr.argument is None


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("attribute:stack == prod", True),
        ("attribute:stack equals prod", True),
        ("attribute:stack == Prod", False),  # case-sensitive
        ("attribute:stack != prod", False),
        ("attribute:stack not_equals dev", True),
        ("attribute:stack in [dev, prod]", True),
        ("attribute:stack in [dev, test]", False),
        ("attribute:stack !in [dev, test]", True),
        ("attribute:stack not_in [prod]", False),
        ("attribute:stack =~ pr*", True),
        ("attribute:stack matches p?od", True),
        ("attribute:stack =~ p?d", False),
        ("attribute:stack !~ dev*", True),
        ("attribute:stack not_matches *rod", False),
        ("attribute:stack > dev", True),  # string comparison
        ("attribute:stack < dev", False),
        ("attribute:stack >= prod", True),
        ("attribute:stack <= prod", True),
    ],
)
def test_string_operators(expression, expected):
    assert m(expression) is expected


def test_operators_without_whitespace():
    assert m("attribute:stack==prod")
    assert m("attribute:stack!=dev&&runningTasksCount>=3")
    assert m("(attribute:stack==dev)||(attribute:stack=~p*)")
    assert m("attribute:stack in[dev,prod]")


# -- wildcards ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("g5.*", True), ("g5.xlarge", True), ("g5.", False), ("*.xlarge", True), ("g?.xlarge", True),
        ("g5.xlarg", False), ("G5.*", False), ("*", True), ("g5?xlarge", True), ("5.*", False),
        ("g5.x*e", True), ("'[gp]5.*'", True), ("'[!g]5.*'", False),
    ],
)
def test_wildcard_is_anchored_and_case_sensitive(pattern, expected):
    assert m(f"attribute:ecs.instance-type =~ {pattern}") is expected


def test_wildcard_dot_is_literal():
    host = Host(attributes={"t": "g5Xxlarge"})
    assert not m("attribute:t =~ g5.*", host)
    assert m("attribute:t =~ g5?*", host)


def test_wildcard_on_typed_subjects():
    assert m("agentConnected =~ t*")
    assert m("runningTasksCount =~ 3")
    assert m("registeredAt =~ 2018-06-18*")


# -- numbers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("runningTasksCount == 3", True),
        ("runningTasksCount == 03", True),  # integers, not strings
        ("runningTasksCount != 3", False),
        ("runningTasksCount > 1", True),
        ("runningTasksCount > 3", False),
        ("runningTasksCount >= 3", True),
        ("runningTasksCount < 10", True),  # numeric, not "3" < "10" as strings
        ("runningTasksCount <= 2", False),
        ("runningTasksCount in [1, 2, 3]", True),
        ("runningTasksCount !in [1, 2]", True),
    ],
)
def test_running_tasks_count_is_numeric(expression, expected):
    assert m(expression) is expected


def test_running_tasks_count_zero_on_bare_host():
    assert m("runningTasksCount == 0", BARE)
    assert m("runningTasksCount < 1", BARE)


def test_attribute_ordering_is_numeric_when_both_sides_are_numbers():
    assert m("attribute:memory > 8")  # "64" > "8" is false as strings
    assert m("attribute:memory <= 64.0")
    assert not m("attribute:memory < 1e1")
    assert m("attribute:stack > 5")  # "prod" is not a number: string comparison
    assert m("attribute:memory == 64") and not m("attribute:memory == 64.0")  # == is string equality


# -- agentConnected, agentVersion, ec2InstanceId --------------------------------------------------


def test_agent_connected_is_boolean():
    assert m("agentConnected == true") and m("agentConnected == TRUE")
    assert not m("agentConnected == false")
    assert m("agentConnected != false")
    assert m("agentConnected == false", BARE)
    assert m("agentConnected in [true]")


def test_optional_subjects():
    assert m("agentVersion =~ 1.*") and m("agentVersion exists")
    assert m("ec2InstanceId == i-0123456789abcdef0")
    assert not m("agentVersion exists", BARE) and m("agentVersion !exists", BARE)
    assert not m("ec2InstanceId == i-1", BARE) and m("ec2InstanceId != i-1", BARE)
    assert not m("registeredAt exists", BARE)
    assert m("agentConnected exists", BARE) and m("runningTasksCount exists", BARE)


# -- registeredAt ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argument",
    ["2018-06-18T22:28:28+00:00", "2018-06-18T22:28:28Z", "2018-06-18T22:28:28", "'2018-06-18T22:28:28'",
     "2018-06-19T00:28:28+02:00"],
)
def test_registered_at_formats(argument):
    assert m(f"registeredAt == {argument}")
    assert m(f"registeredAt >= {argument}") and m(f"registeredAt <= {argument}")
    assert not m(f"registeredAt > {argument}") and not m(f"registeredAt < {argument}")


def test_registered_at_date_only_is_midnight_utc():
    host = Host(attributes={}, registered_at=ts("2018-06-18T00:00:00"))
    assert m("registeredAt == 2018-06-18", host)
    assert m("registeredAt < 2018-06-18T00:00:01Z", host)
    assert m("registeredAt > 2018-06-17", host)
    assert not m("registeredAt < 2018-06-18", host)


def test_registered_at_missing():
    assert not m("registeredAt < 2030-01-01", BARE)
    assert m("registeredAt != 2030-01-01", BARE)


# -- missing attributes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("attribute:missing == x", False),
        ("attribute:missing != x", True),
        ("attribute:missing > 1", False),
        ("attribute:missing <= 1", False),
        ("attribute:missing in [x]", False),
        ("attribute:missing !in [x]", True),
        ("attribute:missing =~ *", False),
        ("attribute:missing !~ *", True),
        ("attribute:missing exists", False),
        ("attribute:missing !exists", True),
    ],
)
def test_missing_attribute(expression, expected):
    assert m(expression) is expected


def test_attribute_without_value_exists_but_compares_as_missing():
    assert m("attribute:ecs.capability.nvidia exists")
    assert not m("attribute:ecs.capability.nvidia !exists")
    assert not m("attribute:ecs.capability.nvidia =~ *")
    assert m("attribute:ecs.capability.nvidia != x")


# -- task:group -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("task:group == service:web", True),  # any task
        ("task:group == family:batch", True),
        ("task:group == service:api", False),
        ("task:group != service:web", False),  # no task may be in the group
        ("task:group != service:api", True),
        ("task:group in [service:api, family:batch]", True),
        ("task:group !in [service:api, family:batch]", False),
        ("task:group !in [service:api]", True),
        ("task:group =~ service:*", True),
        ("task:group !~ service:*", False),
        ("task:group !~ service:a*", True),
        ("task:group exists", True),
        ("task:group !exists", False),
    ],
)
def test_task_group_any_and_none(expression, expected):
    assert m(expression) is expected


def test_task_group_on_empty_host():
    assert not m("task:group == service:web", BARE)
    assert m("task:group != service:web", BARE)
    assert m("task:group !in [a, b]", BARE)
    assert m("task:group !exists", BARE)


# -- precedence, parentheses, strings, lists ------------------------------------------------------


T, F = "attribute:stack == prod", "attribute:stack == dev"


@pytest.mark.parametrize(
    "expression, expected",
    [
        (f"{T} || {F} && {F}", True),  # a || (b && c)
        (f"{F} && {F} || {T}", True),  # (a && b) || c
        (f"({T} || {F}) && {F}", False),
        (f"{T} && ({F} || {T})", True),
        (f"(({T}))", True),
        (f"( {F} || ( {F} || {T} ) ) && {T}", True),
        (f"{F} || {F} || {F}", False),
        (f"{T} && {T} && {F}", False),
    ],
)
def test_precedence_and_parentheses(expression, expected):
    assert m(expression) is expected


def test_precedence_tree_shape():
    expr = parse("attribute:a == 1 || attribute:b == 2 && attribute:c == 3")
    assert isinstance(expr, Or)
    assert isinstance(expr.operands[0], Comparison) and isinstance(expr.operands[1], And)


def test_quoted_strings():
    host = Host(attributes={"name": "my stack", "q": "it's", "d": 'say "hi"', "e": ""})
    assert m("attribute:name == 'my stack'", host)
    assert m('attribute:name == "my stack"', host)
    assert m('attribute:q == "it\'s"', host)
    assert m("attribute:d == 'say \"hi\"'", host)
    assert m("attribute:e == ''", host)
    assert m("attribute:name == 'my stack' && attribute:e exists", host)
    assert m("attribute:name == 'a && b' || attribute:name =~ 'my *'", host)
    assert parse("attribute:x == 'a)b'").argument == "a)b"


def test_lists():
    host = Host(attributes={"az": "us east"})
    expr = parse("attribute:az in [ 'us east' ,\"b\",c ]")
    assert expr.argument == ("us east", "b", "c")
    assert expr.matches(host)
    assert parse("attribute:az in [x]").argument == ("x",)


def test_bare_words():
    assert parse("attribute:t == 2018-06-18T22:28:28+00:00").argument == "2018-06-18T22:28:28+00:00"
    assert parse("attribute:t == a&b|c").argument == "a&b|c"
    assert parse("attribute:t =~ p?d*").argument == "p?d*"
    assert parse("attribute:t == x&&attribute:u == y").operands[0].argument == "x"
    assert parse("attribute:t == x||attribute:u == y").operands[0].argument == "x"


def test_attribute_names():
    for name in ["ecs.instance-type", "ecs.availability-zone", "stack", "com.example/gpu_count", "a\\b", "A1"]:
        assert parse(f"attribute:{name} exists").subject == f"attribute:{name}"


def test_evaluation_is_reusable():
    expr = parse("attribute:ecs.instance-type =~ g5.* && task:group != service:web")
    hosts = [Host(attributes={"ecs.instance-type": f"g{i % 6}.xlarge"}, task_groups=(f"service:s{i}",))
             for i in range(600)]
    assert sum(expr.matches(h) for h in hosts) == 100


# -- errors ---------------------------------------------------------------------------------------


def test_error_unknown_operator():
    message = error("attribute:ecs.instance-type foo bar")
    assert message == ("Invalid expression at position 28: expected an operator "
                       "(==, !=, >, >=, <, <=, in, !in, =~, !~, exists, !exists), got 'foo'")


def test_error_names_the_field():
    message = error("attribute:x ~= 1", "filter")
    assert message.startswith("Invalid expression in 'filter' at position 12: expected an operator")
    assert "got '~='" in message


def test_error_unknown_subject():
    message = error("foo == bar")
    assert "at position 0" in message and "unknown subject 'foo'" in message


def test_error_unknown_subject_after_operator():
    message = error("attribute:a == 1 && agentconnected == true")
    assert "at position 20" in message and "unknown subject 'agentconnected'" in message


def test_error_missing_subject():
    message = error("== 1")
    assert "at position 0" in message and "expected a subject" in message and "got '=='" in message


def test_error_missing_closing_bracket():
    message = error("attribute:az in [a, b")
    assert "at position 21" in message and "unexpected end of expression" in message and "']'" in message
    message = error("attribute:az in [a b]")
    assert "at position 19" in message and "expected ',' or ']'" in message and "got 'b'" in message


def test_error_in_without_list():
    message = error("attribute:az in a")
    assert "at position 16" in message and "expected '['" in message


def test_error_empty_list():
    message = error("attribute:az in []")
    assert "at position 17" in message and "expected a value" in message and "got ']'" in message


def test_error_unexpected_end():
    message = error("attribute:a ==")
    assert "at position 14" in message and "unexpected end of expression" in message and "a value" in message
    message = error("attribute:a == 1 &&")
    assert "at position 19" in message and "unexpected end of expression" in message
    message = error("attribute:a")
    assert "at position 11" in message and "unexpected end of expression" in message and "an operator" in message


def test_error_missing_closing_paren():
    message = error("(attribute:a == 1 || attribute:b == 2")
    assert "at position 37" in message and "expected ')'" in message


def test_error_unbalanced_closing_paren():
    message = error("attribute:a == 1)")
    assert "at position 16" in message and "expected '&&', '||' or the end of the expression" in message
    assert "got ')'" in message


def test_error_words_are_not_boolean_operators():
    message = error("attribute:a == 1 and attribute:b == 2")
    assert "at position 17" in message and "got 'and'" in message
    assert "at position 0: unknown subject 'not'" in error("not attribute:a exists")


def test_error_unterminated_string():
    message = error("attribute:a == 'abc")
    assert "at position 19" in message and "closing '" in message and "position 15" in message


def test_error_bad_attribute_name():
    assert "at position 10" in error("attribute: == x")
    assert "expected an attribute name" in error("attribute: == x")


def test_error_registered_at_not_a_date():
    message = error("registeredAt < yesterday")
    assert "at position 15" in message and "expected a date" in message and "'yesterday'" in message
    assert "at position 29" in error("registeredAt in [2018-06-18, 2018-13-45]")


def test_error_running_tasks_count_not_an_integer():
    message = error("runningTasksCount > many")
    assert "at position 20" in message and "expected an integer" in message and "'many'" in message
    assert "at position 21" in error("runningTasksCount >= 1.5")
    assert "expected an integer" in error("runningTasksCount == x")


def test_error_agent_connected():
    assert "expected true or false" in error("agentConnected == yes")
    message = error("agentConnected > true")
    assert "at position 15" in message and "got '>'" in message


def test_error_empty_expression():
    assert error("") == "Invalid expression: the expression is empty."
    assert error("   ", "filter") == "Invalid expression in 'filter': the expression is empty."
    assert "at position 1" in error("()")


def test_error_too_long():
    expression = "attribute:a == " + "x" * 1990
    assert error(expression) == f"Invalid expression: at most 2000 characters, got {len(expression)}."
    parse("attribute:a == " + "x" * 1985)  # exactly 2000 is fine


def test_error_too_deeply_nested():
    assert "nested parentheses" in error("(" * 100 + "attribute:a exists" + ")" * 100)
    assert m("(" * 20 + "attribute:stack exists" + ")" * 20)


def test_errors_are_invalid_parameter_exceptions():
    with pytest.raises(InvalidParameter) as info:
        parse("attribute:a ==")
    assert info.value.code == "InvalidParameterException"
