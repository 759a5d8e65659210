"""A real MCP server for the tests, written with the official SDK.

Run ``python tests/mcp_server.py --stdio`` or ``--http PORT`` (on 127.0.0.1).
``--garbage``: write a line that is not JSON-RPC on stdout before speaking MCP (a
server that breaks the protocol). ``--exit-at-start``: write to stderr and exit 3.
``--prefix P``: every tool name starts with P (two servers without a clash).
``--json``: over HTTP, answer with JSON bodies instead of server-sent events.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

# A 1x1 PNG, for the image placeholder.
_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def build(prefix: str = "", log_level: str = "WARNING") -> MCPServer[Any]:
    """The server with its tools (names prefixed with ``prefix``)."""
    server: MCPServer[Any] = MCPServer("lamplight-test", log_level=log_level)  # type: ignore[arg-type]

    @server.tool(name=f"{prefix}add", description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(name=f"{prefix}echo", description="Say the text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(name=f"{prefix}slow", description="Sleep, then answer.")
    async def slow(seconds: float) -> str:
        import anyio

        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(name=f"{prefix}crash", description="Die in the middle of the call.")
    def crash() -> str:
        sys.stderr.write("about to crash\n")
        sys.stderr.flush()
        os._exit(7)

    @server.tool(name=f"{prefix}spawn_child", description="Start a sleeping child process.")
    def spawn_child() -> int:
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return child.pid

    @server.tool(name=f"{prefix}pid", description="The server's process id.")
    def pid() -> int:
        return os.getpid()

    @server.tool(name=f"{prefix}big", description="A large text result.")
    def big(kib: int) -> str:
        return "x" * (kib * 1024)

    @server.tool(name=f"{prefix}structured", description="A structured result.")
    def structured() -> dict[str, Any]:
        return {"answer": 42, "items": [1, 2]}

    @server.tool(name=f"{prefix}fail", description="Always fails.")
    def fail() -> str:
        raise ToolError("this tool always fails")

    @server.tool(name=f"{prefix}image", description="An image and some text.")
    def image() -> list[Any]:
        data = base64.b64encode(_PNG).decode()
        return [
            TextContent(type="text", text="a picture:"),
            ImageContent(type="image", data=data, mime_type="image/png"),
        ]

    @server.tool(name=f"{prefix}getenv", description="An environment variable.")
    def getenv(name: str) -> str:
        return os.environ.get(name, "<unset>")

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--stdio", action="store_true")
    mode.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--garbage", action="store_true")
    parser.add_argument("--exit-at-start", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.exit_at_start:
        sys.stderr.write("cannot start: no configuration\n")
        sys.exit(3)
    if args.garbage:
        sys.stdout.write("Welcome! this is not JSON-RPC\n")
        sys.stdout.flush()
        time.sleep(0.05)
    server = build(args.prefix)
    if args.stdio:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http, json_response=args.json)


if __name__ == "__main__":
    main()
