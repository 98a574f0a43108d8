"""Run render requests against a real graphite-web 1.1.8 (Debian's package) in a subprocess.

graphite-web and python3-whisper are installed from Debian and run under Debian's
``/usr/bin/python3`` with Debian's Django; the test process never imports Django. One call of
``render_batch`` starts one subprocess that

* writes a settings module of its own (everything under a temporary directory: whisper files,
  the sqlite database of Django and of the tag database, logs, the index file; no carbonlink,
  no cache),
* runs Django's ``migrate`` (the tag database lives in Django's database),
* writes each series into a whisper file (one archive ``step:1d``, xFilesFactor 0, average),
  tagged series under ``_tagged/`` as carbon writes them, and registers tagged series in the
  tag database (graphite-web's ``LocalDatabaseTagDB``),
* answers each request with ``django.test.Client().get('/render', params)`` (``noCache`` added)
  and writes a JSON list of ``{"status", "content_type", "body", "seconds"}`` (a PNG also as
  ``body_base64``); an exception the view raises is
  answered as status 500 with its type and message, as graphite-web's server would fail.

Usage::

    answers = render_batch(tmp_dir, {"a.b": [[ts, value], ...]}, [{"target": ["a.b"], "from": ..}])
"""

import json
import os
import subprocess
import textwrap
from pathlib import Path

GRAPHITE_PYTHON = "/usr/bin/python3"

_SCRIPT = textwrap.dedent(
    r'''
    import base64
    import json
    import os
    import sys

    job = json.load(open(sys.argv[1]))
    root = job["root"]
    whisper_dir = job["whisper_dir"] or os.path.join(root, "whisper")
    os.makedirs(whisper_dir, exist_ok=True)
    os.makedirs(os.path.join(root, "log"), exist_ok=True)
    with open(os.path.join(root, "tsgate_graphite_settings.py"), "w") as settings:
        settings.write(f"""
    SECRET_KEY = "tsgate-differential-test"
    STORAGE_DIR = {root!r}
    WHISPER_DIR = {whisper_dir!r}
    STANDARD_DIRS = [{whisper_dir!r}]
    LOG_DIR = {os.path.join(root, "log")!r}
    INDEX_FILE = {os.path.join(root, "index")!r}
    DATABASES = {{"default": {{"NAME": {os.path.join(root, "graphite.db")!r}, "ENGINE": "django.db.backends.sqlite3",
                               "USER": "", "PASSWORD": "", "HOST": "", "PORT": ""}}}}
    TAGDB = "graphite.tags.localdatabase.LocalDatabaseTagDB"
    TAGDB_CACHE_DURATION = 0
    CARBONLINK_HOSTS = []
    DEFAULT_XFILES_FACTOR = 0
    TIME_ZONE = "UTC"
    USE_WORKER_POOL = False
    LOG_ROTATION = False
    LOG_RENDERING_PERFORMANCE = False
    LOG_CACHE_PERFORMANCE = False
    LOG_INFO_PERFORMANCE = False
    ALLOWED_HOSTS = ["*"]
    """)
    sys.path.insert(0, root)
    os.environ["GRAPHITE_SETTINGS_MODULE"] = "tsgate_graphite_settings"
    os.environ["DJANGO_SETTINGS_MODULE"] = "graphite.settings"

    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0, interactive=False)

    import whisper
    from graphite.storage import STORE
    from graphite.tags.utils import TaggedSeries

    step = job["step"]
    for name, points in job["series"].items():
        if ";" in name:
            name = TaggedSeries.parse(name).path  # carbon stores the canonical (sorted) form
        relative = TaggedSeries.encode(name, sep=os.sep) + ".wsp"
        path = os.path.join(whisper_dir, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        whisper.create(path, [(step, 86400 // step)], xFilesFactor=0.0, aggregationMethod="average")
        whisper.update_many(path, [(t, v) for t, v in points if v is not None])
        if ";" in name:
            STORE.tagdb.tag_series(name)

    from django.test import Client
    client = Client()
    import time
    answers = []
    for params in job["requests"]:
        started = time.monotonic()
        try:
            response = client.get("/render", dict(params, noCache="1"))
            answer = {"status": response.status_code, "content_type": response.get("Content-Type", "")}
            if answer["content_type"] == "image/png":
                answer["body_base64"] = base64.b64encode(response.content).decode("ascii")
            answer["body"] = response.content.decode("utf-8", "replace")
        except Exception as error:  # the test client re-raises view exceptions
            answer = {"status": 500, "body": f"{type(error).__name__}: {error}"}
        answers.append(dict(answer, seconds=round(time.monotonic() - started, 4)))
    json.dump(answers, open(sys.argv[2], "w"))
    '''
)


class GraphiteWebError(RuntimeError):
    pass


def render_batch(
    workdir: Path,
    series: dict[str, list],
    requests: list[dict],
    step: int = 60,
    timeout: float = 120,
    whisper_dir: Path | None = None,
) -> list[dict]:
    """Write ``series`` into graphite-web's whisper files and answer every render request.
    With ``whisper_dir``, graphite-web reads the whisper files already there (``series`` adds to them).

    ``series`` maps a metric path (``a.b.c`` or ``cpu;host=a``) to ``[[epoch_seconds, value or
    None], ...]``; ``requests`` are dicts of /render parameters (a list value repeats the
    parameter, as ``target`` usually does). Returns one ``{"status": int, "content_type": str,
    "body": str, "seconds": float}`` per request, with ``body_base64`` for a PNG.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "graphiteweb_render.py"
    script.write_text(_SCRIPT)
    job = workdir / "job.json"
    job.write_text(
        json.dumps(
            {
                "root": str(workdir / "graphite"),
                "whisper_dir": str(whisper_dir) if whisper_dir else None,
                "step": step,
                "series": series,
                "requests": requests,
            }
        )
    )
    output = workdir / "answers.json"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "DJANGO", "GRAPHITE", "VIRTUAL_ENV"))
    }
    completed = subprocess.run(
        [GRAPHITE_PYTHON, "-I", str(script), str(job), str(output)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if completed.returncode != 0 or not output.exists():
        raise GraphiteWebError(f"graphite-web harness exited with {completed.returncode}:\n{completed.stderr[-5000:]}")
    return json.loads(output.read_text())
