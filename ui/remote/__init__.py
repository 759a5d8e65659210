"""Models on other machines."""
