"""The composition root (gateway/app/components.py): every component declares what it needs, with
no circle; each role target builds from the settings alone; a query executor builds no ingest part."""

import pytest

from gateway.app.cli import build_parser
from gateway.app.components import BUILDERS, TARGETS, Components
from gateway.app.config import build_config

pytestmark = pytest.mark.fast


def test_components_need_only_components_and_form_no_circle():
    unknown = {name: [n for n in needs if n not in BUILDERS] for name, (_, needs) in BUILDERS.items()}
    assert {name: needs for name, needs in unknown.items() if needs} == {}
    assert all(wanted in BUILDERS for wanted in (name for names in TARGETS.values() for name in names))
    order: list[str] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, f"circle: {' -> '.join((*trail, name))}"
        if name not in order:
            for need in BUILDERS[name][1]:
                visit(need, (*trail, name))
            order.append(name)

    for name in BUILDERS:
        visit(name, ())
    assert sorted(order) == sorted(BUILDERS)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_each_role_target_builds_from_the_settings(target, tmp_path):
    components = Components(build_config(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)])))
    components.target(target)
    assert set(TARGETS[target]) <= set(components.built)
    built_twice = {name: components.get(name) for name in components.built}
    assert all(components.get(name) is found for name, found in built_twice.items())


def test_a_query_executor_builds_no_ingest_part(tmp_path):
    config = build_config(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)]))
    built = Components(config).target("query-executor").built
    assert not {"pipeline", "created", "known_series", "marks", "deleter", "executors"} & set(built)
    assert built["store"].retentions is built["overrides"].retentions
