"""From a conversation to the prompt a backend evaluates.

Render, fit the context, and which messages leave when it overflows.
"""
