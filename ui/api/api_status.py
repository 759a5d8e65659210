"""The window's local API server: starting and stopping it, and its line in the status bar.

``ApiControl`` owns the ``ApiServer`` (``app.api.runner``, imported only when a server
starts, so the window's start-up does not load Starlette or uvicorn) and the one
``HostGateway`` that puts API requests on the engine host's queue. A ``QTimer``
polls the server's requests four times a second; nothing from the server's thread
ever calls into Qt. The status bar shows ``API: http://127.0.0.1:1234/v1`` (a click
copies it) and, while a request runs, ``API: replying to 127.0.0.1 · 57 tokens`` with
a Stop button.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QStatusBar, QToolButton, QWidget

from app.api.host_gateway import HostGateway
from app.chat.projects import ProjectStore
from app.config.setting_records import ApiSettings
from app.remote import keys
from ui.api.serve import bind_problem
from ui.engine.worker import EngineClient

if TYPE_CHECKING:
    from app.api.config import ApiConfig
    from app.api.requests import JobView
    from app.api.runner import ApiServer
    from app.engine.local.embed_worker import EmbedWorker

log = logging.getLogger(__name__)

KEY_ID = "api-server"  # the API key's name in the keyring (app.remote.keys)
POLL_MS = 250
RUNNING_STYLE = "color: #2e7d32;"


def api_config(settings: ApiSettings, key: str) -> ApiConfig:
    """The server configuration for ``settings`` and ``key``."""
    from app.api.config import ApiConfig

    return ApiConfig(
        host=settings.host,
        port=settings.port,
        api_key=key,
        cors_origins=tuple(settings.cors_origins),
        max_queue=settings.max_queue,
        max_body_bytes=settings.max_body_mb * 2**20,
    )


def client_host(client: str) -> str:
    """``127.0.0.1`` from ``127.0.0.1:54321`` (``[::1]:5`` -> ``::1``); a name stays as it is."""
    if client.startswith("[") and "]" in client:
        return client[1 : client.index("]")]
    head, sep, tail = client.rpartition(":")
    if sep and tail.isdigit() and ":" not in head:
        return head
    return client


class ApiControl(QObject):
    """Starts and stops the window's API server and shows it in the status bar.

    Signals:
        stateChanged(str): the server's URL after a start, "" after a stop.
    """

    stateChanged = Signal(str)

    def __init__(
        self,
        client: EngineClient,
        bar: QStatusBar,
        parent: QWidget,
        projects: ProjectStore | None = None,
    ) -> None:
        super().__init__(parent)
        self._bar = bar
        # Requests may name the projects shared with the API (``app/api/project_field``).
        self.gateway = HostGateway(client.host, projects)
        # The window's embedding model (its owner closes it): /v1/embeddings uses it.
        self.embedder: EmbedWorker | None = None
        self.server: ApiServer | None = None
        self.error = ""  # why the last start failed
        self.label = QToolButton(parent)
        self.label.setObjectName("statusApi")
        self.label.setAutoRaise(True)
        self.label.setAccessibleName("Local API server")
        self.label.clicked.connect(self.copy_url)
        self.stop_button = QToolButton(parent)
        self.stop_button.setObjectName("apiStopButton")
        self.stop_button.setText("Stop")
        self.stop_button.setToolTip("Stop the API request that is running")
        self.stop_button.setAccessibleName("Stop the API request")
        self.stop_button.clicked.connect(self.stop_running)
        self.label.hide()
        self.stop_button.hide()
        bar.addPermanentWidget(self.label)
        bar.addPermanentWidget(self.stop_button)
        self.timer = QTimer(self)
        self.timer.setObjectName("apiPollTimer")
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.poll)

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else ""

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.running

    def start(self, settings: ApiSettings) -> str:
        """(Re)start the server with ``settings`` and the key in the keyring.

        Returns "" when it runs, else why not (a busy port, an unsafe address), which
        is also kept in ``error``.
        """
        from app.api.config import ApiConfigError
        from app.api.runner import ApiServer

        self.stop()
        config = api_config(settings, keys.get_key(KEY_ID))
        problem = config.problem()
        server = ApiServer(self.gateway, config, self.embedder)
        if not problem:
            try:
                server.start()
            except ApiConfigError as exc:
                problem = str(exc)
            except OSError as exc:
                problem = bind_problem(config.host, config.port, exc)
        if problem:
            self.error = problem
            log.warning("API server not started: %s", problem)
            return problem
        self.server, self.error = server, ""
        log.info("API server at %s", server.url)
        self.label.setToolTip(f"OpenAI-compatible API at {server.url} — click to copy")
        self.label.show()
        self.poll()
        self.timer.start()
        self.stateChanged.emit(server.url)
        return ""

    def stop(self) -> None:
        """Stop the server (running requests end; its thread is joined). Idempotent."""
        self.timer.stop()
        server, self.server = self.server, None
        if server is None:
            return
        server.stop()
        self.label.hide()
        self.stop_button.hide()
        self.stateChanged.emit("")

    # -- what the window shows -----------------------------------------------------------

    def running_job(self) -> JobView | None:
        return self.server.requests.running() if self.server is not None else None

    def poll(self) -> None:
        """Show the server's address, or the request it is answering."""
        if self.server is None:
            return
        job = self.running_job()
        if job is None:
            self.label.setText(f"API: {self.server.url}")
            self.label.setStyleSheet("")
            self.stop_button.hide()
            return
        waiting = len(self.server.requests.queued())
        more = f" (+{waiting} waiting)" if waiting else ""
        self.label.setText(
            f"API: replying to {client_host(job.client) or 'a client'} · {job.tokens} tokens{more}"
        )
        self.label.setStyleSheet(RUNNING_STYLE)
        self.stop_button.show()

    def prompt_cache_usage(self) -> tuple[int, int]:
        """The API's saved openings on disk: how many, and their bytes."""
        return self.gateway.host.prompt_cache_usage()

    def clear_prompt_cache(self) -> None:
        self.gateway.host.clear_prompt_cache()

    def copy_url(self) -> None:
        if self.server is None:
            return
        clipboard = QGuiApplication.clipboard()
        clipboard.setText(self.server.url)
        self._bar.showMessage(f"Copied {self.server.url}", 4000)

    def stop_running(self) -> None:
        """Stop the API request that is running; its client is told the reply was cut
        short (``request_stopped``), not handed half a reply as a whole one."""
        if self.server is not None and self.server.requests.stop_running():
            self._bar.showMessage("Stopping the API request…", 3000)
        self.poll()

    def waiting_note(self) -> str:
        """A line for the chat when a GUI reply has to wait for an API request ("" if not)."""
        job = self.running_job()
        if job is None:
            return ""
        who = client_host(job.client) or "a client"
        return f"Waiting for the API request from {who} to finish; Stop in the status bar ends it."
