"""A Binding: what fills a role in one episode (a model reference, sampling settings, a decoding strategy
and extra system-prompt text); every partner source hands these out and the rollout engine reads them."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import PartnerSpec, VSConfig
from ..contracts import ModelHandle
from ..types import SamplingParams


@dataclass
class Binding:
    id: str
    ref: ModelHandle
    sampling: SamplingParams
    vs: VSConfig | None = None
    note: str = ""


def spec_sampling(spec: PartnerSpec) -> SamplingParams:
    return SamplingParams(temperature=spec.temperature, top_p=spec.top_p, max_new_tokens=spec.max_new_tokens,
                          stop=tuple(spec.stop))


def spec_binding(spec: PartnerSpec, ref: ModelHandle) -> Binding:
    return Binding(id=spec.spec_id(), ref=ref, sampling=spec_sampling(spec),
                   vs=spec.vs if spec.decoding == "vs" else None, note=spec.note)
