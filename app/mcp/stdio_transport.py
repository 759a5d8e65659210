"""The stdio transport: the SDK's ``stdio_client`` with stdout read in linear time and
bounded.

The SDK (mcp 2.3) splits stdout with ``(buffer + chunk).split("\\n")``, which copies the
pending line once per 64 KiB read: a 24 MB result took 35 s, and a line had no size
limit. Here a line is collected in parts (``oversize.Collector``), so reading is linear,
and a line over ``MAX_MESSAGE_BYTES`` is replaced by a ``TOO_LARGE`` error for its
request (the server stays connected). Spawning and shutdown are the SDK's own helpers,
so a server is started and ended exactly as ``stdio_client`` does it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio
import anyio.lowlevel
from mcp.client._transport import TransportStreams
from mcp.client.stdio import (
    StdioServerParameters,
    _aclose_all,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

from app.mcp.oversize import MAX_MESSAGE_BYTES, Collector

log = logging.getLogger(__name__)

READ_BYTES = 65536
_WRITER_FLUSH_TIMEOUT = 0.5  # as the SDK's


class LineReader:
    """Splits a byte stream into lines (without the newline), each through a
    ``Collector``: an over-long line comes out as its replacement, or not at all."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self._line = Collector(limit)

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._line.add(chunk[start:end])
            self._finish(lines)
            start = end + 1
        self._line.add(chunk[start:])
        return lines

    def _finish(self, lines: list[bytes]) -> None:
        over, size = self._line.over, self._line.size
        line = self._line.take()
        if line is None:
            log.warning("a %d-byte message from an MCP server without an id was left out", size)
        elif over or line.strip():
            lines.append(line)


@asynccontextmanager
async def stdio_transport(
    server: StdioServerParameters, errlog: TextIO, limit: int = MAX_MESSAGE_BYTES
) -> AsyncIterator[TransportStreams]:
    """``mcp.client.stdio.stdio_client`` with bounded, linear reading (see the module)."""
    command = await _get_executable_command(server.command)
    process = await _create_platform_compatible_process(
        command=command,
        args=server.args,
        env=get_default_environment() | (server.env or {}),
        errlog=errlog,
        cwd=server.cwd,
    )
    # No awaits until the task group is entered (a cancel there would leak the process).
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    shutting_down = False
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout is not None
        reader = LineReader(limit)
        try:
            async with read_writer:
                try:
                    while True:
                        try:
                            chunk = await process.stdout.receive(READ_BYTES)
                        except anyio.EndOfStream:
                            return
                        for line in reader.feed(chunk):
                            text = line.decode(server.encoding, server.encoding_error_handler)
                            try:
                                await read_writer.send(_parse_line(text))
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return  # the session is gone; only the drain remains
                finally:
                    await _drain_stdout(process)
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed stdout under the read
        except (anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:
                log.exception("reading the MCP server's stdout failed mid-session")

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    json = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    data = (json + "\n").encode(server.encoding, server.encoding_error_handler)
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still run: end the read side so no request waits forever.
            await read_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()  # the reader drains, so a server stuck writing can exit
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
            await writer_done.wait()
        await _stop_server_process(process)
        await _aclose_all(read_stream, write_stream, read_writer, write_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):  # every wait inside is bounded
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
