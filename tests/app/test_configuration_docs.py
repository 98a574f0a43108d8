"""docs/configuration.rst lists every setting of gateway.app.config.SETTINGS, as the code has them."""

from gateway.app.config import SETTINGS
from tests.gatewayproc import REPO

NAME_WIDTH = max(len("--" + s.name) for s in SETTINGS)
RULE = "=" * NAME_WIDTH + "  " + "=" * 25 + "  " + "=" * 70


def settings_table() -> str:
    """The settings table of docs/configuration.rst; paste this when a setting changes."""
    rows = [f"{'--' + s.name:<{NAME_WIDTH}}  {s.default or '(none)':<25}  {s.help}".rstrip() for s in SETTINGS]
    return "\n".join([RULE, f"{'setting':<{NAME_WIDTH}}  {'default':<25}  meaning", RULE, *rows, RULE]) + "\n"


def test_the_settings_table_matches_the_code():
    """The first column is as wide as the longest flag, so the table stays valid reStructuredText."""
    assert settings_table() in (REPO / "docs" / "configuration.rst").read_text(encoding="utf-8")
