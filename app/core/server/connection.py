"""uvicorn's h11 connection, answering clients that half-close: a client may send its whole request and then shut its
side of the socket for writing (`shutdown(SHUT_WR)`, as some scripts and tools do) while it waits for the reply.
uvicorn's own protocol closes the socket at that EOF, which drops the reply and cancels the generation as if the
client had left.

An EOF alone can't tell a half-close from a client that closed and left: the server learns which only by writing. So
after an EOF that follows a complete request, the socket stays open, an interim `100 Continue` goes out (HTTP/1.1
clients must accept 1xx responses before the final one, RFC 9110 15.2), and the socket's error state is read a few
times: a client that left answers that write with a reset, and its request is then cancelled (skipped while it
waits) as before. A client that half-closed gets its reply, and the socket is closed once it is sent. An EOF in the
middle of a request, or between requests, closes the connection as before.
"""

from __future__ import annotations

import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

PEER_CHECKS_S = (0.02, 0.2, 1.0)  # after an EOF: when to look whether the write above was answered with a reset


class HalfCloseH11Protocol(H11Protocol):
    """H11Protocol that finishes the reply to a request whose client half-closed after sending all of it."""

    client_done_sending = False

    def eof_received(self) -> bool:  # type: ignore[override]
        cycle = self.cycle
        if cycle is None or cycle.more_body or cycle.response_complete:
            return False  # asyncio closes the transport: nothing is owed to this client
        self.client_done_sending = True
        probe = not cycle.response_started and self.conn.our_state is h11.SEND_RESPONSE
        if probe and self.scope.get("http_version") == "1.1":
            self.transport.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        for delay in PEER_CHECKS_S:
            self.loop.call_later(delay, self._check_peer)
        return True  # keep the socket open for writing the reply

    def _check_peer(self) -> None:
        """Drop the connection (the request's client left) when a write to it was answered with a reset."""
        if self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        try:
            failed = sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
        except OSError:
            failed = True
        if failed:
            self.transport.abort()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.client_done_sending and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            self.transport.close()
