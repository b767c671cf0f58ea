"""One answer's text as its token ids arrive: decoded incrementally, cut at stop strings.

The engine speaks ids; OpenAI's `stop` strings are text, and a stop string can end
in the middle of a token, span several, or start in one that also carries text the
client must get. So the cut happens here, on the decoded text: everything before the
earliest stop string is the answer, nothing from it on is sent. While streaming, text
that could still turn out to be the start of a stop string is held back until the
next ids decide, and so is a trailing half of a multi-byte character.

Decoding is incremental (the offsets scheme of vLLM's detokenizer): each new id decodes
a short window of the latest ids rather than the whole answer, and only text that
the window's earlier ids did not already spell is new. Decoding a window of a longer
row gives the same characters as the whole row for the byte-level and metaspace
tokenizers jspec reads (each id's bytes or pieces are independent of its neighbours).
"""

from __future__ import annotations


class IncrementalDecoder:
  """Token ids in, new text out, never half a character."""

  def __init__(self, tokenizer, skip_ids=()):
    self._tokenizer = tokenizer
    self._skip = frozenset(int(i) for i in skip_ids)  # EOS ids: never text
    self.ids: list[int] = []
    self._prefix = 0  # the window decoded for context starts here...
    self._read = 0  # ...and ends here: text of ids up to here has been handed out

  def push(self, token: int) -> str:
    """The text `token` completes (often "", e.g. inside a multi-byte character)."""
    if token in self._skip:
      return ""
    self.ids.append(int(token))
    return self._advance(final=False)

  def flush(self) -> str:
    """What is left at the end of the answer (a dangling partial character included)."""
    return self._advance(final=True)

  def _advance(self, final: bool) -> str:
    decode = self._tokenizer.decode
    before = decode(self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
    now = decode(self.ids[self._prefix:])
    if len(now) > len(before) and (final or not now.endswith("\ufffd")):
      self._prefix, self._read = self._read, len(self.ids)
      return now[len(before):]
    return ""


class StopText:
  """One choice's text: `push` each id as it comes and send what it returns; `finish`
  gives the rest once the answer ends. After a stop string, `stopped` is True and the
  text is final (the stop string itself is not in it, as in OpenAI's API)."""

  def __init__(self, tokenizer, stop=(), skip_ids=()):
    self._decoder = IncrementalDecoder(tokenizer, skip_ids)
    self._stop = tuple(s for s in stop if s)
    self._longest = max((len(s) for s in self._stop), default=0)
    self._text = ""  # decoded so far
    self.sent = 0  # characters of it handed out
    self.stopped = False
    self.tokens = 0  # ids that made the answer: all of them, or up to the one that stopped it

  @property
  def text(self) -> str:
    """The answer's text handed out so far (all of it after `finish` or a stop)."""
    return self._text[:self.sent]

  def push(self, token: int) -> str:
    """New text that is safe to send (no stop string can start in it)."""
    if self.stopped:
      return ""
    self.tokens += 1
    self._text += self._decoder.push(token)
    return self._release(final=False)

  def finish(self) -> str:
    """The text held back, once no id will follow."""
    if self.stopped:
      return ""
    self._text += self._decoder.flush()
    return self._release(final=True)

  def _release(self, final: bool) -> str:
    # A stop string cannot begin in text already sent: text that could begin one is
    # held back until it cannot, so the earliest match starts at or after `sent`.
    hits = [i for i in (self._text.find(s, self.sent) for s in self._stop) if i >= 0]
    if hits:
      end = min(hits)
      self._text = self._text[:end]
      self.stopped = True
    else:
      end = len(self._text) - (0 if final else self._held())
    out = self._text[self.sent:end]
    self.sent = end
    return out

  def _held(self) -> int:
    """Characters at the end that begin some stop string (kept back: the next ids may
    complete it)."""
    tail = self._text[max(self.sent, len(self._text) - self._longest + 1):]
    for start in range(len(tail)):
      if any(s.startswith(tail[start:]) for s in self._stop):
        return len(tail) - start
    return 0
