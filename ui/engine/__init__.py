"""The Qt side of the engine thread."""
