"""Everything Qt: the window, widgets and the engine worker thread."""
