"""The public remote-write receiver compliance suite (prometheus/compliance, remotewrite/receiver,
pinned in tests/compliance.py) against a real ``tsgate serve``, on both stores.

Every MUST case passes, native histograms and exemplars included; SHOULD and MAY results are
printed (``pytest -s``) and in failure messages.
"""

from collections import Counter

from tests.compliance import SUITE_VERSION, run_suite

LEVEL_ORDER = {"MUST": 0, "SHOULD": 1, "MAY": 2}


def summary(cases) -> str:
    counts = Counter((case.level, case.passed) for case in cases)
    levels = sorted({case.level for case in cases}, key=lambda level: LEVEL_ORDER.get(level, len(LEVEL_ORDER)))
    lines = [
        f"receiver compliance suite {SUITE_VERSION}: {sum(case.passed for case in cases)} of {len(cases)} cases passed"
    ]
    for level in levels:
        failed = sorted(case.name for case in cases if case.level == level and not case.passed)
        lines.append(f"  {level}: {counts[level, True]} passed, {counts[level, False]} failed")
        lines += [f"    failed: {name}" for name in failed]
    return "\n".join(lines)


def test_remote_write_receiver_compliance(start_gateway, backend_args, tenant, tmp_path):
    gateway = start_gateway(*backend_args)
    cases = run_suite(f"{gateway.url}/api/v1/write?tenant={tenant}", tmp_path / "compliance")
    report = summary(cases)
    print(f"\n{report}")

    failed_must = [case for case in cases if case.level == "MUST" and not case.passed]
    assert cases and not failed_must, (
        "MUST cases failing:\n" + "\n".join(case.output for case in failed_must) + f"\n{report}"
    )
