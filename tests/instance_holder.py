"""A process that holds a data folder, for ``tests/e2e/test_single_instance.py``::

    python -m tests.instance_holder ROOT MODE [--listen] [--exit-after SECONDS]

It takes ``ROOT``'s lock as ``MODE`` and prints ``{"held": PID}``. With ``--listen``
it answers later launches as a window does and prints each request as a JSON line
(``{"model": PATH or null}``). It runs until it is killed, or ``--exit-after`` ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from app.util.instance_lock import acquire


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("mode")
    p.add_argument("--listen", action="store_true")
    p.add_argument("--exit-after", type=float, default=600.0)
    args = p.parse_args()
    root = Path(args.root)
    lock = acquire(root, args.mode)
    assert lock.held, lock.note
    if not args.listen:
        print(json.dumps({"held": os.getpid()}), flush=True)
        time.sleep(args.exit_after)
        return 0

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QCoreApplication, QTimer

    from ui.window.single_instance import Activation, InstanceServer, server_name

    app = QCoreApplication(sys.argv[:1])
    server = InstanceServer(server_name(root))

    def on_activated(activation: Activation) -> None:
        model = None if activation.model is None else str(activation.model)
        print(json.dumps({"model": model}), flush=True)

    server.activated.connect(on_activated)
    problem = server.listen()
    assert not problem, problem
    print(json.dumps({"held": os.getpid()}), flush=True)
    QTimer.singleShot(int(args.exit_after * 1000), app.quit)
    app.exec()
    server.close()
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
