"""The conversation: transcript, input, sidebar and prompt controls."""
