"""Model backend ``openai``: any OpenAI-compatible chat-completions endpoint, through the official client.

Requests of one batch run concurrently (at most ``concurrency`` at a time). A request that meets a
429, a 5xx, a timeout or a connection error is retried with exponential backoff
(``backoff * 2**attempt`` seconds, with jitter) up to ``max_retries`` times; after that, or on any
other error, the request's slot in the result holds the exception, and the rollout engine records
that episode as failed. The other requests of the batch are unaffected.
"""
from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..types import Completion, SamplingParams


@dataclass
class OpenAIStats:
    requests: int = 0
    retries: int = 0
    failures: int = 0
    timeouts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"requests": self.requests, "retries": self.retries, "failures": self.failures,
                    "timeouts": self.timeouts}

    def add(self, **kw: int) -> None:
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)


class OpenAIRef:
    """A partner served by an OpenAI-compatible endpoint (frozen: it has no token ids to train on)."""

    chat = True
    trainable = False
    version = 0

    def __init__(self, id: str, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 timeout: float = 60.0, concurrency: int = 8, max_retries: int = 4, backoff: float = 0.5,
                 json_schema: bool = False, seed: int = 0, max_tokens: int | None = None,
                 token_limit_field: str = "max_tokens"):
        import openai

        key = os.environ.get(api_key_env, "") if api_key_env else ""
        self.id, self.model, self.json_schema, self.max_tokens = id, model, json_schema, max_tokens
        self.token_limit_field = token_limit_field
        self.max_retries, self.backoff, self.concurrency = max_retries, backoff, concurrency
        self.client = openai.OpenAI(base_url=base_url, api_key=key or "EMPTY", timeout=timeout, max_retries=0)
        self.stats = OpenAIStats()
        self._rng = random.Random(seed)
        self._retryable = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError,
                           openai.APIConnectionError)
        self._status_error = openai.APIStatusError
        self._timeout = openai.APITimeoutError

    @classmethod
    def from_config(cls, name: str, mc, seed: int = 0) -> "OpenAIRef":
        """The client of a ``models.<name>`` entry with ``backend: openai``."""
        return cls(id=name, base_url=mc.base_url, model=mc.model_name, api_key_env=mc.api_key_env,
                   timeout=mc.timeout, concurrency=mc.concurrency, max_retries=mc.max_retries, backoff=mc.backoff,
                   json_schema=mc.json_schema, seed=seed, max_tokens=mc.max_tokens,
                   token_limit_field=mc.token_limit_field)

    def drop_sessions(self, keys) -> None:
        pass

    def _is_retryable(self, e: BaseException) -> bool:
        if isinstance(e, self._retryable):
            return True
        return isinstance(e, self._status_error) and getattr(e, "status_code", 0) in (408, 409, 429) or \
            (isinstance(e, self._status_error) and getattr(e, "status_code", 0) >= 500)

    def chat_stream(self, messages: list[dict[str, str]], sampling: SamplingParams, on_text) -> Completion:
        """One reply, streamed: ``on_text(text so far)`` is called as each piece arrives (``stream: true``).
        A failure before the first piece is retried as ``_one`` retries; after it, it is raised."""
        return self._one(messages, sampling, None, on_text=on_text)

    def _one(self, messages: list[dict[str, str]], sp: SamplingParams,
             response_format: dict[str, Any] | None, on_text=None) -> Completion:
        kw: dict[str, Any] = dict(model=self.model, messages=messages, temperature=sp.temperature)
        kw[self.token_limit_field] = self.max_tokens or sp.max_new_tokens
        if sp.top_p < 1.0:
            kw["top_p"] = sp.top_p
        if sp.stop:
            kw["stop"] = list(sp.stop)
        if response_format is not None:
            kw["response_format"] = response_format
        attempt = 0
        while True:
            self.stats.add(requests=1)
            got_any = False
            try:
                if on_text is not None:
                    text, finish = "", None
                    for chunk in self.client.chat.completions.create(**kw, stream=True):
                        if not chunk.choices:
                            continue
                        c = chunk.choices[0]
                        piece = getattr(c.delta, "content", None) or ""
                        if piece:
                            text += piece
                            got_any = True
                            on_text(text)
                        finish = c.finish_reason or finish
                else:
                    r = self.client.chat.completions.create(**kw)
                    choice = r.choices[0]
                    text, finish = choice.message.content or "", choice.finish_reason
                reason = {"stop": "eos", "length": "length"}.get(finish or "stop", "eos")
                return Completion(text=text, token_ids=[], logprobs=[], finish_reason=reason, model_id=self.id)
            except Exception as e:  # noqa: BLE001
                if isinstance(e, self._timeout):
                    self.stats.add(timeouts=1)
                if attempt >= self.max_retries or not self._is_retryable(e) or got_any:  # a shown piece stays shown
                    self.stats.add(failures=1)
                    raise
                self.stats.add(retries=1)
                time.sleep(self.backoff * (2 ** attempt) * (0.5 + self._rng.random()))
                attempt += 1

    def chat_generate(self, conversations: list[list[dict[str, str]]], sampling: SamplingParams,
                      response_format: dict[str, Any] | None = None) -> list[Completion | BaseException]:
        def run(msgs):
            try:
                return self._one(msgs, sampling, response_format)
            except Exception as e:  # noqa: BLE001 - returned, not raised: one failure fails one episode
                return e

        if len(conversations) == 1:
            return [run(conversations[0])]
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(conversations)))) as ex:
            return list(ex.map(run, conversations))
