"""docs/configuration.rst lists every setting of gateway.app.config.SETTINGS, and the per-tenant ones, as the code has them."""

from gateway.app.config import SETTINGS, TENANT_VALUES
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


def test_the_per_tenant_keys_are_the_settings_marked_per_tenant():
    """The overrides file's keys (docs/configuration.rst, "Per-tenant overrides") are the settings
    SETTINGS marks per tenant, the one place they are declared."""
    text = (REPO / "docs" / "configuration.rst").read_text(encoding="utf-8")
    table = text.split("the flag it overrides for the tenant\n")[1].split("\n\n")[0]
    keys = [line.split()[0] for line in table.splitlines() if line.strip() and not line.startswith("=")]
    assert sorted(keys) == sorted(TENANT_VALUES)
