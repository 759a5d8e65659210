"""The engine host: one queue of jobs on the one engine thread, Qt-free.

``EngineHost`` (``host.py``) owns the backend in use and runs every request on its
thread, in order: loads, snapshots, wishes (``core.py``) and replies (``replies.py``),
the GUI's and the API's alike. It reports through a ``HostListener`` (``listener.py``);
a reply's events go to its job's sink, ending with exactly one terminal event.
"""
