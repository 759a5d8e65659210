"""The MCP host: tool servers from ``mcp.json``, their tools, and calls to them."""
