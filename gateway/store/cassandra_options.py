"""The Cassandra options that are both ``--store`` URL options and flags of their own
(``--replication``, ``--write-consistency``, ``--read-consistency``): their one home. Each is
parsed here, for the URL (``parse_url``) and for its flag (gateway.app.config) alike, and a flag
given replaces the URL's option (``with_flag_options``). docs/configuration.rst."""

from urllib.parse import parse_qsl, urlencode

# URL option -> the flag that sets it too
FLAG_OPTIONS = {
    "replication": "replication",
    "write_consistency": "write-consistency",
    "read_consistency": "read-consistency",
}


def parse_replication(text: str) -> tuple[tuple[str, int], ...]:
    """``simple:3`` or ``dc1:3,dc2:2``; also spelt with the strategy's name, as CQL has it:
    ``SimpleStrategy:3`` or ``NetworkTopologyStrategy:dc1=3,dc2=2``."""
    strategy, _, factors = text.partition(":")
    if strategy == "SimpleStrategy":
        text = f"simple:{factors}"
    elif strategy == "NetworkTopologyStrategy":
        text = factors.replace("=", ":")
    pairs = []
    for item in text.split(","):
        name, _, factor = item.partition(":")
        if not name or not factor.isdigit() or int(factor) < 1:
            raise ValueError(f"replication {text!r}: expected simple:N, DC:N,DC:N or NetworkTopologyStrategy:DC=N,DC=N")
        pairs.append((name, int(factor)))
    if any(name == "simple" for name, _ in pairs) and len(pairs) > 1:
        raise ValueError(f"replication {text!r}: simple:N stands alone")
    return tuple(pairs)


def parse_consistency(name: str) -> int:
    """The driver's value of a consistency level name (any case)."""
    from cassandra import ConsistencyLevel  # the driver, only once a Cassandra option is read

    try:
        return ConsistencyLevel.name_to_value[name.strip().upper()]
    except KeyError:
        choices = ", ".join(sorted(ConsistencyLevel.name_to_value))
        raise ValueError(f"{name!r} is not one of {choices}") from None


def replication_flag(text) -> str:
    """``--replication``: checked as the URL option is; empty: the URL's."""
    text = str(text).strip()
    if text:
        parse_replication(text)
    return text


def consistency_flag(text) -> str:
    """``--write-consistency``, ``--read-consistency``: a level name, checked; empty: the URL's."""
    text = str(text).strip()
    if text:
        parse_consistency(text)
    return text.upper()


def with_flag_options(url: str, flags: dict[str, str]) -> str:
    """``url`` with the options the flags give (``{URL option: value}``, empty ones left out)
    replacing its own."""
    given = {option: value for option, value in flags.items() if value}
    if not given:
        return url
    location, _, query = url.partition("?")
    merged = dict(parse_qsl(query, keep_blank_values=True))
    merged.update(given)
    return f"{location}?{urlencode(merged, safe=':,=')}"
