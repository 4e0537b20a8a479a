"""Chat templates rendered as transformers' apply_chat_template renders them, plus the trained spans.

Needs jinja2 only (the engine transformers uses), so `tokenize` can run this file as a child process
(`python3 -c SOURCE`, the source embedded in the binary) without qtrain or transformers installed.

The Jinja environment is set up as transformers sets it up (src/transformers/utils/chat_template_utils.py):
an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, a
`tojson` filter that is json.dumps with ensure_ascii=False (not Jinja's HTML-escaping one), the globals
raise_exception and strftime_now, and the `{% generation %}...{% endgeneration %}` tag whose output
characters are the assistant mask of return_assistant_tokens_mask=True. The template sees `messages`,
`tools` (None when the record has none), `documents` (None), `add_generation_prompt`, the tokenizer's
special tokens (bos_token, eos_token, ...) from tokenizer_config.json, as transformers passes them, and
extra variables (apply_chat_template's keyword arguments, e.g. Qwen3's enable_thinking): the run's
template_kwargs, overridden by a record's own `chat_template_kwargs`.

Trained spans (character ranges of the render that are trained on; `tokenize` trains a token when any of
its characters is in one):
  - a template with generation blocks: exactly what those blocks emit;
  - otherwise, for each assistant message i: from the end of render(messages[:i], add_generation_prompt=True),
    which must be a prefix of the whole render, to the end of the first end-of-turn token at or after it
    (or the end of the render).
train_on: "assistant" (all assistant turns), "last-assistant" (the last one), "all" (the whole render).

Protocol of the child process (`python3 -c SOURCE --serve`): the first stdin line is a JSON config
{"template", "special_tokens": {...}, "end_of_turn": [...], "train_on", "template_kwargs": {...}}; then each line is one JSON Lines
record, answered by one stdout line: {"text", "spans": [[begin, end], ...] in UTF-8 bytes, "format"} or
{"skip": reason, "format"} or {"error": message}.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager
from datetime import datetime

ROLES = ("system", "user", "assistant", "tool")


class RecordError(ValueError):
    """A record that cannot be rendered; the message says why (the caller adds file and line)."""


class SkipRecord(Exception):
    """A record that is not trained on (no assistant turn); the message is the reason."""


def _environment():
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("chat templates need the Python package jinja2 (the engine transformers uses): "
                          "pip install jinja2") from None

    class GenerationTracker(Extension):
        # {% generation %}...{% endgeneration %}: records where the block's output lands in the render.
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(track_generation=self.track)
            self._blocks = None
            self._spans = None

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_generation", []), [], [], body).set_lineno(lineno)

        def _generation(self, caller):
            out = caller()
            if self._blocks is not None:
                start = sum(len(b) for b in self._blocks)
                self._spans.append((start, start + len(out)))
            return out

        @contextmanager
        def track(self, blocks, spans):
            self._blocks, self._spans = blocks, spans
            try:
                yield
            finally:
                self._blocks = self._spans = None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    class TemplateDict:
        # dict() without attribute access to the type (transformers' restricted `dict` global)
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # namespace() that refuses underscore-prefixed attributes (transformers' sandbox hardening)
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_': {name!r}")

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def alias_reasoning(messages):
    """As transformers does before rendering: a message's reasoning under any of its names is also passed
    as `reasoning_content` (what templates read) and `thinking` (gpt-oss templates)."""
    out = []
    for m in messages:
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        out.append(m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
    return out


def special_tokens_of(config: dict) -> dict:
    """The special tokens transformers passes to a template, from a tokenizer_config.json dict: the set
    ones of bos/eos/unk/sep/pad/cls/mask_token, as strings (its special_tokens_map)."""
    def text(v):
        return v.get("content") if isinstance(v, dict) else v

    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        if text(config.get(key)) is not None:
            out[key] = text(config[key])
    return out


class ChatRenderer:
    def __init__(self, template: str, special_tokens: dict | None = None, end_of_turn=(), train_on="assistant",
                 template_kwargs: dict | None = None):
        if train_on not in ("assistant", "last-assistant", "all"):
            raise ValueError(f"train_on must be assistant, last-assistant or all, got {train_on!r}")
        self.env = _environment()
        import jinja2

        try:
            self.template = self.env.from_string(template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ValueError(f"the chat template does not compile: {e.message} (template line {e.lineno})") from None
        # transformers' own test for generation blocks
        self.has_generation = re.search(r"\{\%-?\s*generation\s*-?\%\}", template) is not None
        self.special_tokens = dict(special_tokens or {})
        self.end_of_turn = [t for t in end_of_turn if t]
        self.train_on = train_on
        # extra template variables for every record (e.g. Qwen3's enable_thinking), as apply_chat_template's kwargs
        self.template_kwargs = self._checked_kwargs(template_kwargs or {}, "template kwargs", ValueError)

    @staticmethod
    def _checked_kwargs(kwargs, what, error):
        if not isinstance(kwargs, dict):
            raise error(f"{what} must be a JSON object")
        reserved = sorted(set(kwargs) & {"messages", "tools", "documents", "add_generation_prompt"})
        if reserved:
            raise error(f"{what} may not set {', '.join(reserved)} (the record and the trained-token rule do)")
        return dict(kwargs)

    def render(self, messages, tools=None, add_generation_prompt=False, spans=None, extra=None) -> str:
        """The template's text for `messages` (already through alias_reasoning, as spans() passes them)."""
        import jinja2

        kwargs = dict(self.special_tokens)
        kwargs.update(self.template_kwargs)
        kwargs.update(extra or {})
        kwargs.update(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt)
        try:
            if spans is None:
                return self.template.render(**kwargs)
            blocks = []
            with self.env.track_generation(blocks, spans):
                for block in self.template.generate(**kwargs):
                    blocks.append(block)
            return "".join(blocks)
        except jinja2.exceptions.TemplateError as e:
            raise RecordError(f"the chat template failed to render it: {e}") from None
        except Exception as e:  # a template that indexes a missing key or divides by zero
            raise RecordError(f"the chat template failed to render it: {type(e).__name__}: {e}") from None

    def conversation(self, record: dict):
        """(messages, tools, format) of a JSON Lines record; RecordError when it is malformed."""
        if not isinstance(record, dict):
            raise RecordError("a record must be a JSON object")
        if "messages" in record:
            messages = record["messages"]
            if not isinstance(messages, list) or not messages:
                raise RecordError("'messages' must be a non-empty list of {role, content} objects")
            for k, m in enumerate(messages):
                if not isinstance(m, dict):
                    raise RecordError(f"messages[{k}] is not an object")
                role = m.get("role")
                if role not in ROLES:
                    raise RecordError(f"messages[{k}] has role {role!r}; known roles: {', '.join(ROLES)}")
                content = m.get("content")
                if not (isinstance(content, str) or (content is None and m.get("tool_calls"))):
                    raise RecordError(f"messages[{k}] ({role}): content must be a string"
                                      + (", got " + type(content).__name__ if content is not None else ", got none")
                                      + (" (content may be null only beside tool_calls)" if role == "assistant" else ""))
                if "tool_calls" in m and (role != "assistant" or not isinstance(m["tool_calls"], list)):
                    raise RecordError(f"messages[{k}]: tool_calls must be a list, on an assistant message")
            fmt = "messages"
        elif "prompt" in record or "completion" in record:
            prompt, completion = record.get("prompt"), record.get("completion")
            if not isinstance(prompt, str) or not isinstance(completion, str):
                raise RecordError("a prompt/completion record needs both 'prompt' and 'completion' as strings")
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            fmt = "prompt/completion"
        else:
            raise RecordError("the record has no 'messages' (nor 'prompt' and 'completion'); keys: "
                              + ", ".join(sorted(record)) if record else "the record is empty")
        tools = record.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise RecordError("'tools' must be a list")
        return messages, tools, fmt

    def spans(self, messages, tools=None, extra=None):
        """(text, [(begin, end) character spans])."""
        messages = alias_reasoning(messages)  # once: aliasing is per message, so prefixes slice it
        assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not assistants:
            raise SkipRecord("no assistant message")
        if self.train_on == "all":
            text = self.render(messages, tools, extra=extra)
            return text, [(0, len(text))]
        if self.has_generation:
            found = []
            text = self.render(messages, tools, spans=found, extra=extra)
            if not found:
                raise SkipRecord("the template's generation blocks emitted nothing")
            return text, found[-1:] if self.train_on == "last-assistant" else found
        text = self.render(messages, tools, extra=extra)
        out = []
        for i in assistants[-1:] if self.train_on == "last-assistant" else assistants:
            prefix = self.render(messages[:i], tools, add_generation_prompt=True, extra=extra)
            if not text.startswith(prefix):
                raise RecordError(
                    f"the chat template is not prefix-stable: the render of the messages before assistant message "
                    f"{i} (with the generation prompt) is not a prefix of the whole conversation's render, so the "
                    f"assistant turn cannot be located; give --chat-template=FILE with {{% generation %}} blocks "
                    f"around the assistant output")
            start = len(prefix)
            end = len(text)
            for token in self.end_of_turn:
                hit = text.find(token, start)
                if hit >= 0:
                    end = min(end, hit + len(token))
            out.append((start, end))
        return text, out

    def record(self, record: dict):
        """The answer to one record: {"text", "spans" (UTF-8 byte offsets), "format"} or {"skip", "format"}."""
        messages, tools, fmt = self.conversation(record)
        # a record's own template variables (TRL's chat_template_kwargs), over the run's
        extra = self._checked_kwargs(record.get("chat_template_kwargs", {}), "'chat_template_kwargs'", RecordError)
        try:
            text, spans = self.spans(messages, tools, extra)
        except SkipRecord as e:
            return {"skip": str(e), "format": fmt}
        return {"text": text, "spans": byte_spans(text, spans), "format": fmt}


def byte_spans(text: str, spans):
    """Character spans -> UTF-8 byte spans of `text`."""
    points = sorted({p for s in spans for p in s})
    byte_at, pos, nbytes = {}, 0, 0
    for p in points:
        nbytes += len(text[pos:p].encode("utf-8", "surrogatepass"))
        pos = p
        byte_at[p] = nbytes
    return [[byte_at[b], byte_at[e]] for b, e in spans if e > b]


def serve(stdin=None, stdout=None) -> int:
    """The child-process loop of `tokenize` (protocol above)."""
    import io

    # UTF-8 whatever the locale says; bytes that are not UTF-8 become lone surrogates, refused per record
    stdin = stdin or io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
    stdout = stdout or sys.stdout
    config = json.loads(stdin.readline())
    try:
        renderer = ChatRenderer(config["template"], config.get("special_tokens"), config.get("end_of_turn", ()),
                                config.get("train_on", "assistant"), config.get("template_kwargs"))
    except (ImportError, ValueError) as e:
        stdout.write(json.dumps({"error": str(e)}) + "\n")
        stdout.flush()
        return 1
    stdout.write(json.dumps({"ready": True, "generation_blocks": renderer.has_generation}) + "\n")
    stdout.flush()
    for line in stdin:
        try:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"not valid JSON: {e}") from None
            answer = renderer.record(record)
            if "text" in answer:
                answer["text"].encode("utf-8")  # a lone surrogate (from a \\ud800 escape) fails here
        except RecordError as e:
            # (lone surrogates of bad input would make invalid JSON escapes: shown as \\udcXX)
            answer = {"error": str(e).encode("utf-8", "backslashreplace").decode("utf-8")}
        except UnicodeEncodeError:
            answer = {"error": "the record is not valid UTF-8 text (or holds a lone \\uD800-\\uDFFF escape)"}
        stdout.write(json.dumps(answer) + "\n")  # ASCII: safe for any text, surrogates included
        stdout.flush()
    return 0


if __name__ == "__main__" and "--serve" in sys.argv:
    try:
        sys.exit(serve())
    except (BrokenPipeError, KeyboardInterrupt):  # tokenize stopped (an error, Ctrl-C): it says why
        import os

        os._exit(1)
