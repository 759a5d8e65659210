"""Performance charts and the hardware page."""
