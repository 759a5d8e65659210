#!/usr/bin/env python3
"""llama.cpp's chat-layer test cases, dumped as data for ``tests/unit/chat_format``.

    python packaging/llama_chat_goldens.py    # rewrites tests/data/llama_chat/

llama.cpp's ``tests/test-chat.cpp`` writes its cases as C++ expressions (fluent
builders, globals, concatenated literals): parsing that C++ from Python would be
brittle. Instead this script patches the one path every case goes through
(``test_peg_parser``, and the ``check`` of ``test_template_generation_prompt``) to
append each case as a JSON line: the template, the request, the model's reply,
what llama.cpp expects it to parse into, and what its ``common_chat_templates_apply``
gave (format, prompt, generation prompt, grammar, triggers, stops). The patched
file is compiled against the libraries of the cached test llama-server (the same
sources, compiler and flags: ``packaging/llama_server.py``) and run from the
llama.cpp root. The JSON schema to grammar cases are read from
``tests/test-json-schema-to-grammar.cpp`` with a regular expression over its raw
strings. The templates and llama.cpp's LICENSE are copied beside the data.

Run it again when pyproject.toml's llama-cpp-python pin moves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packaging"))  # a folder of scripts, not a package

import llama_server  # type: ignore[import-not-found]  # noqa: E402

OUT = ROOT / "tests" / "data" / "llama_chat"
FIXED_NOW = 1767225600  # 2026-01-01: templates that print the date render the same

DUMP_HELPERS = r"""
#include <nlohmann/json.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
static std::map<const void *, std::string> g_dump_paths;
static nlohmann::ordered_json dump_json(const common_json & j) {
    return nlohmann::ordered_json::parse(j.dump());
}
static nlohmann::ordered_json dump_result(const common_chat_params & p) {
    nlohmann::ordered_json r;
    r["format"] = common_chat_format_name(p.format);
    r["prompt"] = p.prompt;
    r["generation_prompt"] = p.generation_prompt;
    r["grammar"] = p.grammar;
    r["grammar_lazy"] = p.grammar_lazy;
    r["supports_thinking"] = p.supports_thinking;
    r["thinking_start_tag"] = p.thinking_start_tag;
    r["thinking_end_tags"] = p.thinking_end_tags;
    auto triggers = nlohmann::ordered_json::array();
    for (const auto & t : p.grammar_triggers) {
        triggers.push_back({{"type", (int) t.type}, {"value", t.value}});
    }
    r["grammar_triggers"] = triggers;
    r["preserved_tokens"] = p.preserved_tokens;
    r["additional_stops"] = p.additional_stops;
    return r;
}
static nlohmann::ordered_json dump_inputs(const common_chat_templates_inputs & in) {
    nlohmann::ordered_json r;
    r["messages"] = dump_json(common_chat_msgs_to_json_oaicompat(in.messages));
    r["tools"] = dump_json(common_chat_tools_to_json_oaicompat(in.tools));
    r["tool_choice"] = (int) in.tool_choice;
    r["parallel_tool_calls"] = in.parallel_tool_calls;
    r["reasoning_format"] = common_reasoning_format_name(in.reasoning_format);
    r["enable_thinking"] = in.enable_thinking;
    r["add_generation_prompt"] = in.add_generation_prompt;
    r["continue_final_message"] = (int) in.continue_final_message;
    r["json_schema"] = in.json_schema;
    r["chat_template_kwargs"] = in.chat_template_kwargs;
    return r;
}
static void dump_line(const nlohmann::ordered_json & j) {
    const char * path = std::getenv("LAMPLIGHT_CHAT_DUMP");
    if (path == nullptr) {
        return;
    }
    std::ofstream out(path, std::ios::app);
    out << j.dump() << "\n";
}
static std::chrono::system_clock::time_point dump_now() {
    return std::chrono::system_clock::time_point(std::chrono::seconds(FIXED_NOW_SECONDS));
}
"""

PATCHES = (
    # Every template read remembers its path, so a case can name it.
    (
        "static common_chat_templates_ptr read_templates(const std::string & path) {\n"
        "    return common_chat_templates_ptr(common_chat_templates_init("
        "/* model= */ nullptr, read_file(path)));\n}",
        "static common_chat_templates_ptr read_templates(const std::string & path) {\n"
        "    auto t = common_chat_templates_ptr(common_chat_templates_init("
        "/* model= */ nullptr, read_file(path)));\n"
        "    g_dump_paths[t.get()] = path;\n    return t;\n}",
    ),
    (
        "    auto parser = make_peg_parser(tmpls, tc.params, detailed_debug);\n",
        "    tc.params.now = dump_now();\n"
        "    auto parser = make_peg_parser(tmpls, tc.params, detailed_debug);\n"
        "    {\n"
        "        nlohmann::ordered_json j;\n"
        '        j["kind"] = "parse";\n'
        '        j["template"] = g_dump_paths[tmpls];\n'
        '        j["input"] = tc.input;\n'
        '        j["is_partial"] = tc.is_partial;\n'
        '        j["expect_reconstruction"] = tc.expect_reconstruction;\n'
        '        j["inputs"] = dump_inputs(tc.params);\n'
        '        j["expect"] = dump_json(tc.expect.to_json_oaicompat());\n'
        '        j["result"] = dump_result(parser.params_);\n'
        "        dump_line(j);\n"
        "    }\n",
    ),
    (
        "        inputs.enable_thinking        = opts.enable_thinking;\n\n"
        "        auto params = common_chat_templates_apply(tmpls.get(), inputs);\n",
        "        inputs.enable_thinking        = opts.enable_thinking;\n"
        "        inputs.now                    = dump_now();\n\n"
        "        auto params = common_chat_templates_apply(tmpls.get(), inputs);\n"
        "        {\n"
        "            nlohmann::ordered_json j;\n"
        '            j["kind"] = "generation_prompt";\n'
        '            j["template"] = g_dump_paths[tmpls.get()];\n'
        '            j["inputs"] = dump_inputs(inputs);\n'
        '            j["expected_generation_prompt"] = expected_generation_prompt;\n'
        '            j["result"] = dump_result(params);\n'
        "            dump_line(j);\n"
        "        }\n",
    ),
)


def patched_test_chat(source: str) -> str:
    """``test-chat.cpp`` with the dump added; fails loudly when upstream moved."""
    anchor = "// Global template filter for --template flag\n"
    if anchor not in source:
        raise SystemExit("test-chat.cpp changed: the template filter anchor is gone")
    helpers = DUMP_HELPERS.replace("FIXED_NOW_SECONDS", str(FIXED_NOW))
    source = source.replace('#include "json.h"\n', '#include "json.h"\n' + helpers, 1)
    for old, new in PATCHES:
        if source.count(old) != 1:
            raise SystemExit(f"test-chat.cpp changed: cannot patch {old[:60]!r}")
        source = source.replace(old, new)
    return source


CASE_START = re.compile(r"test\(\{\s*(SUCCESS|FAILURE),\s*")
RAW = re.compile(r'R"""\((.*?)\)"""', re.S)
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _literal(source: str, at: int) -> tuple[str, int]:
    """The C++ string literal at ``at`` (a raw ``R\"\"\"(...)\"\"\"`` one or an ordinary
    one) and where it ends (past the comma that follows)."""
    at = len(source) - len(source[at:].lstrip())
    raw = RAW.match(source, at)
    if raw:
        text, end = raw.group(1), raw.end()
    else:
        quoted = QUOTED.match(source, at)
        if quoted is None:
            raise SystemExit(
                f"test-json-schema-to-grammar.cpp changed near {source[at : at + 60]!r}"
            )
        text, end = json.loads('"' + quoted.group(1) + '"'), quoted.end()
    rest = source[end:]
    return text, end + (len(rest) - len(rest.lstrip().lstrip(",")))


def schema_cases(source: str) -> list[dict[str, object]]:
    """The JSON schema to grammar cases: title, schema text, expected grammar."""
    found: list[dict[str, object]] = []
    for start in CASE_START.finditer(source):
        title, at = _literal(source, start.end())
        schema, at = _literal(source, at)
        grammar, _ = _literal(source, at)
        ok = start.group(1) == "SUCCESS"
        found.append({"ok": ok, "title": title, "schema": schema, "grammar": grammar})
    return found


def compile_test_chat(src: Path, libs: Path, exe: Path) -> None:
    """Compile the patched test against the cached llama-server's shared libraries."""
    includes = [
        "common",
        "include",
        "ggml/include",
        "src",
        "tools/server",
        "tools/mtmd",
        "vendor",
        "tests",
    ]
    cmd = ["g++", "-std=c++17", "-O1", "-o", str(exe), str(src / "tests" / "test-chat.cpp")]
    cmd += [f"-I{src / d}" for d in includes]
    cmd += [f"-L{libs}", f"-Wl,-rpath,{libs}"]
    cmd += ["-l:libllama-server-impl.so", "-l:libllama-common.so", "-l:libmtmd.so"]
    cmd += ["-l:libllama.so", "-l:libggml.so", "-l:libggml-base.so", "-lpthread"]
    subprocess.run(cmd, check=True)


def main() -> None:
    server = llama_server.ensure_llama_server()
    version = llama_server.llama_cpp_version()
    with tempfile.TemporaryDirectory(prefix="lamplight-goldens-") as tmp:
        work = Path(tmp)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*cmd, f"llama-cpp-python=={version}", "-d", str(work)], check=True)
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        src = llama_server._extract_vendor(sdist, work / "src")
        test = src / "tests" / "test-chat.cpp"
        test.write_text(patched_test_chat(test.read_text(encoding="utf-8")), encoding="utf-8")
        exe = work / "test-chat"
        compile_test_chat(src, server.parent, exe)
        dump = work / "dump.jsonl"
        env = {**os.environ, "LAMPLIGHT_CHAT_DUMP": str(dump)}
        subprocess.run([str(exe)], cwd=src, env=env, check=True, stdout=subprocess.DEVNULL)
        write_outputs(src, dump, version, sdist)


def write_outputs(src: Path, dump: Path, version: str, sdist: Path) -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "templates").mkdir(parents=True)
    lines = dump.read_text(encoding="utf-8").splitlines()
    cases = [json.loads(line) for line in lines]
    for case in cases:
        case["template"] = Path(case["template"]).name
    parse = [c for c in cases if c["kind"] == "parse"]
    prompts = [c for c in cases if c["kind"] == "generation_prompt"]
    _write_jsonl(OUT / "cases.jsonl", parse)
    _write_jsonl(OUT / "generation_prompts.jsonl", prompts)
    schema_src = (src / "tests" / "test-json-schema-to-grammar.cpp").read_text(encoding="utf-8")
    _write_jsonl(OUT / "schema_to_grammar.jsonl", schema_cases(schema_src))
    for path in sorted((src / "models" / "templates").iterdir()):
        shutil.copy2(path, OUT / "templates" / path.name)
    shutil.copy2(src / "LICENSE", OUT / "LICENSE")
    commit = _vendored_commit(sdist)
    (OUT / "README.md").write_text(
        README.format(version=version, commit=commit, n=len(parse), g=len(prompts)),
        encoding="utf-8",
    )


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")


def _vendored_commit(sdist: Path) -> str:
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/CHANGELOG.md"))
        handle = tar.extractfile(member)
        text = handle.read().decode("utf-8", "replace") if handle else ""
    found = re.search(r"ggml-org/llama\.cpp@([0-9a-f]{7,40})", text)
    return found.group(1) if found else "unknown"


README = """# llama.cpp's chat-layer cases, as data

From llama-cpp-python {version}, which vendors ggml-org/llama.cpp@{commit}. Written
by `packaging/llama_chat_goldens.py`; do not edit by hand.

- `cases.jsonl` ({n} lines): every case `tests/test-chat.cpp` runs through
  `test_peg_parser`: the template, the request (`inputs`), the model's reply
  (`input`), what llama.cpp expects it to parse into (`expect`, OpenAI JSON), and
  what `common_chat_templates_apply` gave (`result`). The date is fixed
  (2026-01-01) so templates that print it render the same.
- `generation_prompts.jsonl` ({g} lines): the `check` calls of
  `test_template_generation_prompt`.
- `schema_to_grammar.jsonl`: the cases of `tests/test-json-schema-to-grammar.cpp`.
- `templates/`: llama.cpp's `models/templates/` (its README names each source).
- `LICENSE`: llama.cpp's MIT license; these files are derived from its tests.
"""


if __name__ == "__main__":
    main()
