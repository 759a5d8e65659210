"""The frozen app's entry script (PyInstaller needs a file, not ``python -m ui``)."""

import multiprocessing
import sys

from ui.main import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a no-op unless something spawns a child process
    sys.exit(main())
