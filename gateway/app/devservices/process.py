"""Process helpers shared by the dev servers."""

import socket
import subprocess


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def terminate(process: subprocess.Popen | None, timeout: float) -> None:
    """SIGTERM, wait, and SIGKILL only if the process hangs."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
