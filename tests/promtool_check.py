"""Ask Prometheus 2.42 itself for the answers of the PromQL test files (tests/promqltest.py):
each file's loads become ``promtool test rules`` input series, each eval (each step of a range
eval) an instant ``promql_expr_test``, and Prometheus's answers are compared with the file's
expectations with the same tolerance. Order is not checked (promtool sorts), nor are ranges
using ``start()``/``end()`` (an instant query has no range), nor the cases marked ``# Prometheus 3:``
(where 3.x changed the semantics and the file follows 3.x).

    python -m tests.promtool_check tests/promql/*.test     # prints the cases Prometheus answers otherwise
"""

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from functools import reduce
from pathlib import Path

from tests.promqltest import Clear, Eval, Load, compare, duration_ms, is_stale, labels, parse_file, series_end

_GOT = re.compile(r"^\s+got: (.*)$")
_EXPR = re.compile(r'^\s+expr: (".*"), time: (\S+),(?: err: (.*))?$')


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        raise RuntimeError("promtool (Debian's prometheus package, 2.42) is needed: apt-get install -y prometheus")
    return binary


def _value(value: float) -> str:
    if math.isnan(value):
        return "stale" if is_stale(value) else "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)


def _series_text(series_labels: dict[str, str]) -> str:
    name = series_labels.get("__name__", "")
    rest = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(series_labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def _input_series(loads: list[Load]) -> tuple[int, list[dict]]:
    """The loads' samples as promtool input series on one interval (the loads' common divisor)."""
    interval = reduce(math.gcd, [load.interval_ms for load in loads], 0) or 60_000
    points: dict[tuple, dict[int, float]] = {}
    for load in loads:
        for series_labels, ts, value in load.samples():
            points.setdefault(tuple(sorted(series_labels.items())), {})[ts] = value
    found = []
    for key, by_time in points.items():
        last = max(by_time) // interval
        values = [_value(by_time[i * interval]) if i * interval in by_time else "_" for i in range(last + 1)]
        found.append({"series": _series_text(dict(key)), "values": " ".join(values)})
    return interval, found


def _duration(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def check(path: Path) -> list[str]:
    """The cases of ``path`` whose expectations Prometheus 2.42 does not give."""
    states: list[tuple[list[Load], list[Eval]]] = [([], [])]
    for command in parse_file(path):
        if isinstance(command, Clear):
            states.append(([], []))
        elif isinstance(command, Load):
            if states[-1][1]:
                states.append((states[-1][0] + [command], []))
            else:
                states[-1][0].append(command)
        elif not (command.prometheus3 or command.step_ms and re.search(r"\b(start|end)\(\)", command.expr)):
            states[-1][1].append(command)
    with tempfile.TemporaryDirectory() as directory:
        files = []
        for number, (loads, evals) in enumerate(states):
            if not evals:
                continue
            interval, series = _input_series(loads) if loads else (60_000, [])
            tests = [
                {"expr": case.expr, "eval_time": _duration(ms), "exp_samples": []}
                for case in evals
                for ms in case.times_ms
            ]
            document = {"tests": [{"interval": _duration(interval), "input_series": series, "promql_expr_test": tests}]}
            file = Path(directory) / f"state{number}.yml"
            file.write_text(json.dumps(document))
            files.append((number, file))
        output = subprocess.run(
            [promtool(), "test", "rules", *[str(f) for _, f in files]],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",  # an error message may hold a query's bytes that are no UTF-8 ("\xff")
            cwd=directory,
        ).stdout
        answers = _answers(output, {str(f.name): n for n, f in files})
    problems = []
    for number, (_, evals) in enumerate(states):
        for case in evals:
            problem = _disagreement(case, [answers.get((number, case.expr, ms), []) for ms in case.times_ms])
            if problem:
                problems.append(f"{path.name}:{case.line}: {case.expr}\n      " + "\n      ".join(problem))
    return problems


def _answers(output: str, state_of: dict[str, int]) -> dict:
    """(state, expr, time ms) -> the list of (labels, value) promtool got, or an error text."""
    answers: dict = {}
    state, key = None, None
    for line in output.splitlines():
        if line.startswith("Unit Testing:"):
            state = state_of[Path(line.split(":", 1)[1].strip()).name]
        elif expr := _EXPR.match(line):
            key = (state, json.loads(expr.group(1)), duration_ms(expr.group(2)))
            if expr.group(3) is not None:
                answers[key] = expr.group(3)
        elif got := _GOT.match(line):
            answers[key] = [] if got.group(1) == "nil" else _parse_samples(got.group(1))
        elif line.strip() not in ("", "SUCCESS", "FAILED:") and not line.strip().startswith("exp:"):
            raise RuntimeError(f"promtool said what this check cannot read: {line!r}")
    return answers


def _parse_samples(text: str) -> list[tuple[dict[str, str], float]]:
    """promtool's ``{__name__="m", a="b"} 1E+00, {} NaN`` as (labels, value) pairs."""
    found = []
    while text:
        end = series_end(text)
        head, (value, _, text) = text[:end], text[end:].strip().partition(", ")
        found.append((labels(head), float(value)))
    return found


def _disagreement(case: Eval, answers: list) -> list[str]:
    errors = [a for a in answers if isinstance(a, str)]
    if case.fails:
        return [] if errors else ["Prometheus answers without an error"]
    if errors:
        return [f"Prometheus fails: {errors[0]}"]
    by_series: dict[tuple, list] = {}
    for step, samples in enumerate(answers):
        for series_labels, value in samples:
            by_series.setdefault(tuple(sorted(series_labels.items())), [None] * len(answers))[step] = value
    got = [(dict(key), points) for key, points in by_series.items()]
    return compare(replace(case, ordered=False), got)


def main(paths: list[str]) -> int:
    problems = [problem for path in paths for problem in check(Path(path))]
    print("\n".join(problems + [f"{len(problems)} disagreement(s)"]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
