"""Value matchers, one class per operator, and the value helpers they share.

Every matcher has ``test(value) -> bool`` for one event leaf value (str, int, float, bool or None)
and an ``ident`` that is equal for equal matchers (the index shares work between equal ones).
Python's ``True == 1`` never leaks in: values are compared through `value_key`, which tags
booleans, and numbers are compared as float64 numbers, as event-ruler does.
"""

from __future__ import annotations

import ipaddress
import re

_TRUE = ("bool", True)
_FALSE = ("bool", False)
NO_KEY = ("nokey",)  # never equal to a pattern key


def value_key(v):
    """A hashable key under which equal JSON values (in event-ruler's sense) are equal.

    Strings are themselves; numbers are their float64 value (so 5, 5.0 and 5e0 are one key);
    integers too large for a float keep their exact value; booleans and null are tagged so that
    they never meet the numbers 1 and 0.
    """
    t = type(v)
    if t is str:
        return v
    if t is int or t is float:
        try:
            return float(v)
        except OverflowError:
            return ("int", v)
    if t is bool:
        return _TRUE if v else _FALSE
    if v is None:
        return None
    return NO_KEY


def as_float(v) -> float:
    """A JSON number as event-ruler sees it: a float64 (huge integers become infinities)."""
    try:
        return float(v)
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")


# --- IP addresses (event-ruler's CIDR.java) ---------------------------------------------------

IPV4_SHAPE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
IPV6_SHAPE = re.compile(r"[0-9a-fA-F:]*:[0-9a-fA-F:]*")


def parse_ip(text: str):
    """(bits, integer) for an IPv4/IPv6 literal of the shapes event-ruler accepts, else None."""
    if IPV4_SHAPE.fullmatch(text):
        value = 0
        for part in text.split("."):
            octet = int(part)
            if octet > 255:
                return None
            value = (value << 8) | octet
        return (32, value)
    if IPV6_SHAPE.fullmatch(text):
        try:
            addr = ipaddress.IPv6Address(text)
        except ValueError:
            return None
        mapped = addr.ipv4_mapped  # Java's InetAddress gives these back as IPv4 addresses
        if mapped is not None:
            return (32, int(mapped))
        return (128, int(addr))
    return None


# --- wildcard ------------------------------------------------------------------------------

STAR = object()


def wildcard_tokens(text: str):
    """Split a wildcard pattern into literal strings and STAR; returns (tokens, error reason).

    Error positions are byte offsets in the quoted UTF-8 form, as event-ruler reports them.
    """
    tokens: list = []
    literal: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "*":
            if i + 1 < n and text[i + 1] == "*":
                return None, f"Consecutive wildcard characters at pos {len(text[:i].encode()) + 1}"
            if literal:
                tokens.append("".join(literal))
                literal = []
            tokens.append(STAR)
        elif ch == "\\":
            if i + 1 < n and text[i + 1] in "*\\":
                literal.append(text[i + 1])
                i += 2
                continue
            return None, f"Invalid escape character at pos {len(text[:i].encode()) + 1}"
        else:
            literal.append(ch)
        i += 1
    if literal:
        tokens.append("".join(literal))
    return tokens, None


def wildcard_regex(tokens) -> re.Pattern:
    return re.compile("".join(".*" if t is STAR else re.escape(t) for t in tokens), re.DOTALL)


# --- matchers ------------------------------------------------------------------------------

class Matcher:
    __slots__ = ("ident",)
    kind = ""

    def test(self, v) -> bool:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.ident[1:]!r}"


class Exact(Matcher):
    """A literal string, number, boolean or null (numbers match numerically)."""
    __slots__ = ("key",)
    kind = "exact"

    def __init__(self, key):
        self.key = key
        self.ident = ("exact", key)

    def test(self, v) -> bool:
        return value_key(v) == self.key


class IpExact(Matcher):
    """A literal string that is an IP address: matches that address in any spelling."""
    __slots__ = ("ip",)
    kind = "ip"

    def __init__(self, ip):
        self.ip = ip
        self.ident = ("ip", ip)

    def test(self, v) -> bool:
        return type(v) is str and parse_ip(v) == self.ip


class Cidr(Matcher):
    __slots__ = ("bits", "lo", "hi")
    kind = "cidr"

    def __init__(self, bits: int, lo: int, hi: int):
        self.bits, self.lo, self.hi = bits, lo, hi
        self.ident = ("cidr", bits, lo, hi)

    def test(self, v) -> bool:
        if type(v) is not str:
            return False
        ip = parse_ip(v)
        return ip is not None and ip[0] == self.bits and self.lo <= ip[1] <= self.hi


class Prefix(Matcher):
    __slots__ = ("text",)
    kind = "prefix"

    def __init__(self, text: str):
        self.text = text
        self.ident = ("prefix", text)

    def test(self, v) -> bool:
        return type(v) is str and v.startswith(self.text)


class Suffix(Matcher):
    __slots__ = ("text",)
    kind = "suffix"

    def __init__(self, text: str):
        self.text = text
        self.ident = ("suffix", text)

    def test(self, v) -> bool:
        return type(v) is str and v.endswith(self.text)


class PrefixIgnoreCase(Matcher):
    __slots__ = ("text",)
    kind = "prefix-ic"

    def __init__(self, text: str):
        self.text = text.casefold()
        self.ident = ("prefix-ic", self.text)

    def test(self, v) -> bool:
        return type(v) is str and v.casefold().startswith(self.text)


class SuffixIgnoreCase(Matcher):
    __slots__ = ("text",)
    kind = "suffix-ic"

    def __init__(self, text: str):
        self.text = text.casefold()
        self.ident = ("suffix-ic", self.text)

    def test(self, v) -> bool:
        return type(v) is str and v.casefold().endswith(self.text)


class EqualsIgnoreCase(Matcher):
    __slots__ = ("text",)
    kind = "equals-ic"

    def __init__(self, text: str):
        self.text = text.casefold()
        self.ident = ("equals-ic", self.text)

    def test(self, v) -> bool:
        return type(v) is str and v.casefold() == self.text


class Wildcard(Matcher):
    __slots__ = ("text", "regex", "needle")
    kind = "wildcard"

    def __init__(self, text: str, tokens):
        self.text = text
        self.regex = wildcard_regex(tokens)
        self.needle = max((t for t in tokens if t is not STAR), key=len, default="")
        self.ident = ("wildcard", text)

    def test(self, v) -> bool:
        return type(v) is str and self.needle in v and self.regex.fullmatch(v) is not None


class Numeric(Matcher):
    """A numeric range; None for an open end. Only JSON numbers (never booleans) match."""
    __slots__ = ("lo", "lo_open", "hi", "hi_open")
    kind = "numeric"

    def __init__(self, lo, lo_open: bool, hi, hi_open: bool):
        self.lo, self.lo_open, self.hi, self.hi_open = lo, lo_open, hi, hi_open
        self.ident = ("numeric", lo, lo_open, hi, hi_open)

    def test(self, v) -> bool:
        t = type(v)
        if t is not int and t is not float:
            return False
        return self.contains(as_float(v))

    def contains(self, x) -> bool:
        if x != x:  # NaN
            return False
        lo, hi = self.lo, self.hi
        if lo is not None and (x <= lo if self.lo_open else x < lo):
            return False
        if hi is not None and (x >= hi if self.hi_open else x > hi):
            return False
        return True


class Exists(Matcher):
    """exists:true — any leaf value, null included (objects and empty arrays are not leaves)."""
    __slots__ = ()
    kind = "exists"

    def __init__(self):
        self.ident = ("exists",)

    def test(self, v) -> bool:
        return True


class AnythingBut(Matcher):
    """anything-but with strings or numbers: any present value not equal to one of them."""
    __slots__ = ("keys",)
    kind = "anything-but"

    def __init__(self, keys):
        self.keys = frozenset(keys)
        self.ident = ("anything-but", self.keys)

    def test(self, v) -> bool:
        return value_key(v) not in self.keys


class AnythingButPrefix(Matcher):
    __slots__ = ("texts",)
    kind = "anything-but-prefix"

    def __init__(self, texts):
        self.texts = tuple(sorted(set(texts)))
        self.ident = ("anything-but-prefix", self.texts)

    def test(self, v) -> bool:
        return not (type(v) is str and v.startswith(self.texts))


class AnythingButSuffix(Matcher):
    __slots__ = ("texts",)
    kind = "anything-but-suffix"

    def __init__(self, texts):
        self.texts = tuple(sorted(set(texts)))
        self.ident = ("anything-but-suffix", self.texts)

    def test(self, v) -> bool:
        return not (type(v) is str and v.endswith(self.texts))


class AnythingButIgnoreCase(Matcher):
    __slots__ = ("texts",)
    kind = "anything-but-ic"

    def __init__(self, texts):
        self.texts = frozenset(t.casefold() for t in texts)
        self.ident = ("anything-but-ic", self.texts)

    def test(self, v) -> bool:
        return not (type(v) is str and v.casefold() in self.texts)


class AnythingButWildcard(Matcher):
    __slots__ = ("texts", "regexes")
    kind = "anything-but-wildcard"

    def __init__(self, parsed):  # [(text, tokens)]
        parsed = sorted(dict(parsed).items())
        self.texts = tuple(text for text, _ in parsed)
        self.regexes = tuple(wildcard_regex(tokens) for _, tokens in parsed)
        self.ident = ("anything-but-wildcard", self.texts)

    def test(self, v) -> bool:
        if type(v) is not str:
            return True
        return not any(r.fullmatch(v) is not None for r in self.regexes)


class Leaf:
    """What a pattern says about one field path: any matcher, or (allow_absent) no value at all."""
    __slots__ = ("matchers", "allow_absent")

    def __init__(self, matchers, allow_absent: bool):
        self.matchers = tuple(matchers)
        self.allow_absent = allow_absent

    def test(self, v) -> bool:
        for m in self.matchers:
            if m.test(v):
                return True
        return False

    def __repr__(self) -> str:
        return f"Leaf({list(self.matchers)!r}, allow_absent={self.allow_absent})"
