"""``lamplight serve``'s chat template: ``--chat-template NAME`` (one of Lamplight's
built-in templates, or ``auto``), ``--chat-template-file PATH`` (Jinja, checked here and
run in the same sandbox as a GGUF's), else the template the window saved for the model
(Model → Chat template…), else the model's own. Continue-the-text mode, the window's
other choice, is not used: ``/v1/completions`` is the API's way to continue a text."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from app.config.model_prefs import FILE_NAME, TEMPLATE_CHARS, ModelPrefsStore, model_key
from app.engine.backend import ModelInfo
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.builtin import BUILTIN
from app.engine.templates.jinja_template import jinja_template
from app.engine.templates.override import AUTO, TemplateOverride, effective_override
from app.util.datafiles import os_reason

Chooser = Callable[[ModelInfo], TemplateOverride]


class TemplateArgError(ValueError):
    """A ``--chat-template`` or ``--chat-template-file`` that cannot be used."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--chat-template",
        metavar="NAME",
        help=f"a built-in chat template ({', '.join(BUILTIN)}), or 'auto' for the model's "
        "own (default: the one chosen for the model in the app, else its own)",
    )
    group.add_argument(
        "--chat-template-file",
        metavar="PATH",
        help="a Jinja chat template to use instead of the model's",
    )


def chooser(args: argparse.Namespace, data_dir: Path) -> Chooser:
    """What picks the loaded model's template, from the command line or the app's choice.

    Raises:
        TemplateArgError: the name is not a built-in one, or the file cannot be read or
            is not a usable template; the message names the option.
    """
    if args.chat_template is not None:
        name = args.chat_template.strip()
        if name != "auto" and name not in BUILTIN:
            raise TemplateArgError(
                f"--chat-template: {name!r} is not a built-in template; "
                f"use one of {', '.join(BUILTIN)}, or auto."
            )
        chosen = AUTO if name == "auto" else TemplateOverride("builtin", name=name)
        return lambda _info: chosen
    if args.chat_template_file is not None:
        custom = TemplateOverride("custom", source=read_template(args.chat_template_file))
        return lambda _info: custom
    return lambda info: saved_override(data_dir, info)


def read_template(path: str) -> str:
    """The Jinja text at ``path``, once it compiles and renders a short chat.

    Raises:
        TemplateArgError: why it cannot be used.
    """
    where = Path(path).expanduser()
    try:
        with where.open("rb") as f:
            raw = f.read(TEMPLATE_CHARS * 4 + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise TemplateArgError(f"--chat-template-file: {where}: {os_reason(exc)}") from exc
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TemplateArgError(f"--chat-template-file: {where} is not UTF-8 text.") from exc
    if not source.strip() or len(source) > TEMPLATE_CHARS:
        raise TemplateArgError(
            f"--chat-template-file: a template is 1 to {TEMPLATE_CHARS:,} characters; "
            f"this file has {len(source):,}."
        )
    try:
        jinja_template(source, "", "", owner="The template file", advice="")
    except ChatTemplateError as exc:
        raise TemplateArgError(f"--chat-template-file: the template {exc}") from exc
    return source


def saved_override(data_dir: Path, info: ModelInfo) -> TemplateOverride:
    """The chat template the window saved for ``info``'s model (AUTO when none)."""
    prefs = ModelPrefsStore(data_dir / FILE_NAME).get(model_key(info.path, info.file_size))
    return effective_override(prefs, completion=False)
