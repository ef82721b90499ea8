"""Validation and compilation of a pattern tree into sub-rules, following event-ruler 2.x.

The walk mirrors event-ruler's JsonRuleCompiler token by token, so the first error in document
order is the one reported, with event-ruler's wording (which is what AWS answers). A pattern
compiles to one or more *sub-rules* (``$or`` expands into several); each sub-rule maps dotted
field paths to a `Leaf`. When the ``$or`` form is malformed, event-ruler falls back to its legacy
compiler, which treats ``$or`` as an ordinary field name; so does this one.
"""

from __future__ import annotations

from shoal.events.patterns.complexity import check_wildcard_complexity
from shoal.events.patterns.errors import InvalidEventPattern
from shoal.events.patterns.matchers import (
    AnythingBut, AnythingButIgnoreCase, AnythingButPrefix, AnythingButSuffix, AnythingButWildcard,
    Cidr, EqualsIgnoreCase, Exact, Exists, IpExact, IPV4_SHAPE, IPV6_SHAPE, Leaf, Numeric, Prefix,
    PrefixIgnoreCase, Suffix, SuffixIgnoreCase, Wildcard, as_float, parse_ip, value_key,
    wildcard_tokens,
)
from shoal.events.patterns.parse import Obj

OR = "$or"
# event-ruler's Constants.RESERVED_FIELD_NAMES_IN_OR_RELATIONSHIP
RESERVED_IN_OR = frozenset([
    "exactly", "equals-ignore-case", "prefix", "suffix", "anything-but", "exists", "wildcard",
    "numeric", "cidr", "=", "<", "<=", ">", ">=", "regex", "not-wildcard", "not-equals-ignore-case",
    "date-after", "date-on-or-after", "date-before", "date-on-or-before", "in-date-range",
    "ip-address-in-range", "ip-address-not-in-range",
])
MAX_FIELDS = 256      # event-ruler's GenericMachine.MAXIMUM_RULE_SIZE (fields per sub-rule)
MAX_SUBRULES = 1024   # shoal's own bound on the $or expansion (event-ruler has none)
TOO_MANY_ELEMENTS = "Too many elements in numeric expression"
ONE_KEY = "Only one key allowed in match expression"
_END = object()       # the end of an array, as a token
_ABSENT = object()    # exists:false inside a leaf's value list
_EXISTS = Exists()


class _FinalError(InvalidEventPattern):
    """An error event-ruler does not raise as a JSON parse error, so the legacy retry is skipped
    (CIDR errors are IllegalArgumentExceptions there; size limits are checked after parsing)."""


def _err(reason: str, final: bool = False):
    raise (_FinalError if final else InvalidEventPattern)(reason)


def _is_obj(v) -> bool:
    return type(v) is Obj


def _is_arr(v) -> bool:
    return type(v) is list


def _is_num(v) -> bool:
    t = type(v)
    return t is int or t is float


def _text(v) -> str:
    """What Jackson's getText() gives for the token at a value."""
    if v is _END:
        return "]"
    if _is_obj(v):
        return "{"
    if _is_arr(v):
        return "["
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    return str(v)


def _java_split_slash(text: str) -> list[str]:
    parts = text.split("/")
    while parts and parts[-1] == "":
        parts.pop()
    return parts if text else [""]


def parse_cidr(text: str) -> Cidr:
    """event-ruler's CIDR.cidr(): the range is [address, address | host mask]."""
    parts = _java_split_slash(text)
    if len(parts) != 2:
        _err("Malformed CIDR, one '/' required", final=True)
    mask_text = parts[1]
    body = mask_text[1:] if mask_text[:1] in "+-" else mask_text
    if not body.isascii() or not body.isdigit() or not -2**31 <= int(mask_text) < 2**31:
        _err("Malformed CIDR, mask bits must be an integer", final=True)
    mask = int(mask_text)
    if mask < 0:
        _err("Malformed CIDR, mask bits must not be negative", final=True)
    address = parts[0]
    if not (IPV4_SHAPE.fullmatch(address) or IPV6_SHAPE.fullmatch(address)):
        _err(f"Nonstandard IP address: {address}", final=True)
    ip = parse_ip(address)
    if ip is None:
        _err(f"Invalid IP address: {address}", final=True)
    bits, value = ip
    if bits == 32 and mask > 31:
        _err("IPv4 mask bits must be < 32", final=True)
    if bits == 128 and mask > 127:
        _err("IPv6 mask bits must be < 128", final=True)
    return Cidr(bits, value, value | ((1 << (bits - mask)) - 1))


class _Compiler:
    def __init__(self, legacy: bool):
        self.legacy = legacy  # legacy: "$or" is an ordinary field name

    def top(self, tree) -> list[dict]:
        if not _is_obj(tree):
            _err("Filter is not an object")
        rules: list[dict] = []
        self.obj(tree, rules, [], False)
        return rules

    def obj(self, pairs, rules: list[dict], path: list[str], in_or: bool) -> None:
        if not pairs:
            _err("Empty objects are not allowed")
        for key, value in pairs:
            if key == OR and not self.legacy:
                self.or_(value, rules, path)
                continue
            if in_or and key in RESERVED_IN_OR:
                _err(f"{key} is Ruler reserved fieldName which cannot be used inside {OR}.")
            if _is_obj(value):
                self.obj(value, rules, path + [key], in_or)
            elif _is_arr(value):
                self.leaf(rules, ".".join(path + [key]), value)
            else:
                _err(f'"{key}" must be an object or an array')

    def or_(self, value, rules: list[dict], path: list[str]) -> None:
        current = [dict(rule) for rule in rules]
        rules.clear()
        if not _is_arr(value):
            _err(f"It must be an Array followed with {OR}.")
        count = 0
        for element in value:
            count += 1
            if not _is_obj(element):
                _err(f"Only JSON object is allowed in array of {OR} relationship.")
            branch = [dict(rule) for rule in current] or [{}]
            self.obj(element, branch, path, True)
            rules.extend(branch)
            if len(rules) > MAX_SUBRULES:
                _err(f"Rule is too complex - the {OR} branches combine into more than "
                     f"{MAX_SUBRULES} alternatives", final=True)
        if count < 2:
            _err(f"There must have at least 2 Objects in {OR} relationship.")

    def leaf(self, rules: list[dict], name: str, values: list) -> None:
        out = []
        for v in values:
            if _is_obj(v):
                out.append(self.expression(v))
            elif type(v) is str:
                ip = parse_ip(v)  # event-ruler turns a literal IP address into an address range
                out.append(IpExact(ip) if ip is not None else Exact(v))
            elif _is_num(v) or v is None or v is True or v is False:
                out.append(Exact(value_key(v)))
            else:
                _err("Match value must be String, number, true, false, or null")
        if not out:
            _err("Empty arrays are not allowed")
        if not rules:
            rules.append({})
        for rule in rules:
            rule[name] = out  # a later occurrence of the same path overrides the earlier one
            if len(rule) > MAX_FIELDS:
                _err(f"Size of rule exceeds max value of {MAX_FIELDS} fields", final=True)

    def expression(self, pairs):
        if not pairs:
            _err("Match expression name not found")
        name, val = pairs[0]
        extra = len(pairs) > 1
        if name == "exactly":
            if type(val) is not str:
                _err("exact match pattern must be a string")
            return self.one_key(extra, Exact(val))
        if name in ("prefix", "suffix"):
            label = name.capitalize()
            if _is_obj(val):
                if not val:
                    _err(f"{label} expression name not found")
                op, inner = val[0]
                if op != "equals-ignore-case":
                    _err(f"Unsupported {name} pattern: {op}")
                if type(inner) is not str:
                    _err("equals-ignore-case match pattern must be a string")
                cls = PrefixIgnoreCase if name == "prefix" else SuffixIgnoreCase
                self.one_key(len(val) > 1, None)
                return self.one_key(extra, cls(inner))
            if type(val) is not str:
                _err(f"{name} match pattern must be a string")
            return self.one_key(extra, Prefix(val) if name == "prefix" else Suffix(val))
        if name == "numeric":
            if not _is_arr(val):
                _err("Value of numeric must be an array.")
            matcher = self.numeric(val)
            if extra:
                _err(TOO_MANY_ELEMENTS)
            return matcher
        if name == "anything-but":
            return self.anything_but(val, extra)
        if name == "exists":
            if val is True:
                matcher = _EXISTS
            elif val is False:
                matcher = _ABSENT
            else:
                _err("exists match pattern must be either true or false.")
            return self.one_key(extra, matcher)
        if name == "cidr":
            if type(val) is not str:
                _err("prefix match pattern must be a string")  # sic: event-ruler's wording
            return self.one_key(extra, parse_cidr(val))
        if name == "equals-ignore-case":
            if type(val) is not str:
                _err("equals-ignore-case match pattern must be a string")
            return self.one_key(extra, EqualsIgnoreCase(val))
        if name == "wildcard":
            if type(val) is not str:
                _err("wildcard match pattern must be a string")
            tokens, problem = wildcard_tokens(val)
            if problem:
                _err(problem)
            return self.one_key(extra, Wildcard(val, tokens))
        _err(f"Unrecognized match type {name}")

    @staticmethod
    def one_key(extra: bool, matcher):
        if extra:
            _err(ONE_KEY)
        return matcher

    @staticmethod
    def numeric(items: list):
        def token(i):
            return items[i] if i < len(items) else _END

        op = token(0)
        if type(op) is not str:
            _err(f"Invalid member in numeric match: {_text(op)}")
        first = token(1)
        if op == "=":
            if not _is_num(first):
                _err("Value of equals must be numeric")
            if token(2) is not _END:
                _err(TOO_MANY_ELEMENTS)
            return Exact(value_key(first))
        if op in (">", ">=", "<", "<="):
            if not _is_num(first):
                _err(f"Value of {op} must be numeric")
        else:
            _err(f"Unrecognized numeric range operator: {op}")
        second = token(2)
        if op in ("<", "<="):
            if second is not _END:
                _err(TOO_MANY_ELEMENTS)
            return Numeric(None, False, as_float(first), op == "<")
        if second is _END:
            return Numeric(as_float(first), op == ">", None, False)
        if type(second) is not str:
            _err(f"Bad value in numeric range: {_text(second)}")
        if second not in ("<", "<="):
            _err(f"Bad numeric range operator: {second}")
        top = token(3)
        if not _is_num(top):
            _err(f"Value of {second} must be numeric")
        if token(4) is not _END:
            _err("Too many terms in numeric range expression")
        if not as_float(first) < as_float(top):
            _err("Bottom must be less than top")
        return Numeric(as_float(first), op == ">", as_float(top), second == "<")

    def anything_but(self, val, extra: bool):
        kind = None
        inner_extra = False
        if _is_obj(val):
            if not val:
                _err("Anything-But expression name not found")
            kind, inner = val[0]
            inner_extra = len(val) > 1
            if kind not in ("equals-ignore-case", "prefix", "suffix", "wildcard"):
                _err(f"Unsupported anything-but pattern: {kind}")
            val = inner
        if not (_is_arr(val) or type(val) is str or _is_num(val)):
            _err("Value of anything-but must be an array or single string/number value.")
        if kind is None:
            matcher = self.anything_but_values(val if _is_arr(val) else [val], _is_arr(val))
        else:
            matcher = self.anything_but_set(kind, val if _is_arr(val) else [val])
        if inner_extra or extra:
            _err(TOO_MANY_ELEMENTS)
        return matcher

    @staticmethod
    def anything_but_values(items: list, is_list: bool):
        strings = numbers = False
        for item in items:
            if type(item) is str:
                strings = True
            elif _is_num(item):
                numbers = True
            else:
                _err("Inside anything but list, start|null|boolean is not supported.")
        if is_list and strings == numbers:
            _err("Inside anything but list, either all values are number or string, "
                 "mixed type is not supported")
        return AnythingBut(value_key(item) for item in items)

    @staticmethod
    def anything_but_set(kind: str, items: list):
        texts = []
        for item in items:
            if type(item) is not str:
                if kind == "equals-ignore-case":
                    _err("Inside anything-but/equals-ignore-case list, "
                         "number|start|null|boolean is not supported.")
                if kind == "wildcard":
                    _err("wildcard match pattern must be a string")
                _err("prefix/suffix match pattern must be a string")
            if item == "" and kind in ("prefix", "suffix"):
                _err("Null prefix/suffix not allowed")
            texts.append(item)
        if kind == "prefix":
            return AnythingButPrefix(texts)
        if kind == "suffix":
            return AnythingButSuffix(texts)
        if kind == "equals-ignore-case":
            return AnythingButIgnoreCase(texts)
        parsed = []
        for text in texts:
            tokens, problem = wildcard_tokens(text)
            if problem:
                _err(problem)
            parsed.append((text, tokens))
        return AnythingButWildcard(parsed)


def _has_or_key(tree) -> bool:
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_obj(node):
            for key, value in node:
                if key == OR:
                    return True
                stack.append(value)
        elif _is_arr(node):
            stack.extend(node)
    return False


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def _subrules(rules: list[dict]) -> list[tuple]:
    """Each sub-rule as a tuple of (path, Leaf), sorted as event-ruler sorts field names."""
    out = []
    for rule in rules:
        items = []
        for path, values in rule.items():
            unique = {m.ident: m for m in values if m is not _ABSENT}
            items.append((path, Leaf(unique.values(), any(m is _ABSENT for m in values))))
        items.sort(key=lambda item: _utf16(item[0]))
        out.append(tuple(items))
    return out


def compile_tree(tree) -> list[tuple]:
    """Validate a parsed pattern and return its sub-rules. Raises InvalidEventPattern."""
    try:
        try:
            rules = _Compiler(legacy=False).top(tree)
        except InvalidEventPattern as err:
            if isinstance(err, _FinalError) or not _has_or_key(tree):
                raise
            # event-ruler retries with its legacy compiler, where "$or" is a plain field name,
            # and reports that compiler's error if it fails too.
            rules = _Compiler(legacy=True).top(tree)
    except RecursionError:
        _err("Pattern is nested too deeply")
    subrules = _subrules(rules)
    check_wildcard_complexity(subrules)
    return subrules
