"""Graphite metric paths: plain ``a.b.c``, tagged ``name;k=v`` and carbon's ``name{k="v"}`` form.

Rules follow carbon/graphite-web 1.1.x ``TaggedSeries``; where this module
differs (empty nodes, whitespace) it says so. See docs/graphite.rst (Wire formats).
"""

from protocols.graphite import BAD_PATH, BAD_TAG, InvalidInput, excerpt

# TaggedSeries.prohibitedTagChars in carbon and graphite-web 1.1.x.
PROHIBITED_TAG_KEY_CHARS = ";!^="


def parse_path(path: str) -> tuple[str, dict[str, str]]:
    """Split a received path into (metric name, tags) or raise InvalidInput.

    Whitespace and non-printable characters are refused anywhere, so a
    stored series can always be written back as a plaintext line.
    """
    if not path.isprintable() or " " in path:
        raise InvalidInput(BAD_PATH, "whitespace or non-printable character: " + excerpt(path))
    if ";" in path:
        return _parse_semicolon_form(path)
    if "{" in path and path.endswith('"}'):
        return _parse_braces_form(path)
    return clean_name(path), {}


def clean_name(name: str) -> str:
    """Drop empty nodes and a leading run of '~' and '.' from a metric name.

    Carbon's whisper layout already merges ``a..b`` into ``a.b`` and strips a
    leading '.', graphite strips a leading '~' (tag values may not start with
    it), and carbon-c-relay removes double, leading and trailing dots: doing it
    here keeps one series per name instead of aliases.
    """
    if not name:
        raise InvalidInput(BAD_PATH, "empty metric name")
    if name[0] in "~." or name[-1] == "." or ".." in name:
        cleaned = ".".join(node for node in name.lstrip("~.").split(".") if node)
        if not cleaned:
            raise InvalidInput(BAD_PATH, "metric name has no node: " + excerpt(name))
        return cleaned
    return name


def check_tag(key: str, value: str) -> None:
    """Graphite 1.1 TaggedSeries.validateTagAndValue rules, raising InvalidInput."""
    if not key:
        raise InvalidInput(BAD_TAG, "empty tag name")
    if not value:
        raise InvalidInput(BAD_TAG, "empty value for tag " + excerpt(key))
    for char in PROHIBITED_TAG_KEY_CHARS:
        if char in key:
            raise InvalidInput(BAD_TAG, f"character {char!r} in tag name " + excerpt(key))
    if ";" in value:
        raise InvalidInput(BAD_TAG, "character ';' in value of tag " + excerpt(key))
    if value[0] == "~":
        raise InvalidInput(BAD_TAG, "value starts with '~' in tag " + excerpt(key))


def format_tagged_path(name: str, tags: dict[str, str]) -> str:
    """Graphite's canonical ``name;k1=v1;k2=v2``.

    Graphite sorts the ``;k=v`` strings, not the keys: that differs from a key
    sort when one key is a prefix of another (``dc2`` sorts before ``dc``
    because '2' < '='), and the canonical form must match graphite's exactly.
    """
    return name + "".join(sorted(f";{key}={value}" for key, value in tags.items()))


def _parse_semicolon_form(path: str) -> tuple[str, dict[str, str]]:
    """``name;k=v;...``: the value may contain '='; a repeated key keeps its last value."""
    name, *segments = path.split(";")
    name = clean_name(name)
    tags = {}
    for segment in segments:
        key, equals, value = segment.partition("=")
        if not equals:
            raise InvalidInput(BAD_TAG, "tag without '=': " + excerpt(segment))
        check_tag(key, value)
        tags[key] = value
    return name, _without_name_tag(tags)


def _parse_braces_form(path: str) -> tuple[str, dict[str, str]]:
    """Carbon's ``name{k="v",...}`` form: values are quoted, with \\" and \\\\ escapes only."""
    name, _, body = path[:-1].partition("{")
    name = clean_name(name)
    tags = {}
    position = 0
    while position < len(body):
        key_end = body.find('="', position)
        if key_end < 0:
            raise InvalidInput(BAD_TAG, 'expected key="value": ' + excerpt(body[position:]))
        key = body[position:key_end]
        value, position = _read_quoted(body, key_end + 2)
        if position < len(body):
            if body[position] != ",":
                raise InvalidInput(BAD_TAG, "expected ',' after value: " + excerpt(body[position:]))
            position += 1
        check_tag(key, value)
        tags[key] = value
    return name, _without_name_tag(tags)


def _read_quoted(body: str, position: int) -> tuple[str, int]:
    """Read the value after an opening quote; return it and the index past the closing quote."""
    chars: list[str] = []
    while position < len(body):
        char = body[position]
        if char == '"':
            return "".join(chars), position + 1
        if char == "\\":
            escaped = body[position + 1 : position + 2]
            if escaped not in ('"', "\\"):
                raise InvalidInput(BAD_TAG, "bad escape in tag value: " + excerpt(body))
            char = escaped
            position += 1
        chars.append(char)
        position += 1
    raise InvalidInput(BAD_TAG, "unterminated tag value: " + excerpt(body))


def _without_name_tag(tags: dict[str, str]) -> dict[str, str]:
    """Graphite overwrites a client-sent ``name`` tag with the metric name, so it is dropped."""
    tags.pop("name", None)
    return tags
