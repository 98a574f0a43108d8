"""Start and stop of a real ``tsgate serve``: failures before serving exit 1 promptly with the
reason, in one process and under ``--workers`` alike."""

import socket

import pytest

from tests.gatewayproc import free_port, tsgate_serve

PROMPTLY_S = 15  # a hang makes tsgate_serve's timeout fail the test


@pytest.fixture
def taken_port():
    """A port some other process is listening on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def serve_until_exit(tmp_path, *args: str) -> str:
    """Run `tsgate serve` expecting it to fail before serving: exit 1, promptly; its stderr."""
    result, elapsed = tsgate_serve(tmp_path, "--http", f"127.0.0.1:{free_port()}", *args, timeout=PROMPTLY_S)
    assert result.returncode == 1, result.stderr
    assert elapsed < PROMPTLY_S
    return result.stderr


@pytest.mark.parametrize("listener", ["http", "graphite", "pickle"])
def test_a_port_in_use_exits_1(tmp_path, taken_port, listener):
    stderr = serve_until_exit(tmp_path, "--workers", "1", f"--{listener}", f"127.0.0.1:{taken_port}")
    assert "could not start" in stderr and f"127.0.0.1:{taken_port}" in stderr and "Address already in use" in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_data_dir_that_cannot_be_created_exits_1(tmp_path, workers):
    blocker = tmp_path / "file"
    blocker.write_text("")
    stderr = serve_until_exit(tmp_path, "--workers", workers, "--data-dir", str(blocker / "data"))
    assert "could not start" in stderr and "Not a directory" in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_database_file_that_cannot_be_opened_exits_1(tmp_path, workers):
    """The store's thread pools are running by the time SQLite fails: they are stopped too.
    (A directory where the file should be fails as a read-only data dir does, even as root.)"""
    (tmp_path / "data" / "tsgate.db").mkdir(parents=True)
    stderr = serve_until_exit(tmp_path, "--workers", workers, "--data-dir", str(tmp_path / "data"))
    assert "could not start: sqlite: unable to open database file" in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_file_that_is_not_a_database_exits_1(tmp_path, workers):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tsgate.db").write_bytes(b"not a database " * 100)
    stderr = serve_until_exit(tmp_path, "--workers", workers, "--data-dir", str(tmp_path / "data"))
    assert "could not start: file is not a database" in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_unreachable_cassandra_exits_1(tmp_path, workers):
    stderr = serve_until_exit(tmp_path, "--workers", workers, "--store", f"cassandra://127.0.0.1:{free_port()}/ks")
    assert "could not start: cassandra: NoHostAvailable" in stderr
