"""Tools: the MCP servers' settings page, consent to run a server, the host's lifecycle."""
