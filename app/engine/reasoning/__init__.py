"""Thinking in a reply: how a template marks it, and the split into thinking and answer."""
