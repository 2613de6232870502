"""A TCP proxy in front of a real web server that loses one answer: on the first connection it
forwards the request, waits until the server has answered in full (so whatever the request did
was committed), then closes the client's connection without relaying a byte of the answer — a
response dropped on the way back. Every later connection is relayed both ways untouched. It keeps
the head of each request it forwarded (`requests`), so a test can see what a retry sent."""

import socket
import threading


def _read_message(sock: socket.socket) -> bytes:
    """One HTTP/1.1 message with a Content-Length body (what httpx sends with JSON, and what the
    API answers), read in full; b"" if the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class DroppingProxy:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []  # the head of every request forwarded, in order
        self.dropped = threading.Event()
        self._connections = 0
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "DroppingProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self._connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, upstream]
            if self._connections == 1:
                threading.Thread(target=self._forward_and_drop, args=(client, upstream), daemon=True).start()
            else:
                threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _forward_and_drop(self, client: socket.socket, upstream: socket.socket) -> None:
        request = _read_message(client)
        self.requests.append(request.partition(b"\r\n\r\n")[0])
        upstream.sendall(request)
        _read_message(upstream)  # the server answered: the write is done and its answer kept
        client.close()
        upstream.close()
        self.dropped.set()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        recorder = threading.Thread(target=self._record_and_pump, args=(client, upstream), daemon=True)
        recorder.start()
        _pump(upstream, client)

    def _record_and_pump(self, client: socket.socket, upstream: socket.socket) -> None:
        # The first message of the connection is recorded; the rest flows through untouched.
        request = _read_message(client)
        if not request:
            return
        self.requests.append(request.partition(b"\r\n\r\n")[0])
        upstream.sendall(request)
        _pump(client, upstream)
