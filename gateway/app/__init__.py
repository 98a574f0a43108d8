"""The running program: settings, the ``tsgate`` command, the service that wires the
store, paths and HTTP together, worker and executor processes, the whisper import."""
