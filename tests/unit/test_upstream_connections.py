"""The gateway's connections to a model server: a connection the server closes as a request
goes out (its keep-alive ran out) costs the caller nothing."""

from __future__ import annotations

import asyncio

from gateway.upstream import KEEPALIVE_S, Upstreams

ANSWER = b'{"ok": true}'


async def _server(closed_first: int) -> tuple[asyncio.Server, list[int]]:
    """A model server that reads each request; the first ``closed_first`` connections are
    closed without an answer, the rest answered 200."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        if len(connections) > closed_first:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
                + ANSWER
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, connections


async def _post(closed_first: int) -> tuple[int | str, int]:
    server, connections = await _server(closed_first)
    port = server.sockets[0].getsockname()[1]
    upstreams = Upstreams([f"http://127.0.0.1:{port}"])
    await upstreams.start()
    try:
        _replica, response = await upstreams.post("/v1/chat/completions", b'{"model": "m"}')
        body = await response.read()
        response.release()
        assert body == ANSWER
        return response.status, len(connections)
    except Exception as exc:  # the old behaviour: the caller got no answer
        return type(exc).__name__, len(connections)
    finally:
        await upstreams.close()
        server.close()
        await server.wait_closed()


def test_a_connection_closed_without_an_answer_is_tried_once_more() -> None:
    assert asyncio.run(_post(closed_first=1)) == (200, 2)


def test_a_server_that_never_answers_is_unavailable_after_one_more_try() -> None:
    assert asyncio.run(_post(closed_first=5)) == ("UpstreamUnavailableError", 2)


def test_idle_connections_are_dropped_before_vllms_keep_alive_drops_them() -> None:
    # vLLM and uvicorn close an idle connection after 5 s.
    assert KEEPALIVE_S < 5
