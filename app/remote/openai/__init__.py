"""OpenAI-compatible servers as a Backend: the wire format, replies and tool calls."""
