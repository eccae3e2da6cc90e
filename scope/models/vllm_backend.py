"""Model backend ``vllm``: generation on a vLLM engine, token ids in and out, adapters synced by version.

A ``backend: vllm`` model is two things: the local transformers model that the learner trains (and that
holds every LoRA adapter: the trainable roles', the pool's), and a vLLM OpenAI-compatible server that
samples for every role bound to that model. ``EngineBackend`` wraps the local backend and replaces only
its ``generate``; everything else (adapters, versions, the learner's weights) is the local backend's.

- **Token in, token out.** Prompts go to ``/v1/completions`` as token-id lists, every prompt of a
  batch in one request (the engine batches them); each choice comes back with its ``token_ids`` (the
  end-of-turn token included) and the log-prob of every sampled token. The engine is started with
  ``--logprobs-mode processed_logprobs``, so those are log-probs of the distribution it sampled from
  (after temperature), which is what the learner's clipped ratio compares with.
- **Adapters by version.** Before a batch for adapter ``A`` is sent, the local version of ``A`` (the
  learner's update count; a pool member's copy) is compared with the version the engine holds. If it
  moved, the adapter alone is written to ``<sync_dir>/A@v<version>/`` and registered on the engine as
  ``A@v<version>`` (``/v1/load_lora_adapter``); requests then name the new version, and older versions
  of ``A`` are unloaded once no batch in flight uses them. Adapters that left the local model (an
  evicted pool member) are unloaded too. A pool is thus a set of adapters on one engine.
- **Full fine-tuning.** A fully fine-tuned model's weights are the engine's base: when the learner's
  version of the whole model moved (and once at first use, since a running engine's weights are not
  known), the weights are written as safetensors to ``<sync_dir>/full@v<version>/`` and the engine
  reloads them in place (``/collective_rpc`` ``reload_weights``; a started engine runs with
  ``VLLM_SERVER_DEV_MODE=1``, which opens that route, on 127.0.0.1 only), then its prefix cache is
  reset. Batches already sampling on the old weights finish first; the reload waits for them.
  vLLM's in-place reload does not refresh an output layer tied to the input embeddings (it keeps
  the old one), so for a model with tied embeddings scope starts the engine from an untied copy
  (``tie_word_embeddings: false`` and an explicit ``lm_head.weight``) and syncs untied copies; the
  engine then holds the embedding matrix twice. A server of your own (``base_url``) is refused for
  full fine-tuning of a tied model, since scope cannot tell how it was started.
- **Stopping.** Stop strings go to the engine (kept in the output, as the local backend keeps them);
  ``stop_fn`` and ``restart_fn`` (Python callbacks) are applied to the returned tokens: a row is cut
  after the first token at which ``stop_fn`` holds (autoregressive sampling makes the prefix the same
  as if it had stopped there), and a row that ``restart_fn`` rejects is sampled again, up to
  ``max_restarts`` times.
- **Failures.** A request that fails (engine dead, refused, malformed reply) returns the exception in
  each of its rows' slots, so the rollout engine records those episodes as failed and the step goes on.

``VLLMEngine`` starts ``python -m vllm.entrypoints.openai.api_server`` bound to 127.0.0.1 (or connects
to ``base_url``: a server of your own needs the flags above, and ``VLLM_SERVER_DEV_MODE=1`` for full
fine-tuning) and stops it on close.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from ..types import Completion, SamplingParams

BASE_NAME = "base"  # the engine's served name of the base weights
_VIEW = threading.local()  # the adapter versions a thread's batch plays (EngineBackend.viewing)


class EngineError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMEngine:
    """A vLLM OpenAI-compatible server: started here on 127.0.0.1, or an existing one at ``base_url``."""

    def __init__(self, model_path: str | None = None, base_url: str | None = None, *, max_loras: int = 8,
                 max_lora_rank: int = 16, max_model_len: int = 4096, dtype: str = "float32",
                 extra_args: Sequence[str] = (), python: str | None = None, start_timeout: float = 600.0,
                 request_timeout: float = 600.0, log_path: str | None = None, env: dict[str, str] | None = None):
        self.request_timeout = request_timeout
        self.proc: subprocess.Popen | None = None
        self._log = None
        if base_url:
            self.base_url = base_url.rstrip("/")
            self.wait_ready(start_timeout)
            return
        if model_path is None:
            raise ValueError("a vLLM engine needs a model path to start or a base_url to connect to")
        port = _free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
               "--host", "127.0.0.1", "--port", str(port), "--served-model-name", BASE_NAME,
               "--dtype", dtype, "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs",
               "--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(max_lora_rank),
               "--disable-log-stats", *extra_args]
        penv = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                    VLLM_HOST_IP="127.0.0.1", VLLM_SERVER_DEV_MODE="1")
        penv.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        penv.update(env or {})
        self._log = open(log_path, "ab") if log_path else tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=penv,
                                     start_new_session=True)
        self.wait_ready(start_timeout)

    def log_tail(self, n: int = 2000) -> str:
        if self._log is None:
            return ""
        try:
            self._log.flush()
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - n))
            return self._log.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def wait_ready(self, timeout: float) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineError(f"the vLLM server exited with code {self.proc.returncode} while starting:\n"
                                  f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.close()
        raise EngineError(f"the vLLM server at {self.base_url} was not ready after {timeout:.0f}s")

    def post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        req = urllib.request.Request(self.base_url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.request_timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise EngineError(f"vLLM {path}: HTTP {e.code}: {e.read()[:500].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise EngineError(f"vLLM {path}: {e}") from None
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            if path.endswith("_lora_adapter"):  # these answer in plain text
                return {"text": raw.decode(errors="replace")}
            raise EngineError(f"vLLM {path}: not JSON: {raw[:200]!r}") from None

    def get(self, path: str, timeout: float = 30.0) -> Any:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
            raise EngineError(f"vLLM {path}: {e}") from None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import signal

            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc = None


class EngineBackend:
    """A local backend (weights, adapters, versions: the learner's) whose sampling runs on a vLLM engine."""

    def __init__(self, local, engine: VLLMEngine, sync_dir: str | None = None, seed: int = 0,
                 full_weights: bool = False):
        self.local, self.engine = local, engine
        self.full_weights = full_weights        # the base weights train (finetune: full): sync them too
        self.untied = full_weights and tied_embeddings(local.model)  # see the module docstring
        self.synced_full: int | None = None     # the version of the whole model the engine serves
        self.idle = threading.Condition()       # notified whenever a batch ends
        self.sync_dir = sync_dir or tempfile.mkdtemp(prefix="scope-adapters-")
        self._own_dir = sync_dir is None
        self.synced: dict[str, int] = {}        # adapter -> version the engine serves
        self.loaded: dict[str, list[str]] = {}  # adapter -> engine names still loaded (newest last)
        self.in_flight: dict[str, int] = {}     # engine name -> batches using it now
        self.lock = threading.Lock()
        self.seed = seed
        self.calls = 0
        self.held = False                       # asynchronous rollouts: adapters arrive by ``publish`` only
        self.pinned: dict[str, int] = {}        # engine name -> batches whose view holds it (``viewing``)
        self.stats = {"syncs": 0, "sync_seconds": 0.0, "unloaded": 0, "requests": 0, "failures": 0}

    def __getattr__(self, name):  # everything but sampling is the local backend's
        if name in ("local", "engine"):
            raise AttributeError(name)
        return getattr(self.local, name)

    def readout(self, *a, **kw):
        if self.held:  # (it runs the local weights, which the learner changes meanwhile)
            raise EngineError(f"model {self.local.name!r}: a decision readout runs the local weights and cannot be "
                              f"generated asynchronously (rollout.max_staleness > 0); set it to 0 for this env")
        return self.local.readout(*a, **kw)

    # -- asynchronous rollouts (scope.pipeline) --
    def hold(self) -> None:
        """From now on adapters reach the engine only through :meth:`publish`, called by the driver between two
        updates, and sampling never reads the weights the learner is changing."""
        if self.full_weights:
            raise ValueError(f"model {self.local.name!r}: fully fine-tuned weights on a vLLM engine cannot be "
                             f"generated asynchronously (the engine holds one version of them); use LoRA or "
                             f"rollout.max_staleness: 0")
        self.held = True

    def publish(self) -> dict[str, int]:
        """Send every adapter whose version moved; the versions the engine now serves (a batch's view)."""
        with self.lock:
            for a in self.local.adapter_names():
                v = self.local.versions.get(a, 0)
                if self.synced.get(a) != v:
                    self._sync(a, v)
            self._unload_stale()
            return dict(self.synced)

    @contextlib.contextmanager
    def viewing(self, versions: dict[str, int]):
        """Sampling in this thread serves these adapter versions (``rollout.stale: drop``: a batch plays on the
        weights it started with); they stay loaded until the batch ends."""
        names = [f"{a}@v{v}" for a, v in versions.items()]
        with self.lock:
            for n in names:
                self.pinned[n] = self.pinned.get(n, 0) + 1
        views = _VIEW.__dict__.setdefault("views", {})
        views[id(self)] = versions
        try:
            yield
        finally:
            views.pop(id(self), None)
            with self.lock:
                for n in names:
                    self.pinned[n] -= 1

    def drop_sessions(self, keys=None) -> None:
        pass  # the engine's prefix cache does what the local per-session cache does

    # -- adapters --
    def served_name(self, adapter: str | None) -> str:
        if adapter is None:
            if self.full_weights and self.synced_full != self.local.versions.get(None, 0):
                self._sync_full()
            return BASE_NAME
        with self.lock:
            if self.held:  # the published version: this thread's view, else the newest
                version = getattr(_VIEW, "views", {}).get(id(self), {}).get(adapter, self.synced.get(adapter))
                if version is None:
                    raise EngineError(f"adapter {adapter!r} was never published to the engine")
                return f"{adapter}@v{version}"
            version = self.local.versions.get(adapter, 0)
            if self.synced.get(adapter) != version:
                self._sync(adapter, version)
            self._unload_stale()
            return f"{adapter}@v{version}"

    def _sync(self, adapter: str, version: int) -> None:
        if adapter not in self.local.adapter_names():
            raise KeyError(f"model {self.local.name!r} has no adapter {adapter!r}")
        t0 = time.perf_counter()
        name = f"{adapter}@v{version}"
        out = os.path.join(self.sync_dir, name)
        shutil.rmtree(out, ignore_errors=True)
        self.local.model.save_pretrained(out, selected_adapters=[adapter])
        path = os.path.join(out, adapter) if os.path.isdir(os.path.join(out, adapter)) else out
        try:
            self.engine.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        except EngineError as e:  # a name an earlier run on the same engine left loaded: its weights are not these
            if "already been loaded" not in str(e):
                raise
            self.engine.post("/v1/unload_lora_adapter", {"lora_name": name})
            self.engine.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        self.synced[adapter] = version
        self.loaded.setdefault(adapter, []).append(name)
        self.stats["syncs"] += 1
        self.stats["sync_seconds"] += time.perf_counter() - t0

    def _sync_full(self) -> None:
        with self.idle:  # no batch samples while the weights change under it
            while any(self.in_flight.values()):
                self.idle.wait()
            with self.lock:
                version = self.local.versions.get(None, 0)
                if self.synced_full == version:
                    return
                t0 = time.perf_counter()
                name = f"full@v{version}"
                out = os.path.join(self.sync_dir, name)
                shutil.rmtree(out, ignore_errors=True)
                self._write_full(out)
                self.engine.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": out}})
                self.engine.post("/reset_prefix_cache", {})
                self.synced_full = version
                for d in os.listdir(self.sync_dir):  # older versions, and the copy the engine started from
                    if d != name and (d.startswith("full@v") or d == "start"):
                        shutil.rmtree(os.path.join(self.sync_dir, d), ignore_errors=True)
                # the engine dropped its adapters with the old weights (they are loaded again on use)
                self.stats["syncs"] += 1
                self.stats["sync_seconds"] += time.perf_counter() - t0

    def _unload_stale(self) -> None:
        live = set(self.local.adapter_names())
        for adapter, names in list(self.loaded.items()):
            keep = names[-1:] if adapter in live else []
            for n in [n for n in names if n not in keep]:
                if self.in_flight.get(n, 0) or self.pinned.get(n, 0):
                    continue
                try:
                    self.engine.post("/v1/unload_lora_adapter", {"lora_name": n})
                except EngineError:
                    pass  # an engine that lost it already does not serve it
                names.remove(n)
                self.stats["unloaded"] += 1
                shutil.rmtree(os.path.join(self.sync_dir, n), ignore_errors=True)
            if not names:
                del self.loaded[adapter]
                self.synced.pop(adapter, None)

    def _write_full(self, out: str) -> None:
        write_weights(self.local.model, out, untied=self.untied)

    # -- sampling --
    def generate(self, prompts: list[list[int]], sampling: SamplingParams, adapter: str | None = None,
                 sessions: Sequence[Any] | None = None) -> list[Completion | BaseException]:
        if not prompts:
            return []
        try:
            name = self.served_name(adapter)
        except Exception as e:  # noqa: BLE001 - a failed sync fails this batch's episodes, not the step
            self.stats["failures"] += 1
            return [EngineError(f"syncing adapter {adapter!r} to the engine failed: {e}") for _ in prompts]
        version = int(name.rsplit("@v", 1)[1]) if "@v" in name else self.local.versions.get(adapter, 0)
        with self.lock:
            self.in_flight[name] = self.in_flight.get(name, 0) + 1
        try:
            outs: list[Completion | BaseException | None] = [None] * len(prompts)
            todo = list(range(len(prompts)))
            restarts = [0] * len(prompts)
            while todo:
                got = self._request(name, [prompts[i] for i in todo], sampling)
                again: list[int] = []
                c: Completion | BaseException | None
                for i, c in zip(todo, got):
                    if not isinstance(c, BaseException):
                        c = self._apply_callbacks(c, sampling)
                        if c is None:  # restart_fn rejected it
                            if restarts[i] < sampling.max_restarts:
                                restarts[i] += 1
                                again.append(i)
                                continue
                            c = outs[i] or EngineError("every attempt was rejected")
                        else:
                            c.model_id, c.model_version = f"{self.local.name}:{adapter or 'base'}", version
                    outs[i] = c
                todo = again
            return outs  # type: ignore[return-value]
        finally:
            with self.idle:
                with self.lock:
                    self.in_flight[name] -= 1
                self.idle.notify_all()

    def _request(self, name: str, prompts: list[list[int]], sp: SamplingParams) -> list[Completion | BaseException]:
        self.calls += 1
        body: dict[str, Any] = {"model": name, "prompt": prompts, "max_tokens": sp.max_new_tokens,
                                "temperature": sp.temperature, "top_p": sp.top_p, "logprobs": 0,
                                "return_tokens_as_token_ids": True, "return_token_ids": True,
                                "skip_special_tokens": False, "stop_token_ids": list(self.local.eos_ids),
                                "seed": (self.seed * 1_000_003 + self.calls) % (2 ** 31)}
        if sp.stop:
            body["stop"] = list(sp.stop)
            body["include_stop_str_in_output"] = True
        self.stats["requests"] += 1
        try:
            r = self.engine.post("/v1/completions", body)
            choices = sorted(r["choices"], key=lambda c: c["index"])
            if len(choices) != len(prompts):
                raise EngineError(f"asked for {len(prompts)} completions, got {len(choices)}")
            return [self._completion(c) for c in choices]
        except Exception as e:  # noqa: BLE001
            self.stats["failures"] += 1
            err = e if isinstance(e, EngineError) else EngineError(f"malformed engine reply: {e!r}")
            return [err for _ in prompts]

    def _completion(self, c: dict[str, Any]) -> Completion:
        ids = [int(t) for t in c["token_ids"]]
        lps = [float(x) if x is not None else 0.0 for x in c["logprobs"]["token_logprobs"]]
        if len(lps) != len(ids):
            raise EngineError(f"{len(ids)} token ids but {len(lps)} log-probs")
        eos = set(self.local.eos_ids)
        if ids and ids[-1] in eos:
            reason = "eos"
        elif c.get("finish_reason") == "length":
            reason = "length"
        else:
            reason = "stop"
        return Completion(text=self.local.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                          logprobs=lps, finish_reason=reason)

    def _apply_callbacks(self, c: Completion, sp: SamplingParams) -> Completion | None:
        if sp.stop_fn is None and not (sp.restart_fn is not None and sp.max_restarts > 0):
            return c
        tok = self.local.tokenizer
        for n in range(1, len(c.token_ids) + 1):
            text = tok.decode(c.token_ids[:n], skip_special_tokens=True)
            if sp.restart_fn is not None and sp.max_restarts > 0 and n < len(c.token_ids) and sp.restart_fn(text):
                return None
            if sp.stop_fn is not None and sp.stop_fn(text) and n < len(c.token_ids):
                return Completion(text=text, token_ids=c.token_ids[:n], logprobs=c.logprobs[:n], finish_reason="stop")
        return c

    def close(self) -> None:
        self.engine.close()
        if self._own_dir:
            shutil.rmtree(self.sync_dir, ignore_errors=True)


def tied_embeddings(model) -> bool:
    out = model.get_output_embeddings()
    return out is not None and out.weight is model.get_input_embeddings().weight


def write_weights(model, out: str, untied: bool = False) -> None:
    """Write ``model`` as a transformers checkpoint (config, generation config, safetensors); ``untied``:
    with its own ``lm_head.weight`` and ``tie_word_embeddings: false``."""
    if not untied:
        model.save_pretrained(out, safe_serialization=True)
        return
    import copy

    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    cfg = copy.deepcopy(model.config)
    cfg.tie_word_embeddings = False
    cfg.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    sd["lm_head.weight"] = model.get_output_embeddings().weight.detach().clone()
    save_file({k: v.cpu() for k, v in sd.items()}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def attach_engine(local, mc, model_path: str | None, seed: int = 0) -> EngineBackend:
    """Start (or connect to) the engine of a ``backend: vllm`` model entry and wrap ``local`` with it."""
    import atexit

    o = mc.vllm
    if o.base_url is None and model_path is None:
        raise ValueError(f"model {local.name!r}: backend vllm needs a checkpoint directory or the embedded "
                         f"model to serve, not {mc.path!r}")
    sync_dir = tempfile.mkdtemp(prefix="scope-sync-")
    extra = list(o.extra_args)
    if mc.finetune == "full" and tied_embeddings(local.model):
        if o.base_url is not None:
            shutil.rmtree(sync_dir, ignore_errors=True)
            raise ValueError(f"model {local.name!r}: full fine-tuning of a model with tied embeddings cannot be "
                             f"synced to a server of your own (vllm.base_url): vLLM's in-place reload keeps a tied "
                             f"output layer's old weights; let scope start the engine (it serves an untied copy)")
        untied = os.path.join(sync_dir, "start")  # the engine starts from an untied copy (module docstring)
        write_weights(local.model, untied, untied=True)
        if "--tokenizer" not in extra:
            extra += ["--tokenizer", model_path]
        model_path = untied
    lora_rank = mc.lora.r if mc.finetune == "lora" else 16
    try:
        engine = VLLMEngine(model_path, o.base_url, max_loras=o.max_loras, max_lora_rank=max(lora_rank, 8),
                            max_model_len=o.max_model_len,
                            dtype=mc.dtype if local.device.type == "cuda" else "float32",
                            extra_args=extra, python=o.python, start_timeout=o.start_timeout,
                            env={"VLLM_CPU_KVCACHE_SPACE": f"{o.kv_cache_gib:g}", **o.env})
    except BaseException:
        shutil.rmtree(sync_dir, ignore_errors=True)
        raise
    b = EngineBackend(local, engine, sync_dir=sync_dir, seed=seed, full_weights=mc.finetune == "full")
    b._own_dir = True
    atexit.register(b.close)
    return b
