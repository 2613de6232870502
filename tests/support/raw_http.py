"""Raw HTTP: the bytes an attacker sends, with nothing normalised by a client library."""

import socket


def raw_request(port: int, request: str) -> tuple[int, bytes]:
    """Send `request` as is to 127.0.0.1:`port`; the status and the rest of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), rest


def raw_get(port: int, target: str, host: str | None = None) -> tuple[int, bytes]:
    return raw_request(port, f"GET {target} HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\nConnection: close\r\n\r\n")
