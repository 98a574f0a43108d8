"""docs/configuration.rst lists every setting of gateway.config.SETTINGS, as the code has them."""

from gateway.config import SETTINGS
from tests.gatewayproc import REPO

RULE = "=" * 33 + "  " + "=" * 25 + "  " + "=" * 70


def settings_table() -> str:
    """The settings table of docs/configuration.rst; paste this when a setting changes."""
    rows = [f"{'--' + s.name:<33}  {s.default or '(none)':<25}  {s.help}".rstrip() for s in SETTINGS]
    return "\n".join([RULE, f"{'setting':<33}  {'default':<25}  meaning", RULE, *rows, RULE]) + "\n"


def test_the_settings_table_matches_the_code():
    assert settings_table() in (REPO / "docs" / "configuration.rst").read_text(encoding="utf-8")
