// Lamplight's C face of llama.cpp's chat layer (common/chat.h), for ctypes.
//
// llama.cpp's chat layer is C++: templates, a PEG parser per format, JSON schema to
// grammar. ctypes reaches C only, so this file wraps what Lamplight uses in a few
// extern "C" calls that take and give UTF-8 JSON text. No C++ exception may cross
// into ctypes (that ends the process), so every entry point catches everything and
// answers {"error": "..."}. Strings it returns are malloc'd; free them with lc_free.
// It is compiled in the same CMake build as llama-common (packaging/llama_build.py),
// so the C++ ABI of the two is one and the same.

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "log.h"
#include "peg-parser.h"

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#if defined(_WIN32)
#    define LC_API extern "C" __declspec(dllexport)
#else
#    define LC_API extern "C" __attribute__((visibility("default")))
#endif

// Raised when the shim's calls change shape; app/engine/native/chat_shim.py checks it.
static const int LC_ABI = 2;

namespace {

char * dup_text(const std::string & text) {
    char * out = static_cast<char *>(std::malloc(text.size() + 1));
    if (out != nullptr) {
        std::memcpy(out, text.data(), text.size());
        out[text.size()] = '\0';
    }
    return out;
}

char * error_json(const char * what) {
    common_json j = common_json::object();
    j["error"] = std::string(what == nullptr ? "unknown error" : what);
    return dup_text(j.dump_safe());
}

template <typename F> char * guarded(F && body) {
    try {
        return dup_text(body());
    } catch (const std::exception & e) {
        return error_json(e.what());
    } catch (...) {
        return error_json("unknown C++ exception");
    }
}

std::string text_of(const char * data, size_t size) {
    return data == nullptr ? std::string() : std::string(data, size);
}

bool flag(const common_json & j, const char * key, bool fallback) {
    return j.contains(key) && j.at(key).is_boolean() ? j.at(key).get<bool>() : fallback;
}

std::string str(const common_json & j, const char * key) {
    return j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : std::string();
}

common_chat_templates_inputs read_inputs(const common_json & req) {
    common_chat_templates_inputs in;
    if (req.contains("messages")) {
        in.messages = common_chat_msgs_parse_oaicompat(req.at("messages"));
    }
    if (req.contains("tools") && req.at("tools").is_array() && !req.at("tools").empty()) {
        in.tools = common_chat_tools_parse_oaicompat(req.at("tools"));
    }
    if (req.contains("tool_choice") && req.at("tool_choice").is_number_integer()) {
        in.tool_choice = static_cast<common_chat_tool_choice>(req.at("tool_choice").get<int>());
    } else if (req.contains("tool_choice") && req.at("tool_choice").is_string()) {
        in.tool_choice = common_chat_tool_choice_parse_oaicompat(str(req, "tool_choice"));
    }
    in.parallel_tool_calls = flag(req, "parallel_tool_calls", false);
    in.reasoning_format    = common_reasoning_format_from_name(
        req.contains("reasoning_format") ? str(req, "reasoning_format") : std::string("none"));
    in.enable_thinking       = flag(req, "enable_thinking", true);
    in.add_generation_prompt = flag(req, "add_generation_prompt", true);
    if (req.contains("continue_final_message") && req.at("continue_final_message").is_number_integer()) {
        in.continue_final_message =
            static_cast<common_chat_continuation>(req.at("continue_final_message").get<int>());
    }
    in.json_schema = str(req, "json_schema");
    in.grammar     = str(req, "grammar");
    if (req.contains("now") && req.at("now").is_number()) {
        auto secs = static_cast<int64_t>(req.at("now").get<double>());
        in.now    = std::chrono::system_clock::time_point(std::chrono::seconds(secs));
    }
    if (req.contains("chat_template_kwargs") && req.at("chat_template_kwargs").is_object()) {
        for (const auto & [key, value] : req.at("chat_template_kwargs").items()) {
            in.chat_template_kwargs[key] = value.dump();  // llama.cpp takes them as JSON text
        }
    }
    in.force_pure_content = flag(req, "force_pure_content", false);
    return in;
}

common_json params_json(const common_chat_params & p) {
    common_json r = common_json::object();
    r["format"]             = static_cast<int>(p.format);
    r["format_name"]        = std::string(common_chat_format_name(p.format));
    r["prompt"]             = p.prompt;
    r["generation_prompt"]  = p.generation_prompt;
    r["grammar"]            = p.grammar;
    r["grammar_lazy"]       = p.grammar_lazy;
    r["supports_thinking"]  = p.supports_thinking;
    r["thinking_start_tag"] = p.thinking_start_tag;
    r["thinking_end_tags"]  = p.thinking_end_tags;
    common_json triggers    = common_json::array();
    for (const auto & t : p.grammar_triggers) {
        common_json one = common_json::object();
        one["type"]     = static_cast<int>(t.type);
        one["value"]    = t.value;
        triggers.push_back(one);
    }
    r["grammar_triggers"] = triggers;
    r["preserved_tokens"] = p.preserved_tokens;
    r["additional_stops"] = p.additional_stops;
    r["parser"]           = p.parser;
    return r;
}

struct parser_state {
    common_chat_parser_params params;
};

}  // namespace

LC_API int lc_abi(void) {
    return LC_ABI;
}

LC_API void lc_free(char * text) {
    std::free(text);
}

LC_API void lc_quiet(void) {
    // The chat layer logs through common's logger thread; Lamplight reports for itself.
    common_log_set_verbosity_thold(-1);
    common_log_pause(common_log_main());
}

// A template source (never empty: llama.cpp asserts on an empty one without a model).
LC_API void * lc_templates_new(const char * src, size_t n, const char * bos, const char * eos, char ** err) {
    try {
        std::string source = text_of(src, n);
        if (source.empty()) {
            source = "chatml";
        }
        auto tmpls = common_chat_templates_init(nullptr, source, bos ? bos : "", eos ? eos : "");
        return tmpls.release();
    } catch (const std::exception & e) {
        if (err != nullptr) {
            *err = dup_text(e.what());
        }
    } catch (...) {
        if (err != nullptr) {
            *err = dup_text("unknown C++ exception");
        }
    }
    return nullptr;
}

LC_API void lc_templates_free(void * tmpls) {
    common_chat_templates_free(static_cast<common_chat_templates *>(tmpls));
}

LC_API char * lc_caps(void * tmpls) {
    return guarded([&]() {
        if (tmpls == nullptr) {
            throw std::runtime_error("no templates");
        }
        auto *      t = static_cast<const common_chat_templates *>(tmpls);
        common_json r = common_json::object();
        for (const auto & [key, value] : common_chat_templates_get_caps(t)) {
            r[key] = value;
        }
        r["supports_enable_thinking"] = common_chat_templates_support_enable_thinking(t);
        r["source"]                   = common_chat_templates_source(t);
        return r.dump_safe();
    });
}

LC_API char * lc_apply(void * tmpls, const char * req, size_t n) {
    return guarded([&]() {
        if (tmpls == nullptr) {
            throw std::runtime_error("no templates");
        }
        common_json inputs = common_json::parse(text_of(req, n));
        auto        params = common_chat_templates_apply(static_cast<const common_chat_templates *>(tmpls),
                                                         read_inputs(inputs));
        return params_json(params).dump_safe();
    });
}

// A parser from an apply's result: its arena (JSON), format and generation prompt.
LC_API void * lc_parser_new(const char * spec, size_t n, char ** err) {
    try {
        common_json j     = common_json::parse(text_of(spec, n));
        auto        state = std::make_unique<parser_state>();
        state->params.format            = static_cast<common_chat_format>(j.at("format").get<int>());
        state->params.generation_prompt = str(j, "generation_prompt");
        state->params.parse_tool_calls  = flag(j, "parse_tool_calls", true);
        state->params.is_continuation   = flag(j, "is_continuation", false);
        if (j.contains("reasoning_format")) {
            state->params.reasoning_format = common_reasoning_format_from_name(str(j, "reasoning_format"));
        }
        std::string arena = str(j, "parser");
        if (!arena.empty()) {
            state->params.parser.load(arena);
        }
        return state.release();
    } catch (const std::exception & e) {
        if (err != nullptr) {
            *err = dup_text(e.what());
        }
    } catch (...) {
        if (err != nullptr) {
            *err = dup_text("unknown C++ exception");
        }
    }
    return nullptr;
}

LC_API void lc_parser_free(void * parser) {
    delete static_cast<parser_state *>(parser);
}

// The reply so far (is_partial) or whole, as {content, reasoning_content, tool_calls}.
LC_API char * lc_parse(void * parser, const char * text, size_t n, int is_partial) {
    return guarded([&]() {
        if (parser == nullptr) {
            throw std::runtime_error("no parser");
        }
        const auto &    p     = static_cast<parser_state *>(parser)->params;
        std::string     input = text_of(text, n);
        common_chat_msg msg   = p.parser.empty() ? common_chat_parse(input, is_partial != 0, p) :
                                                   common_chat_peg_parse(p.parser, input, is_partial != 0, p);
        common_json     r     = msg.to_json_oaicompat();
        r["reasoning_content"] = msg.reasoning_content;
        return r.dump_safe();
    });
}

LC_API char * lc_schema_to_grammar(const char * schema, size_t n, int force_gbnf) {
    return guarded([&]() {
        common_json j = common_json::parse(text_of(schema, n));
        common_json r = common_json::object();
        r["grammar"]  = json_schema_to_grammar(j, force_gbnf != 0);
        return r.dump_safe();
    });
}

// Feed a grammar sampler the text the prompt already holds (the generation prompt a
// chat format's grammar starts with), as llama.cpp's common_sampler_init does; a token
// the grammar refuses throws in llama.cpp, so it is caught here. 0: fed; -1: refused.
LC_API int lc_grammar_prefill(void * sampler, const void * vocab, const char * text, size_t n) {
    try {
        if (sampler == nullptr || vocab == nullptr) {
            return -1;
        }
        auto *      v      = static_cast<const llama_vocab *>(vocab);
        std::string prompt = text_of(text, n);
        auto        tokens = common_tokenize(v, prompt, false, true);
        for (size_t i = 0; i < tokens.size(); i++) {
            std::string piece = common_token_to_piece(v, tokens[i], true);
            // Some tokenizers put a space before the first special token: not the prompt's.
            if (i == 0 && !piece.empty() && std::isspace(static_cast<unsigned char>(piece[0])) &&
                !prompt.empty() && !std::isspace(static_cast<unsigned char>(prompt[0]))) {
                continue;
            }
            llama_sampler_accept(static_cast<llama_sampler *>(sampler), tokens[i]);
        }
        return 0;
    } catch (...) {
        return -1;
    }
}
