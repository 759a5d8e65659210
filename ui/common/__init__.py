"""Small Qt helpers every group may use."""
