"""Wire formats as pure code: bytes in, samples or queries out, no sockets and no reactor."""
