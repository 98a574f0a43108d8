"""The tsgate command line and its config file, run as a user would."""

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from gateway import __version__
from gateway.app.cli import build_parser, main
from gateway.app.config import ConfigError, build_config, parse_duration, parse_hostport
from tests.gatewayproc import REPO, GatewayProcess, free_port


def tsgate(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "gateway.app.cli", *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_version():
    result = tsgate("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"tsgate {__version__}"


def config_from(*argv):
    return build_config(build_parser().parse_args(["serve", *argv]))


def test_defaults():
    config = config_from()
    assert config.http == ("0.0.0.0", 8080)
    assert config.store_url == "sqlite:///tsgate-data/tsgate.db"
    assert config.slot_width == 3_600_000


def test_http_connections_outlive_the_idle_time_of_prometheus_clients():
    """The server closing an idle keep-alive connection as Prometheus reuses it fails a remote
    write (``Failed to send batch ... EOF``): its client keeps idle connections 5 min, so the
    gateway keeps them longer and the client always closes first."""
    assert config_from().http_idle_timeout > 5 * 60_000


def test_file_then_flags(tmp_path):
    path = tmp_path / "tsgate.toml"
    path.write_text('http = "127.0.0.1:9999"\nmax_tags = 5\nmax-sample-age = "7d"\n')
    config = config_from("--config", str(path), "--max-tags", "7")
    assert config.http == ("127.0.0.1", 9999)
    assert config.max_tags == 7
    assert config.max_sample_age == 7 * 86_400_000


@pytest.mark.parametrize(
    "content, words",
    [
        ("nope = 1\n", "unknown setting 'nope'"),
        ("max_tags = -1\n", "--max-tags"),
        ("http = [\n", "--config"),
        ('slot-width = "fast"\n', "duration"),
    ],
)
def test_bad_config_file_is_refused(tmp_path, content, words):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=words):
        config_from("--config", str(path))


@pytest.mark.slow
def test_bad_flag_exits_2_with_a_message():
    result = tsgate("serve", "--http", "nowhere")
    assert result.returncode == 2 and "--http" in result.stderr


def test_parsers():
    assert parse_duration("1h30m") == 5_400_000
    assert parse_hostport("[::1]:80") == ("::1", 80)
    assert parse_hostport(":80") == ("0.0.0.0", 80)
    for bad in ("", "5", "m5", "5 m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


@pytest.mark.slow
def test_serve_from_a_config_file(tmp_path):
    process = GatewayProcess(tmp_path, "--config", str(tmp_path / "c.toml"))
    (tmp_path / "c.toml").write_text(f'data-dir = "{tmp_path / "d"}"\nlog-level = "debug"\n')
    process.start()
    try:
        assert process.post("/api/write/single", {"metricName": "m", "value": 1}).status == 200
    finally:
        assert process.stop() == 0
    assert (tmp_path / "d" / "tsgate.db").exists()


@pytest.mark.slow
def test_unwritable_store_fails_start_with_exit_1(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = tsgate(
        "serve", "--http", "127.0.0.1:0", "--graphite", "", "--pickle", "", "--data-dir", str(blocker / "sub")
    )
    assert result.returncode == 1 and "could not start" in result.stderr


def test_passwords_never_reach_the_log():
    from gateway.app.components import redact

    assert redact("cassandra://me:secret@h1,h2/ks?password=x&tls=1") == "cassandra://me:***@h1,h2/ks?password=***&tls=1"
    assert redact("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("cassandra://h:9042/ks") == "cassandra://h:9042/ks"


def run_cli(capsys, *argv) -> tuple[int, str]:
    """``tsgate *argv`` in this process: its exit code and its stderr."""
    try:
        code = main(list(argv))
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "--htpp", "127.0.0.1:8080"], "tsgate serve: unrecognized argument --htpp (did you mean --http?)"),
        (["serve", "--stor=sqlite:///x.db"], "tsgate serve: unrecognized argument --stor (did you mean --store?)"),
        (
            ["dev", "redis", "--lisen", "6379"],
            "tsgate dev redis: unrecognized argument --lisen (did you mean --listen?)",
        ),
        (["serve", "--workers", "two"], "tsgate serve: --workers: 'two' must be a positive whole number or auto"),
        (["serve", "--max-tags", "many"], "tsgate serve: --max-tags: 'many' is not a whole number"),
        (
            ["serve", "--store", "postgres://db/x"],
            "tsgate serve: --store: 'postgres://db/x': unknown scheme 'postgres'",
        ),
        (["schema", "apply", "--workers", "2"], "tsgate schema: unrecognized argument --workers"),
    ],
)
def test_cli_mistakes_get_one_line_naming_the_flag(capsys, argv, message):
    """Typos get a suggestion, abbreviations are refused (not silently taken for the flag),
    values are checked by the flag's own words; one line, exit 2."""
    code, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith(message) and err.count("\n") == 1


def test_a_mistyped_command_gets_a_suggestion(capsys):
    code, err = run_cli(capsys, "schema", "aply")
    assert code == 2 and err.startswith("tsgate schema: argument action: invalid choice: 'aply'")
    assert "(did you mean apply?)" in err and err.count("\n") == 1


def test_a_mistyped_config_key_gets_a_suggestion(tmp_path):
    path = tmp_path / "tsgate.toml"
    path.write_text("max-tag = 5\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'max-tag' \(did you mean max-tags\?\)"):
        config_from("--config", str(path))


def test_each_command_lists_only_its_own_flags(capsys):
    with pytest.raises(SystemExit):
        main(["schema", "apply", "--help"])
    schema_help = capsys.readouterr().out
    assert "--store" in schema_help and "--slot-width" in schema_help
    assert "--http" not in schema_help and "--workers" not in schema_help and "--max-tags" not in schema_help
    with pytest.raises(SystemExit):
        main(["downsample", "--help"])
    assert "--redis" in capsys.readouterr().out


def test_dev_servers_take_host_port_like_serve():
    parse = build_parser().parse_args
    assert parse(["dev", "cassandra", "--listen", "127.0.0.1:9042"]).listen == 9042
    assert parse(["dev", "redis", "--listen", ":6379"]).listen == 6379
    assert parse(["dev", "redis", "--port", "6379"]).port == 6379  # the old form still works
    with pytest.raises(SystemExit):
        parse(["dev", "redis", "--listen", "10.1.2.3:6379"])


def test_replication_and_consistency_flags_win_over_the_store_url_and_need_cassandra(capsys):
    """``--replication`` (either spelling) and the consistency flags become the store URL's options."""
    from gateway.store.cassandra import parse_url

    config = config_from(
        "--store",
        "cassandra://a,b,c/ks?consistency=ONE&replication=simple:1",
        "--replication",
        "NetworkTopologyStrategy:dc1=3,dc2=2",
        "--write-consistency",
        "each_quorum",
    )
    options = parse_url(config.store_url, config.layout)
    assert options.schema.replication == (("dc1", 3), ("dc2", 2))
    assert (options.write_consistency, options.read_consistency) == (7, 1)  # EACH_QUORUM, the URL's ONE
    assert parse_url(config_from("--store", "cassandra://a/ks").store_url, config.layout).write_consistency == 6
    simple = config_from("--store", "cassandra://a/ks", "--replication", "SimpleStrategy:3")
    assert parse_url(simple.store_url, simple.layout).schema.replication == (("simple", 3),)
    code, err = run_cli(capsys, "serve", "--write-consistency", "most")
    assert code == 2 and err.startswith("tsgate serve: --write-consistency: 'most' is not one of ALL, ANY, EACH_QUORUM")
    with pytest.raises(ConfigError, match="only a cassandra:// --store has replication and consistency"):
        config_from("--read-consistency", "ONE")
    with pytest.raises(ConfigError, match="expected simple:N, DC:N,DC:N or NetworkTopologyStrategy:DC=N,DC=N"):
        config_from("--store", "cassandra://a/ks", "--replication", "NetworkTopologyStrategy:dc1")


def test_dev_cassandra_takes_a_node_count():
    parse = build_parser().parse_args
    assert parse(["dev", "cassandra", "--nodes", "3"]).nodes == 3
    assert parse(["dev", "cassandra"]).nodes == 1
    with pytest.raises(SystemExit):
        parse(["dev", "cassandra", "--nodes", "0"])


@pytest.mark.slow
def test_schema_apply_where_nothing_listens_is_one_line_and_exit_1():
    result = tsgate("schema", "apply", "--store", f"cassandra://127.0.0.1:{free_port()}/tsdb")
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("tsgate schema apply: cannot reach Cassandra (127.0.0.1:") and "is it running?" in line


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [["serve", "--http", "127.0.0.1:0", "--graphite", "", "--pickle", "", "--workers", "1"], ["downsample", "--once"]],
)
def test_an_unreachable_store_is_one_line_without_driver_tracebacks(command):
    result = tsgate(*command, "--store", f"cassandra://127.0.0.1:{free_port()}/tsdb")
    assert result.returncode == 1 and "Traceback" not in result.stderr and "cassandra.cluster" not in result.stderr
    assert (
        "could not start: --store cassandra://127.0.0.1:" in result.stderr and "cannot reach Cassandra" in result.stderr
    )


@pytest.mark.slow
def test_a_worker_refusing_its_settings_is_not_retried(tmp_path):
    schemas = tmp_path / "storage-schemas.conf"
    schemas.write_text("[everything]\npattern = .*\n")  # no retentions: refused when the gateway is built
    result = tsgate(
        "serve", "--http", "127.0.0.1:0", "--graphite", "", "--pickle", "", "--workers", "2",
        "--data-dir", str(tmp_path), "--graphite-storage-schemas", str(schemas),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr  # a bad setting, as with --workers 1
    (line,) = result.stderr.splitlines()
    assert "ERROR [worker 0 pid " in line and "bad setting: " in line


def one_line(result: subprocess.CompletedProcess, code: int) -> str:
    """The only line a failed command printed on stderr, checked with its exit code."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    return line


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_unreachable_store_at_serve_is_one_line_naming_the_store_and_its_flag(workers):
    """Not four lines of stopping, nor three worker restarts: the reason, the URL, the flag."""
    store = f"cassandra://127.0.0.1:{free_port()}/tsdb"
    serve = ("serve", "--http", f"127.0.0.1:{free_port()}", "--graphite", "", "--pickle", "", "--workers", workers)
    line = one_line(tsgate(*serve, "--store", store), 1)
    assert f"could not start: --store {store}: cannot reach Cassandra (127.0.0.1:" in line


@pytest.mark.slow
def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tsgate(
            "serve", "--http", f"127.0.0.1:{port}", "--graphite", "", "--pickle", "", "--data-dir", str(tmp_path)
        )
    line = one_line(result, 1)
    assert line.endswith(f"could not start: cannot listen on 127.0.0.1:{port} (--http): Address already in use")


@pytest.mark.slow
def test_a_data_dir_that_is_a_file_is_one_line_naming_the_flag(tmp_path):
    (tmp_path / "afile").write_text("")
    result = tsgate(
        "serve",
        "--http",
        f"127.0.0.1:{free_port()}",
        "--graphite",
        "",
        "--pickle",
        "",
        "--data-dir",
        "afile",
        cwd=tmp_path,
    )
    line = one_line(result, 1)
    assert line.endswith("could not start: --data-dir afile: afile is a file, not a directory")


@pytest.mark.slow
@pytest.mark.parametrize(
    "selector, reason",
    [
        ('job="web"', " (invalid promql query)"),
        ("up{", " (unexpected end of input inside braces)"),
        ("rate(up[5m])", ""),
    ],
)
def test_delete_of_something_not_a_selector_is_one_line_before_the_store_opens(tmp_path, selector, reason):
    result = tsgate("delete", "--match", selector, "--data-dir", str(tmp_path / "data"))
    line = one_line(result, 2)
    assert line.startswith(
        f"tsgate delete: --match {selector!r} is not a series selector{reason}: write one as in PromQL"
    )
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_delete_and_import_do_not_say_twisted_main_loop_terminated(tmp_path):
    (tmp_path / "whisper").mkdir()
    data = ("--data-dir", str(tmp_path / "data"))
    deleted = tsgate("delete", "--match", '{job="web"}', *data)
    imported = tsgate("import", "whisper", str(tmp_path / "whisper"), "--workers", "1", *data)
    assert deleted.returncode == 0 and imported.returncode == 0, (deleted.stderr, imported.stderr)
    assert "Main loop terminated" not in deleted.stderr + imported.stderr


def test_help_is_plain_text_without_markup(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "`" not in text and "'tsgate serve' runs the gateway" in text
    for command in (["serve"], ["schema", "apply"], ["delete"], ["import", "whisper"], ["dev", "cassandra"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert "`" not in capsys.readouterr().out, command


def test_http_off_is_a_setting():
    config = config_from("--http", "off", "--graphite", "127.0.0.1:2003")
    assert config.http is None and set(config.listeners) == {"graphite", "pickle"}


@pytest.mark.slow
def test_a_carbon_only_process_with_http_off_stores_lines(tmp_path):
    """``--http off``: carbon in, no HTTP port; what it stored is there for the next process."""
    carbon = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.app.cli", "serve", "--http", "off", "--graphite", f"127.0.0.1:{carbon}",
         "--pickle", "off", "--data-dir", str(tmp_path / "data")],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        started = next(line for line in process.stderr if " tsgate " in line or "could not start" in line)
        assert "HTTP on off, graphite 127.0.0.1:" in started and "pickle off" in started, started
        with socket.create_connection(("127.0.0.1", carbon)) as connection:
            connection.sendall(f"servers.web1.cpu 42 {int(time.time())}\n".encode())
        time.sleep(1)  # carbon batches for up to 50 ms; the stop stores what was accepted anyway
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    counted = tsgate("delete", "--graphite", "servers.*.cpu", "--dry-run", "--data-dir", str(tmp_path / "data"))
    assert "servers.web1.cpu: 1 samples" in counted.stdout, counted.stdout + counted.stderr


@pytest.mark.slow
def test_a_write_refused_whole_says_none_were_written(tmp_path):
    from protocols.prometheus import WriteSeries, encode_write_request_v1

    gateway = GatewayProcess(tmp_path, "--max-tags", "1").start()
    try:
        answer = gateway.post("/api/write", [{"metricName": "m", "tags": {"a": "1", "b": "2"}, "value": 1}])
        assert answer.status == 400 and answer.json()["error"] == "1 of 1 samples rejected; none were written"
        answer = gateway.post("/api/write", [{"metricName": "m", "value": 1}, {"metricName": "", "value": 1}])
        assert answer.json()["error"] == "1 of 2 samples rejected; the others were written"
        body = encode_write_request_v1([WriteSeries({"__name__": "m", "a": "1", "b": "2"}, [(1763640000000, 1.0)])])
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
        answer = gateway.post("/api/v1/write", body, headers=headers)
        assert answer.status == 400 and answer.body.decode().endswith("; none were written"), answer.body
    finally:
        gateway.stop()


@pytest.mark.slow
def test_json_answers_end_with_a_newline(start_gateway):
    """curl's output, then the shell prompt on a line of its own: every JSON answer (from the
    gateway itself, from a query executor, an error, a large one) ends with one newline."""
    gateway = start_gateway()
    now_ms = int(time.time() * 1000)
    samples = [{"metricName": "nl", "ts": now_ms - i, "value": i} for i in range(50_000)]
    answer = gateway.post("/api/write", samples)
    assert answer.status == 200, answer.body
    for path in (
        "/healthz",
        "/api/metadata/tenants",
        "/api/v1/query?query=1",
        "/render?target=constantLine(1)&format=json",
        "/api/query?metricName=nl&granularity=raw",  # over a MiB: written as the client takes it
        "/api/query?start=yesterday",
        "/nowhere",
    ):
        body = gateway.get(path).body
        assert body.endswith(b"\n") and not body.endswith(b"\n\n"), (path, body[-40:])
        json.loads(body)
    assert len(gateway.get("/api/query?metricName=nl&granularity=raw").body) > 1 << 20


@pytest.mark.slow
def test_delete_takes_and_prints_utf8_names_as_prometheus_3_writes_them(tmp_path):
    gateway = GatewayProcess(tmp_path).start()
    try:
        series = {"metricName": "http.server.request.duration", "tags": {"k8s.pod.name": "p-1"}, "value": 1}
        assert gateway.post("/api/write", [series]).status == 200
    finally:
        assert gateway.stop() == 0
    selector = '{"http.server.request.duration", "k8s.pod.name"="p-1"}'
    counted = tsgate("delete", "--match", selector, "--dry-run", "--data-dir", str(tmp_path / "data"))
    assert f"{selector}: 1 samples" in counted.stdout, counted.stdout + counted.stderr
