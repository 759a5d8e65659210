"""The main window: its frame, actions, layout, docks and the app-level notices."""
