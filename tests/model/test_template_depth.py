"""A chat template that cannot even be compiled, in a real GGUF: the load falls back.

llama-cpp-python's ``Llama`` compiled every template in the file's metadata with an
unbounded Jinja as it loaded, so a template nested 25 ``for`` loops deep (Python's
"too many statically nested blocks"), a deep literal or a syntax error failed the
load itself instead of falling back to the built-in template as other bad templates
do. The files here are the default model with template keys added to its header.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.jinja_template import choose_template
from app.engine.templates.override import TemplateInputs, TemplateOverride, build_template
from app.gguf.info import _parse_header
from tests.native import own_notes

OUT = "{% for m in messages %}{{ m.content }}{% endfor %}"
NESTED = OUT + "".join(f"{{% for a{i} in [1] %}}" for i in range(25)) + "x" + "{% endfor %}" * 25
UNCOMPILABLE = {
    "static nesting": NESTED,  # SyntaxError: too many statically nested blocks
    "deep literal": "{{ " + "[" * 5000 + "]" * 5000 + " }}",  # RecursionError
    "syntax": "{% for %}",  # jinja2.TemplateSyntaxError
}
FALLBACK = "This model's chat template was not used: it "
LOAD = LoadConfig(n_ctx=256, n_threads=1)


def with_strings(source: Path, out: Path, values: Mapping[str, str]) -> Path:
    """``source`` with string keys ``values`` added to its metadata (first, so the tensor
    table and data move by a multiple of the alignment and are copied as they are)."""
    meta, _tensors, _start = _parse_header(source)
    align = int(meta.get("general.alignment", 32))

    def kv(key: str, value: str) -> bytes:
        k, v = key.encode(), value.encode()
        return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v

    added = b"".join(kv(k, v) for k, v in values.items())
    pad_key = "lamplight.test.padding"
    pad = (-(len(added) + len(kv(pad_key, ""))) % align) * " "
    added += kv(pad_key, pad)
    assert len(added) % align == 0
    with source.open("rb") as src, out.open("wb") as dst:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", src.read(24))
        dst.write(struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + len(values) + 1))
        dst.write(added)
        shutil.copyfileobj(src, dst, 16 << 20)
    return out


def test_a_template_nested_too_deep_falls_back_at_load(model_path: Path, tmp_path: Path) -> None:
    """The file's template is nested 25 loops deep, and named variants (which Lamplight
    does not use; llama-cpp-python compiled them too) fail to compile each in its own
    way: the model loads, with the built-in template and the usual note, and replies."""
    named = {f"tokenizer.chat_template.{k.replace(' ', '_')}": v for k, v in UNCOMPILABLE.items()}
    gguf = with_strings(
        model_path, tmp_path / "hostile.gguf", {"tokenizer.chat_template": NESTED, **named}
    )
    engine = Engine()
    try:
        info = engine.load(gguf, LOAD)
        assert engine.template is not None and engine.template.name == "gemma"
        (note,) = own_notes(engine.load_notes)
        assert note.startswith(FALLBACK) and own_notes(info.notes) == (note,)
        assert "does not compile: too many statically nested blocks" in note
        done = list(engine.generate([ChatMessage("user", "Hi")], SamplingParams.greedy(3)))
        assert isinstance(done[-1], Finished)
    finally:
        engine.unload()


@pytest.mark.parametrize("name", sorted(UNCOMPILABLE))
def test_every_way_to_choose_an_uncompilable_template_falls_back(name: str) -> None:
    """The model's own template, and the same text as the user's custom one."""
    source = UNCOMPILABLE[name]
    own = choose_template(source, "gemma3", lambda _t: True, "<bos>", "<eos>")
    assert own.name == "gemma" and own.note.startswith(FALLBACK), own.note
    inputs = TemplateInputs(arch="gemma3", builtin="gemma", bos_token="<bos>")
    custom = build_template(TemplateOverride("custom", source=source), inputs, lambda _t: True)
    assert custom.name == "gemma", custom
    assert custom.note.startswith("Your chat template for this model was not used: it ")
    embedded = build_template(TemplateOverride(), replace(inputs, embedded=source), bool)
    assert embedded.name == "gemma" and embedded.note.startswith(FALLBACK)
    assert custom.render([ChatMessage("user", "Hi")]).endswith("<start_of_turn>model\n")
