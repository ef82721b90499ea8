"""The pattern engine's pitfalls, one small test each (event-ruler 2.x semantics throughout)."""

from __future__ import annotations

import pytest

from shoal.events.patterns import InvalidEventPattern, RuleIndex, compile_pattern


def matches(pattern, event) -> bool:
    """Pattern.matches, checked against RuleIndex so both paths see every case."""
    compiled = compile_pattern(pattern)
    result = compiled.matches(event)
    index = RuleIndex()
    index.add("r", compiled)
    assert index.match(event) == ({"r"} if result else set())
    return result


def reason(pattern) -> str:
    with pytest.raises(InvalidEventPattern) as caught:
        compile_pattern(pattern)
    assert caught.value.message == "Event pattern is not valid. Reason: " + caught.value.reason
    return caught.value.reason


# --- booleans, numbers, strings ------------------------------------------------------------

@pytest.mark.parametrize("pattern, value, expected", [
    ([1], True, False), ([True], 1, False), ([0], False, False), ([False], 0, False),
    ([True], True, True), ([False], False, True),
    ([{"numeric": [">", 0]}], True, False), ([{"numeric": ["=", 1]}], True, False),
    ([{"anything-but": [1]}], True, True),   # a boolean is never the number 1
    ([{"anything-but": 0}], False, True),
])
def test_booleans_are_not_numbers(pattern, value, expected):
    assert matches({"v": pattern}, {"v": value}) is expected


@pytest.mark.parametrize("pattern, value, expected", [
    ([300], 300.0, True), ([300], 3e2, True), ([5.0], 5, True), ([3.018e2], 301.8, True),
    ([300], "300", False), (["300"], 300, False),
    ([{"numeric": ["=", 5]}], 5.0, True), ([{"anything-but": [5]}], 5.0, False),
    ([{"anything-but": [5]}], "5", True),
    ([-0.0], 0, True),
])
def test_numbers_compare_as_numbers_and_never_as_strings(pattern, value, expected):
    assert matches({"v": pattern}, {"v": value}) is expected


def test_numbers_compare_as_float64_like_event_ruler():
    assert matches({"v": [9007199254740993]}, {"v": 9007199254740992})  # same double
    assert matches({"v": [10**30]}, {"v": 1e30})
    huge = 10**400  # no float64 for it: only the same number matches
    assert matches({"v": [huge]}, {"v": huge})
    assert not matches({"v": [huge]}, {"v": huge + 1})
    assert matches({"v": [{"numeric": [">", 1e308]}]}, {"v": huge})  # as +infinity
    assert matches('{"v": [1e400]}', {"v": float("inf")})


def test_numeric_range_accepts_full_float64_range():
    assert matches({"v": [{"numeric": [">", -1e300, "<", 1e300]}]}, {"v": 6e9})
    assert not matches({"v": [{"numeric": [">", 0]}]}, {"v": float("nan")})


@pytest.mark.parametrize("value, expected", [(None, True), ("null", False), ("", False), ("x", False)])
def test_null_matches_only_null(value, expected):
    assert matches({"v": [None]}, {"v": value}) is expected
    assert not matches({"v": [None]}, {})  # a missing field is not null


@pytest.mark.parametrize("value, expected", [("", True), (None, False), ([], False), ([""], True)])
def test_empty_string(value, expected):
    assert matches({"v": [""]}, {"v": value}) is expected


def test_strings_are_exact_and_case_sensitive():
    assert matches({"v": ["Running "]}, {"v": "Running "})
    assert not matches({"v": ["Running"]}, {"v": "running"})
    assert not matches({"V": ["x"]}, {"v": "x"})


def test_ip_address_literals_match_the_address():
    assert matches({"ip": ["10.0.0.1"]}, {"ip": "10.0.0.1"})
    assert matches({"ip": ["2001:db8::1"]}, {"ip": "2001:0db8:0:0:0:0:0:1"})
    assert not matches({"ip": ["10.0.0.1"]}, {"ip": "10.0.0.2"})


# --- arrays --------------------------------------------------------------------------------

def test_array_values_match_when_any_element_matches():
    assert matches({"r": ["a", "b"]}, {"r": ["c", "b"]})
    assert not matches({"r": ["a"]}, {"r": ["c", "d"]})
    assert matches({"r": [{"anything-but": "x"}]}, {"r": ["x", "y"]})
    assert not matches({"r": [{"anything-but": "x"}]}, {"r": ["x"]})
    assert matches({"r": [{"numeric": [">", 10]}]}, {"r": [1, 20]})


def test_arrays_of_objects_are_array_consistent():
    pattern = {"employees": {"firstName": ["Anna"], "lastName": ["Jones"]}}
    split = {"employees": [{"firstName": "Anna", "lastName": "Smith"},
                           {"firstName": "Peter", "lastName": "Jones"}]}
    same = {"employees": [{"firstName": "John"}, {"firstName": "Anna", "lastName": "Jones"}]}
    assert not matches(pattern, split)
    assert matches(pattern, same)
    # nested arrays: the inner elements must agree too
    pattern = {"u": {"t": {"k": ["color"], "v": ["blue"]}}}
    assert matches(pattern, {"u": [{"t": [{"k": "color", "v": "blue"}]}]})
    assert not matches(pattern, {"u": [{"t": [{"k": "color"}, {"v": "blue"}]}]})
    # a field outside the array combines with any element
    assert matches({"d": {"a": ["1"]}, "v": ["x"]}, {"d": [{"a": "1"}], "v": "x"})


def test_exists_false_inside_an_array_element():
    pattern = {"d": {"a": [{"exists": True}], "b": [{"exists": False}]}}
    assert matches(pattern, {"d": [{"a": 1, "b": 2}, {"a": 3}]})  # element 1 has no b
    assert not matches(pattern, {"d": [{"a": 1, "b": 2}]})


def test_exists_false_is_decided_in_event_ruler_key_order():
    # event-ruler evaluates "d.a" (absent) before "d.b" with nothing chosen yet, so any d.a
    # anywhere in the array makes the absence fail
    pattern = {"d": {"a": [{"exists": False}], "b": [{"exists": True}]}}
    assert not matches(pattern, {"d": [{"b": 1}, {"a": 2}]})


def test_primitive_arrays_do_not_constrain_consistency():
    assert matches({"tags": ["a"], "cats": ["y"]}, {"tags": ["a", "b"], "cats": ["x", "y"]})


# --- exists --------------------------------------------------------------------------------

@pytest.mark.parametrize("value, exists_true", [
    ("x", True), (None, True), (0, True), (False, True), ("", True),
    ({}, False), ([], False), ({"nested": 1}, False), ([None], True),
])
def test_exists_applies_to_leaves_only(value, exists_true):
    assert matches({"v": [{"exists": True}]}, {"v": value}) is exists_true
    assert matches({"v": [{"exists": False}]}, {"v": value}) is not exists_true


def test_exists_false_on_missing_parents():
    assert matches({"a": {"b": {"c": [{"exists": False}]}}}, {"a": "scalar"})
    assert matches({"a": {"b": [{"exists": False}]}}, {})


# --- operators -----------------------------------------------------------------------------

def test_prefix_suffix_and_ignore_case():
    assert matches({"v": [{"prefix": ""}]}, {"v": ""})
    assert not matches({"v": [{"prefix": ""}]}, {"v": 1})
    assert matches({"v": [{"prefix": {"equals-ignore-case": "EvEnTb"}}]}, {"v": "eventbridge"})
    assert matches({"v": [{"suffix": {"equals-ignore-case": ".PNG"}}]}, {"v": "a.png"})
    assert not matches({"v": [{"suffix": ".png"}]}, {"v": "a.PNG"})


def test_equals_ignore_case_folds_unicode():
    assert matches({"v": [{"equals-ignore-case": "straße"}]}, {"v": "STRASSE"})
    assert matches({"v": [{"anything-but": {"equals-ignore-case": ["Stopped"]}}]}, {"v": "running"})
    assert not matches({"v": [{"anything-but": {"equals-ignore-case": ["Stopped"]}}]}, {"v": "STOPPED"})


@pytest.mark.parametrize("wildcard, value, expected", [
    ("ab*", "ab", True), ("*", "", True), ("", "", True), ("", "x", False),
    ("dir/*.png", "dir/a/b.png", True), ("a\\*b", "a*b", True), ("a\\*b", "axb", False),
    ("a\\\\b", "a\\b", True), ("*.png", 1, False), ("a*\nb", "a\nx\nb", True), ("a*b", "a\nb", True),
])
def test_wildcard(wildcard, value, expected):
    assert matches({"v": [{"wildcard": wildcard}]}, {"v": value}) is expected


@pytest.mark.parametrize("block, ip, expected", [
    ("10.0.0.0/24", "10.0.0.255", True), ("10.0.0.0/24", "10.0.1.0", False),
    ("10.0.0.1/24", "10.0.0.7", True),  # host bits accepted: the range starts at the address
    ("10.0.0.0/24", "10.0.0.256", False), ("10.0.0.0/24", 167772160, False),
    ("2001:db8:1234:1a00::/64", "2001:db8:1234:1a00:ffff::1", True),
    ("2001:db8:1234:1a00::/64", "10.0.0.1", False),
])
def test_cidr(block, ip, expected):
    assert matches({"ip": [{"cidr": block}]}, {"ip": ip}) is expected


@pytest.mark.parametrize("operand, value, expected", [
    ("x", None, True), ("x", "x", False), ("x", 1, True), (1, "1", True), (1, 1.0, False),
    ({"prefix": "init"}, 12, True), ({"prefix": "init"}, "initial", False), ({"suffix": ".txt"}, None, True),
    ({"wildcard": ""}, "a", True), ({"wildcard": ""}, "", False), ({"wildcard": ["*/lib/*", "*.jar"]}, "a.jar", False),
    ({"prefix": []}, "x", True),
])
def test_anything_but(operand, value, expected):
    assert matches({"v": [{"anything-but": operand}]}, {"v": value}) is expected
    assert not matches({"v": [{"anything-but": operand}]}, {})  # the field must be present


def test_two_anything_but_in_one_leaf_are_ored():
    pattern = {"v": [{"anything-but": "a"}, {"anything-but": "b"}]}
    assert matches(pattern, {"v": "a"}) and matches(pattern, {"v": "b"})
    pattern = {"v": [{"anything-but": {"prefix": "a"}}, {"anything-but": {"prefix": "b"}}]}
    assert matches(pattern, {"v": "a1"})


def test_a_leaf_mixes_literals_operators_and_absence():
    pattern = {"v": [{"anything-but": ["roses"]}, {"exists": False}]}
    assert matches(pattern, {}) and matches(pattern, {"v": "tulips"})
    assert not matches(pattern, {"v": "roses"})


# --- structure: $or, duplicate keys, dots ----------------------------------------------------

def test_or():
    pattern = {"source": ["s"], "$or": [{"a": ["1"]}, {"b": {"c": ["2"]}}]}
    assert matches(pattern, {"source": "s", "b": {"c": "2"}})
    assert not matches(pattern, {"source": "t", "a": "1"})
    nested = {"$or": [{"a": ["1"]}, {"b": ["2"], "$or": [{"c": ["3"]}, {"d": ["4"]}]}]}
    assert matches(nested, {"b": "2", "d": "4"})
    assert not matches(nested, {"b": "2"})


def test_malformed_or_is_an_ordinary_field_name():
    # event-ruler's legacy compiler: "$or" followed by an object is a field called "$or"
    assert matches({"$or": {"a": ["x"]}}, {"$or": {"a": "x"}})
    assert reason({"$or": [{"a": ["x"]}]}) == "Unrecognized match type a"
    assert reason({"$or": [{"prefix": ["x"]}, {"b": ["y"]}]}) == "prefix match pattern must be a string"


def test_duplicate_keys_in_text_keep_the_last_leaf_and_merge_objects():
    text = '{"d": {"loc": [{"prefix": "us-"}], "loc": [{"anything-but": "us-east"}]}}'
    assert matches(text, {"d": {"loc": "eu-central-1"}})
    text = '{"d": {"a": ["1"]}, "d": {"b": ["2"]}}'  # both halves of a repeated object count
    assert matches(text, {"d": {"a": "1", "b": "2"}})
    assert not matches(text, {"d": {"b": "2"}})


def test_dot_joining_quirk():
    assert matches({"d": {"s": {"t": ["x"]}}}, {"d": {"s.t": "x"}})
    assert matches({"d": {"s.t": ["x"]}}, {"d": {"s": {"t": "x"}}})
    assert not matches({"d": {"s": ["x"]}}, {"d": {"s.t": "x"}})


def test_json_string_is_not_parsed():
    assert not matches({"detail": {"k": ["v"]}}, {"detail": '{"k": "v"}'})


# --- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, expected", [
    ({"a": "x"}, '"a" must be an object or an array'),
    ({"a": []}, "Empty arrays are not allowed"),
    ({"a": {}}, "Empty objects are not allowed"),
    ({}, "Empty objects are not allowed"),
    ({"a": [[1]]}, "Match value must be String, number, true, false, or null"),
    ({"a": [{}]}, "Match expression name not found"),
    ({"a": [{"prefix": "x", "suffix": "y"}]}, "Only one key allowed in match expression"),
    ({"a": [{"Prefix": "x"}]}, "Unrecognized match type Prefix"),
    ({"a": [{"prefix": {"wildcard": "x"}}]}, "Unsupported prefix pattern: wildcard"),
    ({"a": [{"numeric": [">", 5, "<", 5]}]}, "Bottom must be less than top"),
    ({"a": [{"numeric": ["<", 5, ">", 1]}]}, "Too many elements in numeric expression"),
    ({"a": [{"numeric": ["=", "5"]}]}, "Value of equals must be numeric"),
    ({"a": [{"numeric": ["!", 5]}]}, "Unrecognized numeric range operator: !"),
    ({"a": [{"numeric": []}]}, "Invalid member in numeric match: ]"),
    ({"a": [{"numeric": [">", True]}]}, "Value of > must be numeric"),
    ({"a": [{"numeric": [">", 1, "<", 2, 3]}]}, "Too many terms in numeric range expression"),
    ({"a": [{"exists": "true"}]}, "exists match pattern must be either true or false."),
    ({"a": [{"anything-but": True}]}, "Value of anything-but must be an array or single string/number value."),
    ({"a": [{"anything-but": ["x", 1]}]}, "Inside anything but list, either all values are number or string, mixed type is not supported"),
    ({"a": [{"anything-but": []}]}, "Inside anything but list, either all values are number or string, mixed type is not supported"),
    ({"a": [{"anything-but": {"exists": True}}]}, "Unsupported anything-but pattern: exists"),
    ({"a": [{"anything-but": {"prefix": "a", "suffix": "b"}}]}, "Too many elements in numeric expression"),
    ({"a": [{"anything-but": {"suffix": [""]}}]}, "Null prefix/suffix not allowed"),
    ({"a": [{"wildcard": "a\\b"}]}, "Invalid escape character at pos 2"),
    ({"a": [{"wildcard": "x**"}]}, "Consecutive wildcard characters at pos 2"),
    ({"a": [{"cidr": "10.0.0.0/32"}]}, "IPv4 mask bits must be < 32"),
    ({"a": [{"cidr": "10.0.0.0/-1"}]}, "Malformed CIDR, mask bits must not be negative"),
    ({"a": [{"cidr": "10.0.0.300/8"}]}, "Invalid IP address: 10.0.0.300"),
    ({"$or": [{"a": ["1"]}]}, "Unrecognized match type a"),
    ({"x": ["1"], "$or": [{"a": ["1"]}, {"numeric": ["1"]}]}, "Unrecognized match type a"),
    ({"$or": [{"a": [{"cidr": "bad"}]}, {"b": ["1"]}]}, "Malformed CIDR, one '/' required"),
])
def test_validation_messages(pattern, expected):
    assert reason(pattern) == expected


def test_the_first_error_in_document_order_is_reported():
    assert reason('{"b": [{"prefix": 1}], "a": "x"}') == "prefix match pattern must be a string"
    assert reason('{"a": "x", "b": [{"prefix": 1}]}') == '"a" must be an object or an array'


def test_invalid_json_and_non_objects():
    assert reason("[1]") == "Filter is not an object"
    assert reason('"x"') == "Filter is not an object"
    assert reason('{"a": [NaN]}').startswith("Non-standard token 'NaN'")
    assert reason("") == "Filter is not an object"
    assert reason("[1, ") == "Filter is not an object"
    assert reason('{"a": ["x"]').startswith("Unexpected end-of-input")
    with pytest.raises(InvalidEventPattern):
        compile_pattern({"a": [float("nan")]})
    with pytest.raises(InvalidEventPattern):
        compile_pattern({1: ["x"]})
    with pytest.raises(InvalidEventPattern):
        compile_pattern({"a": [object()]})


def test_limits():
    assert reason({f"f{i}": ["x"] for i in range(257)}) == "Size of rule exceeds max value of 256 fields"
    compile_pattern({f"f{i}": ["x"] for i in range(256)})
    parallel = {f"k{i}": {"$or": [{"a": ["1"]}, {"b": ["2"]}]} for i in range(11)}  # 2**11 alternatives
    assert reason(parallel).startswith("Rule is too complex - the $or branches")
    assert reason('{"n": ' * 5000 + '{"v": ["x"]}' + "}" * 5000) == "Pattern is nested too deeply"
    deep: dict = {"v": ["x"]}
    for _ in range(5000):
        deep = {"n": deep}
    assert reason(deep) == "Pattern is nested too deeply"


@pytest.mark.parametrize("wildcards, too_complex", [
    (["*:*:*:*:*:event-bus/*"], True),
    (["arn:aws:events:us-east-1:*:event-bus/*"], False),
    (["/Users/*/dir/dir/dir/dir/dir/doc.txt"], False),
    (["*.bif", "*.tiff", "*.tif", "*.svs"], False),
    (["*/datasync/*.bif", "*/datasync/*.tif"], False),
    (["*/datasync/*.bif", "*/datasync/*.tif", "*/datasync/*.tiff", "*/datasync/*.svs"], True),
])
def test_wildcard_complexity(wildcards, too_complex):
    pattern = {"key": [{"wildcard": w} for w in wildcards]}
    if too_complex:
        assert reason(pattern).startswith("Rule is too complex - try using fewer wildcard characters")
    else:
        compile_pattern(pattern)


# --- events that are odd, and the index's own behaviour -------------------------------------

@pytest.mark.parametrize("event", [
    None, [], "x", 1, [{"a": "x"}],
    {"a": {"b": [[[["x"]]]]}}, {1: "x", None: "y"}, {"a": object()}, {"a": (1, "x")},
    {"a": float("nan"), "b": float("inf")}, {"a": 10**500},
])
def test_odd_events_never_raise(event):
    pattern = compile_pattern({"a": ["x", 1, {"numeric": [">", 0]}], "b": {"c": [{"exists": False}]}})
    assert pattern.matches(event) in (True, False)
    index = RuleIndex()
    index.add("r", pattern)
    assert index.match(event) in (set(), {"r"})


def test_deeply_nested_event():
    event: dict = {"v": "x"}
    for _ in range(100_000):
        event = {"n": [event]}
    pattern = compile_pattern({"n": {"n": {"v": ["x"]}}})
    assert not pattern.matches(event)
    index = RuleIndex()
    index.add("r", pattern)
    assert index.match(event) == set()


def test_python_subclasses_are_their_json_values():
    import enum

    class Color(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        ONE = 1

    assert matches({"c": ["red"], "l": [1]}, {"c": Color.RED, "l": Level.ONE})


def test_rule_index_add_replace_remove():
    index = RuleIndex()
    index.add("a", '{"source": ["x"]}')
    index.add("b", {"source": ["x"], "detail": {"n": [{"numeric": [">", 1]}]}})
    event = {"source": "x", "detail": {"n": 2}}
    assert index.match(event) == {"a", "b"}
    index.add("a", {"source": ["y"]})  # replaces
    assert index.match(event) == {"b"}
    index.remove("b")
    assert index.match(event) == set()
    assert len(index) == 1 and "a" in index
    with pytest.raises(KeyError):
        index.remove("b")
    with pytest.raises(InvalidEventPattern):
        index.add("c", {"source": "x"})
    assert "c" not in index
    index.add("c", {"$or": [{"source": ["x"]}, {"source": ["y"]}]})
    assert index.match({"source": "y"}) == {"a", "c"}


def test_independent_arrays_do_not_multiply_the_search():
    # 300 x 300 x 300 element combinations, all failing on the last key: must stay linear
    pattern = {"a": {"x": [{"exists": True}]}, "b": {"y": [{"exists": True}]},
               "c": {"z": [{"exists": True}]}, "d": {"w": [{"exists": False}]}}
    event = {"a": [{"x": i} for i in range(300)], "b": [{"y": i} for i in range(300)],
             "c": [{"z": i} for i in range(300)], "d": [{"w": 1}]}
    assert not matches(pattern, event)
    event["d"] = [{"v": 1}]
    assert matches(pattern, event)
