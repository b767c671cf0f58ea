"""Streaming is per call: each call's listener hears its own rows, one compiled program
serves every listener, and calls on two threads stream side by side."""

import threading

import numpy as np
import pytest

import jspec
from jspec.core import programs
from jspec.planner import streams


def _collect():
  rows = []

  def listener(new):
    if not rows:
      rows.extend([] for _ in new)
    for b, ids in enumerate(new):
      rows[b].extend(ids)
  return rows, listener


def _emitted(out):
  return [np.asarray(out.tokens)[b, :int(out.lengths[b])].tolist()
          for b in range(out.tokens.shape[0])]


def test_each_listener_hears_its_own_call_and_the_program_is_shared(target, close_draft):
  first, listen_first = _collect()
  out = jspec.speculative_generate(target, close_draft, [[1, 2, 3], [4, 5]], num_draft_tokens=3,
                                   max_new_tokens=9, stream=listen_first)
  assert first == _emitted(out)
  size = programs.fixed._cache_size()
  second, listen_second = _collect()
  out2 = jspec.speculative_generate(target, close_draft, [[7, 8, 9], [1]], num_draft_tokens=3,
                                    max_new_tokens=9, stream=listen_second)
  assert second == _emitted(out2) and first == _emitted(out)  # the first heard nothing more
  assert programs.fixed._cache_size() == size  # a new listener is not a new program


@pytest.mark.slow  # two sampled programs compiled
def test_two_threads_stream_side_by_side(target):
  prompts = {"a": [[1, 2, 3]], "b": [[9, 8, 7, 6]]}
  heard, outs, errors = {}, {}, []

  def run(name):
    try:
      rows, listener = _collect()
      heard[name] = rows
      outs[name] = jspec.generate(target, prompts[name], max_new_tokens=12, temperature=0.8,
                                  seed=3, stream=listener)
    except Exception as e:  # reported below: a thread's exception is otherwise lost
      errors.append(e)

  threads = [threading.Thread(target=run, args=(n,)) for n in prompts]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, errors
  for name in prompts:
    assert heard[name] == _emitted(outs[name])
  assert not streams._OPEN  # every channel closed with its call


def test_a_listener_must_be_callable(target):
  with pytest.raises(TypeError, match="stream must be a callable"):
    jspec.generate(target, [[1, 2]], max_new_tokens=2, stream=3)
