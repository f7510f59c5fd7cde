"""Run ``phoenix serve`` with its OTLP/gRPC receiver on loopback only.

Phoenix (checked with 20.x) binds gRPC to ``[::]:PHOENIX_GRPC_PORT`` unconditionally; no setting
restricts it (PHOENIX_HOST covers only the HTTP server). This launcher rewrites that address to
127.0.0.1 before starting Phoenix's own CLI, so a test service never listens on outside
interfaces. Usage: ``python phoenix_loopback.py serve``.
"""

import sys

import grpc.aio._server as grpc_server


def _loopback(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("[::]", "0.0.0.0", "") else address


_insecure, _secure = grpc_server.Server.add_insecure_port, grpc_server.Server.add_secure_port
grpc_server.Server.add_insecure_port = lambda self, address: _insecure(self, _loopback(address))
grpc_server.Server.add_secure_port = lambda self, address, credentials: _secure(
    self, _loopback(address), credentials
)

if __name__ == "__main__":
    from phoenix.server.main import main

    sys.argv[0] = "phoenix"
    sys.exit(main())
