"""Per-field-path indexes: which sub-rules does one event value satisfy on this path?

A sub-rule is a bit. For one path, `PathIndex.on_string(v)` / `on_other(v)` return the bitmask
of sub-rules whose leaf on that path accepts the value, without looking at sub-rules one by one:
literals are a dict lookup; prefixes and suffixes a lookup per distinct operand length; numeric
ranges a binary search over precomputed intervals; anything-but a lookup of what is excluded,
complemented. Operators that cannot be indexed this way (wildcards, CIDR blocks, anything-but
wildcards, a second complement of the same kind in one leaf) are tested one distinct operand at
a time; past 16 wildcards on a path, a 3-gram table of their literals picks the candidates.
"""

from __future__ import annotations

from bisect import bisect_left

from shoal.events.patterns.matchers import _FALSE, _TRUE, as_float, parse_ip

_COMPLEMENTS = frozenset(["anything-but", "anything-but-prefix", "anything-but-suffix",
                          "anything-but-ic", "anything-but-wildcard"])
_STRING_COMPLEMENTS = ("anything-but-prefix", "anything-but-suffix", "anything-but-ic",
                       "anything-but-wildcard")


def _add(table: dict, key, bit: int) -> None:
    table[key] = table.get(key, 0) | bit


def _by_length(table: dict) -> tuple:
    return tuple(sorted({len(key) for key in table}))


_GRAM_THRESHOLD = 16


def _gram_index(wildcards: list):
    """3-gram -> [(wildcard, bits)], keyed by the rarest 3-gram of each wildcard's longest
    literal (a value can only match if it contains that literal); plus those without one."""
    counts: dict = {}
    for m, _ in wildcards:
        for gram in {m.needle[i:i + 3] for i in range(len(m.needle) - 2)}:
            counts[gram] = counts.get(gram, 0) + 1
    index: dict = {}
    short = []
    for m, bits in wildcards:
        grams = [m.needle[i:i + 3] for i in range(len(m.needle) - 2)]
        if grams:
            index.setdefault(min(grams, key=counts.__getitem__), []).append((m, bits))
        else:
            short.append((m, bits))
    return index, short


class PathIndex:
    __slots__ = (
        "required", "absent", "all", "exists", "exact", "ip", "prefix", "prefix_lens", "suffix",
        "suffix_lens", "prefix_ic", "prefix_ic_lens", "suffix_ic", "suffix_ic_lens", "equals_ic",
        "ab_all", "ab_excluded", "abp_all", "abp", "abp_lens", "abs_all", "abs", "abs_lens",
        "abic_all", "abic", "loop", "points", "regions", "non_string", "folds", "parses_ip",
        "string_work", "on_string", "on_other", "grams", "loop_other",
    )

    def __init__(self, leaves: dict):
        """leaves: sub-rule bit number -> Leaf on this path."""
        self.required = self.absent = self.all = self.exists = 0
        self.exact, self.ip = {}, {}
        self.prefix, self.suffix, self.prefix_ic, self.suffix_ic, self.equals_ic = {}, {}, {}, {}, {}
        self.ab_all = self.abp_all = self.abs_all = self.abic_all = 0
        self.ab_excluded, self.abp, self.abs, self.abic = {}, {}, {}, {}
        loop: dict = {}
        ranges: dict = {}
        string_complements = 0
        for number, leaf in leaves.items():
            bit = 1 << number
            self.all |= bit
            if leaf.allow_absent:
                self.absent |= bit
            else:
                self.required |= bit
            kinds = [m.kind for m in leaf.matchers]
            for m in leaf.matchers:
                kind = m.kind
                if kind in _COMPLEMENTS and (kind == "anything-but-wildcard" or kinds.count(kind) > 1):
                    # a second complement of one kind in one leaf cannot share the exclusion table
                    loop.setdefault(m.ident, [m, 0])[1] |= bit
                elif kind == "exact":
                    _add(self.exact, m.key, bit)
                elif kind == "ip":
                    _add(self.ip, m.ip, bit)
                elif kind == "prefix":
                    _add(self.prefix, m.text, bit)
                elif kind == "suffix":
                    _add(self.suffix, m.text, bit)
                elif kind == "prefix-ic":
                    _add(self.prefix_ic, m.text, bit)
                elif kind == "suffix-ic":
                    _add(self.suffix_ic, m.text, bit)
                elif kind == "equals-ic":
                    _add(self.equals_ic, m.text, bit)
                elif kind == "exists":
                    self.exists |= bit
                elif kind == "numeric":
                    ranges.setdefault(m.ident, [m, 0])[1] |= bit
                elif kind == "anything-but":
                    self.ab_all |= bit
                    for key in m.keys:
                        _add(self.ab_excluded, key, bit)
                elif kind == "anything-but-prefix":
                    self.abp_all |= bit
                    for text in m.texts:
                        _add(self.abp, text, bit)
                elif kind == "anything-but-suffix":
                    self.abs_all |= bit
                    for text in m.texts:
                        _add(self.abs, text, bit)
                elif kind == "anything-but-ic":
                    self.abic_all |= bit
                    for text in m.texts:
                        _add(self.abic, text, bit)
                else:  # wildcard, cidr
                    loop.setdefault(m.ident, [m, 0])[1] |= bit
            for m in leaf.matchers:
                if m.kind in _STRING_COMPLEMENTS:
                    string_complements |= bit
        loop_items = [(m, bits) for m, bits in loop.values()]
        wildcards = [(m, bits) for m, bits in loop_items if m.kind == "wildcard"]
        others = [(m, bits) for m, bits in loop_items if m.kind != "wildcard"]
        self.grams = None
        if len(wildcards) > _GRAM_THRESHOLD:
            # many wildcards: find candidates through a 3-gram of each one's longest literal
            self.grams, short = _gram_index(wildcards)
            others += short
        else:
            others += wildcards
        self.loop = tuple(others)
        # what can accept a number, boolean or null: not wildcards or CIDR blocks
        self.loop_other = tuple((m, b) for m, b in others if m.kind not in ("wildcard", "cidr"))
        self.prefix_lens = _by_length(self.prefix)
        self.suffix_lens = _by_length(self.suffix)
        self.prefix_ic_lens = _by_length(self.prefix_ic)
        self.suffix_ic_lens = _by_length(self.suffix_ic)
        self.abp_lens = _by_length(self.abp)
        self.abs_lens = _by_length(self.abs)
        # string complements are satisfied by every value that is not a string
        self.non_string = self.exists | string_complements
        self.folds = bool(self.prefix_ic or self.suffix_ic or self.equals_ic or self.abic_all)
        self.parses_ip = bool(self.ip)
        self.string_work = bool(self.prefix or self.suffix or self.folds or self.abp_all
                                or self.abs_all or self.ip)
        self._build_ranges(list(ranges.values()))
        self.on_string = self._make_string_eval()
        self.on_other = self._make_other_eval()

    def _build_ranges(self, ranges: list) -> None:
        points = sorted({p for m, _ in ranges for p in (m.lo, m.hi) if p is not None})
        index = {p: i for i, p in enumerate(points)}
        regions = [0] * (2 * len(points) + 1)  # (-inf, p0), {p0}, (p0, p1), {p1}, ..., (pn, inf)
        for m, bits in ranges:
            start = 0 if m.lo is None else 2 * index[m.lo] + (2 if m.lo_open else 1)
            end = len(regions) - 1 if m.hi is None else 2 * index[m.hi] + (0 if m.hi_open else 1)
            for r in range(start, end + 1):
                regions[r] |= bits
        self.points = points
        self.regions = regions

    def _make_string_eval(self):
        """A closure for one string value, with only the steps this path needs."""
        exists, exact, ab_all, ab_excluded = self.exists, self.exact, self.ab_all, self.ab_excluded
        strings = self._strings if self.string_work or self.grams else None
        loop = self.loop
        if not ab_all and strings is None and not loop:
            def on_string(v):
                return exists | exact.get(v, 0)
        elif strings is None and not loop:
            def on_string(v):
                return exists | exact.get(v, 0) | (ab_all & ~ab_excluded.get(v, 0))
        else:
            def on_string(v):
                s = exists | exact.get(v, 0)
                if ab_all:
                    s |= ab_all & ~ab_excluded.get(v, 0)
                if strings is not None:
                    s |= strings(v)
                for m, bits in loop:
                    if m.test(v):
                        s |= bits
                return s
        return on_string

    def _make_other_eval(self):
        """A closure for one number, boolean or null."""
        non_string, exact = self.non_string, self.exact
        ab_all, ab_excluded = self.ab_all, self.ab_excluded
        points, regions, loop = self.points, self.regions, self.loop_other
        n = len(points)

        def on_other(v):
            t = type(v)
            if t is bool:
                key = _TRUE if v else _FALSE
            elif t is int or t is float:
                try:
                    key = float(v)
                except OverflowError:
                    key = ("int", v)
            else:
                key = None
            s = non_string | exact.get(key, 0)
            if ab_all:
                s |= ab_all & ~ab_excluded.get(key, 0)
            if n and (t is int or t is float):
                x = key if type(key) is float else as_float(v)
                if x == x:  # NaN is in no range
                    i = bisect_left(points, x)
                    s |= regions[2 * i + 1] if i < n and points[i] == x else regions[2 * i]
            for m, bits in loop:
                if m.test(v):
                    s |= bits
            return s
        return on_other

    def _strings(self, v: str) -> int:
        s = 0
        n = len(v)
        if self.prefix:
            table = self.prefix
            for length in self.prefix_lens:
                if length > n:
                    break
                b = table.get(v[:length])
                if b:
                    s |= b
        if self.suffix:
            table = self.suffix
            for length in self.suffix_lens:
                if length > n:
                    break
                b = table.get(v[n - length:])
                if b:
                    s |= b
        if self.abp_all:
            excluded = 0
            for length in self.abp_lens:
                if length > n:
                    break
                excluded |= self.abp.get(v[:length], 0)
            s |= self.abp_all & ~excluded
        if self.abs_all:
            excluded = 0
            for length in self.abs_lens:
                if length > n:
                    break
                excluded |= self.abs.get(v[n - length:], 0)
            s |= self.abs_all & ~excluded
        if self.folds:
            f = v.casefold()
            m = len(f)
            b = self.equals_ic.get(f)
            if b:
                s |= b
            for length in self.prefix_ic_lens:
                if length > m:
                    break
                b = self.prefix_ic.get(f[:length])
                if b:
                    s |= b
            for length in self.suffix_ic_lens:
                if length > m:
                    break
                b = self.suffix_ic.get(f[m - length:])
                if b:
                    s |= b
            if self.abic_all:
                s |= self.abic_all & ~self.abic.get(f, 0)
        if self.grams:
            grams = self.grams
            for i in range(n - 2):
                candidates = grams.get(v[i:i + 3])
                if candidates:
                    for m, bits in candidates:
                        if s & bits != bits and m.regex.fullmatch(v) is not None:
                            s |= bits
        if self.parses_ip:
            ip = parse_ip(v)
            if ip is not None:
                b = self.ip.get(ip)
                if b:
                    s |= b
        return s
