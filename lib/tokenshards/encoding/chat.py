"""Chat rows: messages rendered through the tokenizer's own chat template, tokenized, and which
tokens are the assistant's (``tokenize --chat-column``). Pure: a row in, ids and mask out.

Rendering and tokenizing are ``transformers``' own code (``render_jinja_template``, the tokenizer
built from the run's ``tokenizer.json`` + ``tokenizer_config.json``), so ids equal
``apply_chat_template``'s. Two things differ on purpose, both as transformers does them elsewhere:

- Message text is ordinary text: control-token strings inside messages are marked before
  rendering and encoded as text (``apply_chat_template(sanitize_control_tokens=True)``'s
  ``mark_control_tokens``/``encode_marked_chat``), so only the template's own markup becomes
  control tokens. That option refuses assistant masks, hence the encoding below, which keeps
  each token's characters to place the mask.
- The mask: where the template marks generations (``{% generation %}``), the tokens overlapping
  a marked span (``return_assistant_tokens_mask=True``'s rule). Where it does not, the *turn
  rule*, read off the template's own renderings, never a token's name: an assistant turn starts
  where the conversation before it, rendered with the generation prompt (``messages[:i]``,
  ``add_generation_prompt=True``), ends, and ends where the conversation up to and including it
  (``messages[:i + 1]``) stops agreeing with the whole rendering: the end-of-turn markup the
  template writes for the turn is in it, nothing of the next turn is. A row whose rendering
  does not start with that prompt, or whose turn the template writes otherwise once a later
  message follows (Qwen3's empty thinking block), is a bad row (``unmaskable``): never a guess.

A row's tools (``tokenize --tools-column``: JSON-schema function definitions beside the messages,
as TRL's ``SFTTrainer`` reads a ``tools`` column) reach the template as ``apply_chat_template(messages,
tools=...)`` gives them: marked like the messages, the template's ``tool_use`` template chosen when
its config names one (``get_chat_template(tools=...)``), in the prefixes of the turn rule too.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass

import jinja2
import numpy as np

from ..errors import UserError

ROLES = ("system", "user", "assistant", "tool")
"""Roles a message may have; any other is a bad row (``unknown_role``)."""
BAD_REASONS = ("not_a_list", "not_a_message", "unknown_role", "content_not_string", "bad_tools", "template_error",
               "unmaskable")
"""Why a row is bad, as the manifest counts them (``--on-bad-row``)."""
FIXES = {
    "not_a_list": "the column must hold a list of {role, content} messages (or that list as JSON text)",
    "not_a_message": "each message must be an object with role and content",
    "unknown_role": f"a message's role must be one of {', '.join(ROLES)}",
    "content_not_string": "a message's content must be a string (an empty one is fine; an assistant message "
                          "with tool_calls may have none)",
    "bad_tools": "the tools column must hold a list of JSON-schema function definitions (objects), or that list as "
                 "JSON text (null: no tools)",
    "template_error": "the chat template refused the conversation (roles out of order?)",
    "unmaskable": "the template renders earlier turns differently once a later one follows; "
                  "use a template that marks {% generation %}",
}
TEMPLATE_ERRORS = (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError)
"""What rendering one conversation may raise (``raise_exception`` raises ``TemplateError``)."""
GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""How transformers tells a template that marks generations (``render_jinja_template``)."""


@dataclass(frozen=True)
class ChatRow:
    """One conversation's ids and its assistant mask (1: an assistant token), equal lengths."""

    ids: np.ndarray
    mask: np.ndarray


@dataclass(frozen=True)
class BadRow:
    reason: str
    """One of ``BAD_REASONS``."""
    detail: str


def template_of(config: dict, *, name: str) -> str:
    """The chat template a ``tokenizer_config.json`` holds (the ``default`` one of a list); a
    tokenizer without one is a one-line ``UserError``."""
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        template = named_template(template, "default")
    if not isinstance(template, str) or not template.strip():
        raise UserError(f"--chat-column needs a tokenizer with a chat template: --encoding {name}'s "
                        "tokenizer_config.json has no chat_template and no chat_template.jinja is beside it; pass a "
                        "Hugging Face tokenizer folder or repo that has one")
    return template


def named_template(templates, name: str) -> str | None:
    """One of a config's named templates (``[{name, template}, ...]``), or None."""
    if not isinstance(templates, list):
        return None
    return next((t.get("template") for t in templates if isinstance(t, dict) and t.get("name") == name), None)


def tool_template_of(config: dict) -> str | None:
    """The ``tool_use`` template of a config that names several, which ``apply_chat_template``
    takes for a conversation given tools (``get_chat_template``); None: the one template serves."""
    template = named_template(config.get("chat_template") if isinstance(config, dict) else None, "tool_use")
    return template if isinstance(template, str) and template.strip() else None


BLANK_TEXT = object()
"""What ``_read_text`` gives for empty or blank text: a row with nothing in it."""


def _read_text(value, reason: str):
    """A column value as it is, or its JSON text read (datasets that store lists as text):
    ``BLANK_TEXT`` for blank text, a ``BadRow(reason)`` for text that is not JSON."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        return BLANK_TEXT
    try:
        return json.loads(value)
    except ValueError:
        return BadRow(reason, "text that is not JSON")


def tools_of(value) -> list | BadRow | None:
    """A row's tools (``--tools-column``), checked: a list of objects (JSON-schema function
    definitions, as ``apply_chat_template(tools=...)`` takes them), or that list as JSON text, as
    TRL's ``SFTTrainer`` reads it. None (null, empty text, JSON ``null``): the row has no tools and
    renders as without the column. Objects are passed as they are: an Arrow struct column gives
    every field to every object (null where a definition has none), as ``datasets`` gives them."""
    value = _read_text(value, "bad_tools")
    if value is None or value is BLANK_TEXT or isinstance(value, BadRow):
        return None if value is BLANK_TEXT else value
    if not isinstance(value, (list, tuple)):
        return BadRow("bad_tools", f"a {type(value).__name__}, not a list")
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            return BadRow("bad_tools", f"item {i} is a {type(tool).__name__}, not an object")
    return list(value)


def messages_of(value) -> list[dict] | BadRow | None:
    """A row's messages, checked (None: a null or empty row, counted as skipped, not bad). Keys
    whose value is None are dropped, as ``apply_chat_template`` does (an Arrow struct has every
    field in every message). A string is read as JSON (datasets that store messages as text)."""
    if value is None:
        return None
    value = _read_text(value, "not_a_list")
    if value is BLANK_TEXT or isinstance(value, BadRow):
        return None if value is BLANK_TEXT else value
    if not isinstance(value, (list, tuple)):
        return BadRow("not_a_list", f"a {type(value).__name__}")
    if not value:
        return None
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return BadRow("not_a_message", f"message {i} is a {type(m).__name__}")
        m = {k: v for k, v in m.items() if v is not None}
        if m.get("role") not in ROLES:
            return BadRow("unknown_role", f"message {i} has role {m.get('role')!r}")
        if not isinstance(m.get("content"), str) and not _calls_tools(m):
            return BadRow("content_not_string", f"message {i} ({m['role']}) has content {_kind(m.get('content'))}")
        messages.append(m)
    return messages


def _calls_tools(message: dict) -> bool:
    """An assistant message that calls tools and has no content (OpenAI's and TRL's tool-call
    messages): the template renders its ``tool_calls``."""
    return message["role"] == "assistant" and "content" not in message and bool(message.get("tool_calls"))


def _kind(value) -> str:
    return "null" if value is None else f"of type {type(value).__name__}"


class ChatTemplate:
    """A tokenizer and its chat template, ready to turn conversations into ids and masks."""

    def __init__(self, tokenizer, template: str, *, tool_template: str | None = None):
        from transformers.utils import chat_template_utils as ctu  # heavy: transformers, for chat runs only

        self.tokenizer = tokenizer
        self.template = template
        self.marks_generation = bool(GENERATION_RE.search(template))
        self._ctu = ctu
        control = tokenizer._get_control_tokens(template)
        self._control_re, _ = ctu._get_control_token_patterns(control)
        self._could_hold = frozenset(t[0] for t in control if t) | {ctu._CONTROL_TOKEN_START, ctu._CONTROL_TOKEN_END}
        """A string holding none of these characters holds no control token and no marker."""
        _, self._markers_re = ctu._get_control_token_patterns(tuple(tokenizer.added_tokens_encoder))
        self._newline = tokenizer.encode("\n", add_special_tokens=False)
        backend = tokenizer.backend_tokenizer
        self._encode = lambda text: backend.encode(text, add_special_tokens=False)
        """The ``tokenizers`` call ``tokenizer(text, add_special_tokens=False)`` makes, ids and offsets."""
        self._kwargs = dict(tokenizer.special_tokens_map)
        check_turn_rule(template, self._kwargs)
        self._for_tools = ChatTemplate(tokenizer, tool_template) if tool_template and tool_template != template else None
        """The config's ``tool_use`` template, for rows given tools."""

    @property
    def rule(self) -> str:
        """What the manifest records of how masks were made."""
        return "generation" if self.marks_generation else "turn"

    def encode(self, messages: list[dict], tools: list[dict] | None = None) -> ChatRow | BadRow:
        """The conversation's ids (as ``apply_chat_template(messages, tools=tools, tokenize=True)``
        gives them, message and tool text as ordinary text) and its assistant mask."""
        if tools is not None and self._for_tools is not None:
            return self._for_tools.encode(messages, tools)
        marked = self._mark(messages)
        marked_tools = self._mark(tools)
        try:
            text, spans = self._render(marked, marked_tools, generation=self.marks_generation)
            if not self.marks_generation:
                spans = self._turn_spans(marked, marked_tools, text)
                if isinstance(spans, BadRow):
                    return spans
        except TEMPLATE_ERRORS as e:  # the template's raise_exception, or a Jinja error on this conversation
            return BadRow("template_error", _one_line(e))
        ids, starts, ends = self._encode_marked(text)
        return ChatRow(ids=np.asarray(ids, dtype=np.int64),
                       mask=_mask(starts, ends, spans, whole=not self.marks_generation))

    def _mark(self, obj):
        """``mark_control_tokens(obj)``, called only on the strings that could hold a control token
        or a marker: the others it returns as they are (its regex scan was ~5% of a chat row)."""
        if isinstance(obj, str):
            could = self._could_hold
            if not any(c in obj for c in could):
                return obj
            return self._ctu.mark_control_tokens(obj, self._control_re)
        if isinstance(obj, dict):
            return {key: self._mark(value) for key, value in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self._mark(value) for value in obj]
        return obj

    def _render(self, messages, tools, *, generation: bool, prompt: bool = False) -> tuple[str, list]:
        rendered, indices = self._ctu.render_jinja_template(
            conversations=[messages], tools=tools, chat_template=self.template, return_assistant_tokens_mask=generation,
            add_generation_prompt=prompt, **self._kwargs)
        return rendered[0], (indices[0] if generation else [])

    def _turn_spans(self, marked: list[dict], tools, text: str) -> list[tuple[int, int]] | BadRow:
        """The turn rule (module docstring), in the rendering's characters; each prefix rendered
        once, with the row's tools, as the model is prompted. A span's end may fall inside a token
        of the next turn (a closing the template writes only where a conversation ends): ``_mask``
        then leaves that token out."""
        spans = []
        last = len(marked) - 1
        for i, m in enumerate(marked):
            if m["role"] != "assistant":
                continue
            try:
                before, _ = self._render(marked[:i], tools, generation=False, prompt=True)
                turn = text if i == last else self._render(marked[:i + 1], tools, generation=False)[0]
            except TEMPLATE_ERRORS as e:
                return BadRow("unmaskable", f"message {i} (assistant): the template cannot render the conversation "
                                            f"up to it on its own ({_one_line(e)})")
            start = len(before)
            if not text.startswith(before) or not turn.startswith(before):
                return BadRow("unmaskable", f"message {i} (assistant): the rendering does not start with the "
                                            "conversation before it and its generation prompt")
            end = start + _common_prefix(turn, text, start)
            if end < len(turn) and end < self._closing_start(marked[:i + 1], tools, turn):
                return BadRow("unmaskable", f"message {i} (assistant): the template renders this turn differently "
                                            "once a later message follows")
            spans.append((start, end))
        return spans

    def _closing_start(self, marked: list[dict], tools, turn: str) -> int:
        """Where the rendering ``turn`` of a conversation ending on an assistant turn starts to
        write what the template puts only at the end of a conversation (Phi-3's ``eos_token``):
        the first character it does not share with the same conversation rendered with a
        generation prompt. Before it, the turn must be in the whole conversation's rendering."""
        try:
            prompted, _ = self._render(marked, tools, generation=False, prompt=True)
        except TEMPLATE_ERRORS:
            return len(turn)
        return _common_prefix(turn, prompted, 0)

    def _encode_marked(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
        """``encode_marked_chat``'s ids, with each token's characters in ``text`` (starts, ends):
        marked control tokens as plain text, lone markers dropped (still breaking the text), the
        rest as usual. A marked token's pieces all get its whole span (the mask never splits a
        message's text)."""
        ids: list[int] = []
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        at, first = 0, True
        for m in self._markers_re.finditer(text):
            if m.start() > at:
                self._piece(text[at:m.start()], at, as_text=False, first=first, out=(ids, starts, ends))
            first = False
            if m.group(1) is not None:
                self._piece(m.group(1), m.start(1), as_text=True, first=False, out=(ids, starts, ends))
            at = m.end()
        if at < len(text) or first:
            self._piece(text[at:], at, as_text=False, first=first, out=(ids, starts, ends))
        if not starts:
            return ids, np.zeros(0, np.int64), np.zeros(0, np.int64)
        return ids, np.concatenate(starts), np.concatenate(ends)

    def _piece(self, piece: str, base: int, *, as_text: bool, first: bool, out: tuple[list, list, list]) -> None:
        """``_encode_chat_piece``: a piece after the first is encoded after a newline (so a
        SentencePiece tokenizer adds no prefix space), the newline's ids then removed. Encoded by
        the tokenizer's own backend (``tokenizers``), as ``tokenizer.encode`` does, offsets kept."""
        if not piece:
            return
        ids, starts, ends = out
        n = len(self._newline)
        if as_text:
            tok = self.tokenizer
            got = tok._encode_without_added_tokens("\n" + piece)
            got = got[n:] if got[:n] == self._newline else tok._encode_without_added_tokens(piece)
            ids += got
            starts.append(np.full(len(got), base, np.int64))
            ends.append(np.full(len(got), base + len(piece), np.int64))
            return
        shift = 0
        if not first:
            enc = self._encode("\n" + piece)
            if enc.ids[:n] == self._newline:
                got, where, shift = enc.ids[n:], enc.offsets[n:], 1
            else:
                enc = self._encode(piece)
                got, where = enc.ids, enc.offsets
        else:
            enc = self._encode(piece)
            got, where = enc.ids, enc.offsets
        ids += got
        where = np.asarray(where, dtype=np.int64).reshape(-1, 2)
        starts.append(np.maximum(where[:, 0] - shift, 0) + base)
        ends.append(np.maximum(where[:, 1] - shift, 0) + base)


def _mask(starts: np.ndarray, ends: np.ndarray, spans: list[tuple[int, int]], *, whole: bool = False) -> np.ndarray:
    """1 for every token overlapping a span (``apply_chat_template``'s own rule). ``whole`` (the
    turn rule): not a token that runs past its span's end, which holds what follows the turn."""
    mask = np.zeros(len(starts), dtype=np.uint8)
    for lo, hi in spans:
        inside = (ends > lo) & (starts < hi)
        if whole:
            inside &= ends <= hi
        mask[inside] = 1
    return mask


def _common_prefix(a: str, b: str, at: int) -> int:
    """How many characters ``a`` and ``b`` share from index ``at`` on."""
    n = min(len(a), len(b)) - at
    if n <= 0 or a[at:at + n] == b[at:at + n]:
        return max(n, 0)
    lo, hi = 0, n  # a[at:at+lo] == b[at:at+lo], a[at:at+hi] != b[at:at+hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[at:at + mid] == b[at:at + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def build(payload: bytes, config: bytes, *, name: str, template: str | None = None) -> ChatTemplate:
    """The ``ChatTemplate`` of a Hugging Face tokenizer from its files' bytes, loaded as users load
    it (``AutoTokenizer.from_pretrained`` on a folder holding the two files); ``template``
    (``--chat-template``) replaces the config's templates, every row rendered with it."""
    from transformers import AutoTokenizer  # heavy: transformers (~0.5 s), for chat runs only

    parsed = json.loads(config) if config else {}
    chosen = template if template is not None else template_of(parsed, name=name)
    with tempfile.TemporaryDirectory(prefix="tokenshards-chat-") as folder:
        for file, data in (("tokenizer.json", payload), ("tokenizer_config.json", config)):
            with open(os.path.join(folder, file), "wb") as f:
                f.write(data)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    return ChatTemplate(tokenizer, chosen, tool_template=tool_template_of(parsed) if template is None else None)


def read_template_file(path: str) -> str:
    """``--chat-template FILE``'s text: a missing, unreadable, non-UTF-8 or empty file is one line."""
    fix = "pass a file holding a Jinja chat template (such as a tokenizer's chat_template.jinja)"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as e:
        raise UserError(f"--chat-template {path}: cannot read it ({e.strerror or type(e).__name__}); {fix}") from e
    if len(data) > MAX_TEMPLATE_BYTES:
        raise UserError(f"--chat-template {path}: over {MAX_TEMPLATE_BYTES // 1024} KiB, not a chat template; {fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"--chat-template {path}: not UTF-8 text ({e.reason} at byte {e.start}); {fix}") from e
    if not text.strip():
        raise UserError(f"--chat-template {path}: the file is empty; {fix}")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        if "generation" not in str(e):  # transformers' own environment knows {% generation %}
            raise UserError(f"--chat-template {path}: not a Jinja template (line {e.lineno}: {e.message}); {fix}") from e
    return text


MAX_TEMPLATE_BYTES = 1 << 20
"""Real chat templates are a few KiB (gpt-oss's, among the longest, ~15 KiB)."""


def special_tokens_of(config: dict) -> dict[str, str]:
    """The special-token strings a template sees (``bos_token``, ``eos_token``, ...), as
    ``apply_chat_template`` passes them, from a ``tokenizer_config.json`` (a token may be stored
    as a string or as an AddedToken object)."""
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        value = config.get(key) if isinstance(config, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[key] = value
    return out


PROBE_ASKED = [{"role": "user", "content": "Hi"}]
PROBE_ANSWERED = [{"role": "assistant", "content": "Hello"}]
"""The conversation the checks below render a template on, before any work."""


def _renderer(template: str, special_tokens: dict[str, str]):
    from transformers.utils.chat_template_utils import render_jinja_template  # heavy: transformers

    def render(messages, prompt=False):
        return render_jinja_template(conversations=[messages], chat_template=template, add_generation_prompt=prompt,
                                     **special_tokens)[0][0]

    return render


def stop_warning(template: str, special_tokens: dict[str, str]) -> str | None:
    """A warning when the template ends an assistant turn with its text and writes no end of turn
    (GLM-4's: the next turn's header, ``<|user|>`` or ``<|observation|>``, is what the model writes to
    stop). The turn rule leaves that header to the next turn, so the mask would not teach the model
    to stop; TRL's training twin marks it. None for a template that marks ``{% generation %}`` (its
    marks decide) or that the probe conversation does not render."""
    if GENERATION_RE.search(template):
        return None
    content = PROBE_ANSWERED[0]["content"]
    try:
        rendered = _renderer(template, special_tokens)(PROBE_ASKED + PROBE_ANSWERED)
    except TEMPLATE_ERRORS:
        return None
    if content not in rendered or rendered[rendered.rindex(content) + len(content):].strip():
        return None
    return ("chat: warning: the template ends an assistant turn with its text and no end-of-turn token (the model "
            "stops by writing the next turn's header, GLM-4's way), which the turn rule leaves to the next turn: "
            "the mask will not teach the model to stop. To train the stop, pass --chat-template FILE with a "
            "template that marks {% generation %} (TRL's *_training.jinja marks that header)")


def check_turn_rule(template: str, special_tokens: dict[str, str]) -> None:
    """Refuse, in one line, a template whose turns the turn rule cannot read: one that writes the
    same text with and without a generation prompt and, at the end of a conversation, more than its
    turns (Llama 3 8B Instruct's first published template ends every conversation with an assistant
    header), so that a conversation's last turn would seem to run on into a new one. A template with
    no generation prompt whose turns follow each other as they are (Mistral's ``[INST] ... [/INST]``)
    is read as any other. Templates that mark ``{% generation %}`` need no such reading."""
    if GENERATION_RE.search(template):
        return
    render = _renderer(template, special_tokens)
    asked, answered = PROBE_ASKED, PROBE_ANSWERED
    try:
        if render(asked) != render(asked, prompt=True):
            return
        ends = render(asked + answered)
        follows = render(asked + answered + [{"role": "user", "content": "Bye"}])
    except TEMPLATE_ERRORS:
        return  # a template that refuses these is judged row by row
    if not follows.startswith(ends):
        raise UserError("the chat template writes the same text with and without add_generation_prompt and ends every "
                        "conversation with more than its turns (a new assistant header?), so where an assistant turn "
                        "ends cannot be read off its renderings and no assistant mask can be made; pass --chat-template "
                        "FILE with a template that writes its generation prompt only when asked (the tokenizer's later "
                        "revision) or one that marks {% generation %} (such as TRL's *_training.jinja)")
