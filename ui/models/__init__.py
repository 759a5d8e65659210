"""Getting, choosing and loading models."""
