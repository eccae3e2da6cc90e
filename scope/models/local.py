"""Local transformers models (the public names in one place): the backend and its handle
(:mod:`.backend`), the decode loop (:mod:`.decode`) and model loading (:mod:`.loading`)."""
from .backend import LocalBackend, ModelRef
from .decode import PREFILL_CHUNK_TOKENS, _cache_kw, _make_cache, _n_layers
from .loading import (CHATML, EMBEDDED, TINY, cache_root, char_tokenizer, clone_frozen, embedded_gguf,
                      load_backend, load_tokenizer, materialize_embedded, open_backend, resolve_device,
                      resolve_dtype, resolve_model_path, tiny_backend)

__all__ = ["LocalBackend", "ModelRef", "PREFILL_CHUNK_TOKENS", "CHATML", "EMBEDDED", "TINY", "cache_root",
           "char_tokenizer", "clone_frozen", "embedded_gguf", "load_backend", "load_tokenizer", "materialize_embedded",
           "open_backend", "resolve_device", "resolve_dtype", "resolve_model_path", "tiny_backend", "_cache_kw",
           "_make_cache", "_n_layers"]
