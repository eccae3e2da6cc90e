"""Validated run configuration. Unknown keys and bad values are errors that name the key.

Defaults follow the paper's recipe: 16 tasks x G=8 rollouts, temperature 0.7, KL 0.005, LR 1e-6,
10 agent turns.
"""
from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False,  # no inf/nan values
                              use_attribute_docstrings=True)  # a field's docstring is its description (docs/configs.md)


class LoraConfig(Strict):
    r: int = Field(default=16, ge=1)
    """The adapter's rank."""
    alpha: int = Field(default=32, ge=1)
    """LoRA's scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training."""
    target_modules: str | list[str] = "all-linear"
    """The modules that get an adapter: "all-linear" or a list of module names."""
    top_layers: int | None = Field(default=None, ge=1)
    """LoRA on the top N transformer layers only (None: every layer). The backward pass then stops below
    the lowest of them, which cuts an update's cost on a CPU (long contexts, few trained tokens)."""


class VLLMOptions(Strict):
    """``backend: vllm``: the engine that samples for this model (see scope/models/vllm_backend.py)."""

    base_url: str | None = None
    """Connect to a running server (started with ``--logprobs-mode processed_logprobs``, ``--enable-lora``
    and runtime LoRA loading) instead of starting one on 127.0.0.1."""
    max_loras: int = Field(default=8, ge=1)
    """Adapters the engine holds at once: the trainable roles, the pool members and one version in swap."""
    max_model_len: int = Field(default=4096, ge=64)
    """The engine's context length (prompt and reply)."""
    extra_args: list[str] = []
    """More ``vllm.entrypoints.openai.api_server`` flags (e.g. ``--block-size 32``,
    ``--gpu-memory-utilization 0.4``, ``--tensor-parallel-size 2``)."""
    python: str | None = None
    """The interpreter that has vLLM installed (default: this one)."""
    start_timeout: float = Field(default=600.0, gt=0)
    """Seconds to wait for a started engine to answer."""
    kv_cache_gib: float = Field(default=2.0, gt=0)
    """CPU builds: the engine's KV cache (``VLLM_CPU_KVCACHE_SPACE``)."""
    env: dict[str, str] = {}
    """More environment for the engine's process, e.g. ``CUDA_VISIBLE_DEVICES: "1,2,3"`` to keep it off
    the learner's GPU."""


class ModelConfig(Strict):
    backend: Literal["local", "openai", "vllm"] = "local"
    """local: sampled by scope's own decode loop; vllm: the same local weights train, a vLLM engine
    samples (token ids and log-probs back, adapters synced by version); openai: any endpoint (frozen)."""
    path: str = "smollm2-135m"
    """local: an embedded model (smollm2-135m; gemma3-270m, Gemma 3 270M base, with ``scope[gemma]``), a test
    model (tiny-random, tiny-gemma3), a built model (``<prefix>:<name>``) or a transformers checkpoint directory."""
    template: Literal["auto", "chat", "plain"] = "auto"
    """How a conversation is written for this model: ``chat``, its tokenizer's chat template; ``plain``, a plain
    transcript (``User:`` / ``Assistant:`` lines, a turn ending at the end-of-text token) for a base model with
    none; ``auto``, the embedded model's own choice (plain for gemma3-270m), else ``chat``."""
    family: str | None = None
    """The model family, which panels report apart (unseen members of a training partner's family, and of
    another); None: derived from the weights (an embedded model's family, a builder's prefix, a checkpoint's
    ``model_type``, an endpoint's model name)."""
    finetune: Literal["lora", "full"] = "lora"
    """What a trainable role trains: a LoRA adapter on the shared base, or every weight."""
    lora: LoraConfig = LoraConfig()
    device: str = "auto"
    """auto (cuda if present, else cpu) | cpu | cuda | cuda:<i>."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: float32 on the CPU, bfloat16 on a GPU."""
    vllm: VLLMOptions = VLLMOptions()
    kv_budget_tokens: int = Field(default=200_000, ge=0)
    """Tokens of per-dialogue key/value cache kept between turns (0 turns reuse off)."""
    options: dict[str, Any] = {}
    """Options of a model that a registered builder makes (``path: <prefix>:<name>``, ``scope.models``)."""
    adapter: str | None = None
    """A LoRA adapter directory (PEFT format) played on top of ``path`` by the frozen roles that use this
    entry, e.g. the P4G simulator of ``scope sim fit`` (``runs/sim-p4g/adapter``). Entries with the same
    weights share one base in memory, each adapter on it."""
    # backend: openai
    base_url: str | None = None
    """openai: the endpoint (e.g. http://127.0.0.1:8000/v1)."""
    model_name: str | None = None
    """openai: the model name sent with each request."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """openai: the environment variable holding the API key."""
    timeout: float = Field(default=60.0, gt=0)
    """openai: seconds a request may take."""
    concurrency: int = Field(default=8, ge=1)
    """openai: requests in flight at once."""
    max_retries: int = Field(default=4, ge=0)
    """openai: retries of a failed request (429, 5xx, a timeout), with exponential backoff."""
    backoff: float = Field(default=0.5, ge=0)
    """openai: the first retry's wait in seconds (doubled each retry)."""
    json_schema: bool = False
    """The endpoint accepts ``response_format`` with a JSON schema (used by Verbalized Sampling)."""
    max_tokens: int = Field(default=4096, ge=1)
    """openai: the completion-token limit of every request to this endpoint (in place of the role's
    ``max_new_tokens``, which is sized for local models): reasoning models spend tokens before they
    answer, and a reply cut off at the limit ends its episode as truncated."""
    token_limit_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    """The request field that carries ``max_tokens``: OpenAI's reasoning models take only
    ``max_completion_tokens``; vLLM and most other servers take either."""

    @field_validator("device")
    @classmethod
    def _device(cls, v):
        import re as _re

        if not _re.fullmatch(r"auto|cpu|cuda(:\d+)?", v):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:<index>, not {v!r}")
        return v

    @model_validator(mode="after")
    def _openai_fields(self):
        if self.backend == "openai" and (not self.base_url or not self.model_name):
            raise ValueError("backend openai needs base_url and model_name")
        return self


class VSConfig(Strict):
    k: int = Field(default=5, ge=1, le=20)
    """Candidates the model verbalizes per reply, with their probabilities."""
    method: Literal["prob", "random"] = "prob"
    """prob: draw a candidate by its verbalized probability; random: uniformly."""
    max_reasks: int = Field(default=2, ge=0)
    """Asks again when the answer does not parse, then falls back to a plain reply (counted)."""
    max_new_tokens: int = Field(default=400, ge=16)
    """Tokens for the whole verbalized answer (every candidate)."""
    max_words: int | Literal["auto"] | None = "auto"
    """The length guide in the request ("Keep each reply under N words."), as the Verbalized Sampling
    prompts give one: "auto" is 3/4 of the partner's plain ``max_new_tokens`` (about a word per 4/3
    tokens), so that a drawn candidate is as long as a plain reply could be; null asks for no length."""


class PartnerSpec(Strict):
    """One way to fill a role: a model, its decoding and sampling, and extra system-prompt text."""

    model: str = "policy"
    """A key of ``models``."""
    id: str | None = None
    """The id recorded in rollouts (default: model name, plus 'vs' for Verbalized Sampling)."""
    temperature: float = Field(default=0.7, ge=0)
    """Sampling temperature (0: greedy)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling: the smallest set of tokens with this much probability."""
    max_new_tokens: int = Field(default=128, ge=1)
    """The longest reply, in tokens; a reply cut there is "truncated" (see rollout.end_on_truncation)."""
    stop: list[str] = []
    """Strings that end a reply (the string is kept)."""
    decoding: Literal["plain", "vs"] = "plain"
    """plain: one sample; vs: Verbalized Sampling (k candidates with probabilities, one drawn)."""
    vs: VSConfig = VSConfig()
    note: str = ""
    """Text appended to this role's system prompt (a style or persona instruction)."""

    def spec_id(self) -> str:
        return self.id or (self.model + ("+vs" if self.decoding == "vs" else ""))


class PoolConfig(Strict):
    size: int = Field(default=5, ge=1)
    """K: the pool keeps the newest K snapshots (FIFO)."""
    every: int = Field(default=4, ge=1)
    """C: a snapshot of the trained adapter every C steps (the pool starts with the initial one)."""


class RoleConfig(PartnerSpec):
    trainable: bool = False
    """This role is trained (GRPO on its own tokens, its own adapter or weights)."""
    reward: str = "env"
    """The role's reward: env (the environment's), for a partner cooperative, adversarial or curriculum, a
    registered name, or a function by import path, ``package.module:function``: called once a step as
    ``function(episodes, role, agent)``, it returns one reward per episode (a number, or None to keep the
    environment's); one that raises fails the step's episodes, a value that is not a finite number fails its
    episode (counted in failed_episodes), and the run goes on."""
    baseline: Literal["auto", "group", "step"] = "auto"
    """Advantage baseline: z-score within each task's group, or over the whole step (for a reward that is
    constant within a group); auto: the reward's own (curriculum: step, the others: group)."""
    lr: float | None = Field(default=None, gt=0)
    """This role's learning rate (default train.lr): e.g. a simulator that learns slower than the agent."""
    kl_coef: float | None = Field(default=None, ge=0)
    """This role's KL coefficient to its reference weights (default train.kl_coef): e.g. a co-trained
    simulator kept close to the simulator it started from."""
    self_play: bool = False
    """partner: played by the agent's own adapter; one update uses both roles' tokens, each with its own
    mask and advantages."""
    pool: PoolConfig = PoolConfig()
    source: str = "single"
    """single: this spec; rotation: the specs in ``rotation``, in a fixed cycle; persona: this spec plus a
    persona drawn per rollout from ``personas``; pool: a snapshot drawn per rollout from a FIFO pool of
    this trainable role's adapter (Population Co-Training); or a registered source
    (``scope.partners.registry.PARTNER_SOURCES``)."""
    rotation: list[PartnerSpec] = []
    """rotation: the partner specs cycled through (one per task group)."""
    group_shared: bool = True
    """rotation/persona: the G rollouts of one task share one partner (homogeneous groups)."""
    personas: str = "builtin"
    """persona source: 'builtin' or a JSON file of [{"id": ..., "text": ...}]."""

    @model_validator(mode="after")
    def _source_fields(self):
        from .partners.registry import PARTNER_SOURCES

        if self.source not in PARTNER_SOURCES.names():
            raise ValueError(f"source: unknown partner source {self.source!r}; registered: "
                             f"{', '.join(PARTNER_SOURCES.names())}")
        if self.source == "rotation" and len(self.rotation) < 1:
            raise ValueError("source rotation needs a non-empty rotation list")
        if self.trainable and (self.source not in ("single", "pool") or self.decoding != "plain"):
            raise ValueError("a trainable role must use source single or pool, and plain decoding")
        if self.source == "pool" and not self.trainable:
            raise ValueError("source pool holds snapshots of a trainable role: set trainable: true")
        if self.self_play and not self.trainable:
            raise ValueError("self_play needs trainable: true")
        from .partners.rewards import PARTNER_REWARDS

        if self.reward not in PARTNER_REWARDS and ":" not in self.reward:
            raise ValueError(f"reward: unknown partner reward {self.reward!r}; registered: "
                             f"{', '.join(PARTNER_REWARDS.names())}, or package.module:function")
        return self

    def specs(self) -> list[PartnerSpec]:
        return list(self.rotation) if self.source == "rotation" else [self]


class TasksConfig(Strict):
    """Tasks from a file instead of the environment's own (scope/envs/tasks.py)."""

    path: str | dict[str, str]
    """A .jsonl, .json (a list) or .parquet file, or a directory written by datasets' save_to_disk (a Dataset,
    or a DatasetDict whose splits are the splits); or one path per split (``{train: a.jsonl, test: b.jsonl}``)."""
    fields: dict[str, str] = {}
    """The environment's task field -> the column holding it (e.g. p4g ``{user_id: id, persona: bio}``);
    other columns keep their names."""
    split_column: str | None = None
    """A column naming each row's split; unset (one file): a seeded ``test_fraction`` of the rows is ``test``,
    the rest ``train``."""
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    """Without a split column: the share of rows in ``test``."""
    split_seed: int = 0
    """Without a split column: the seed of the random split."""


class EnvConfig(Strict):
    name: str = "p4g"
    """The environment: p4g, tau2_retail, tau2_airline, coop_coding, koth, or one a plugin registers."""
    train_split: str = "train"
    """The task split training draws from."""
    eval_split: str = "test"
    """The task split held-out evaluation plays."""
    options: dict[str, Any] = {}
    """Keyword options of the environment (e.g. p4g: max_turns, personas, split_seed, test_fraction)."""
    tasks: TasksConfig | None = None
    """A user's tasks from a file (JSONL, parquet, a saved ``datasets`` dataset), mapped to the environment's
    task fields; unset: the environment's own tasks."""
    judge: PartnerSpec | None = None
    """A model that answers the environment's judge requests (tau2: NL assertions of later task
    revisions); None: those checks are recorded as skipped."""


class RolloutConfig(Strict):
    n_tasks: int = Field(default=16, ge=1)
    """Tasks per training step."""
    group_size: int = Field(default=8, ge=1)
    """G: rollouts per task (GRPO's group)."""
    max_context: int = Field(default=4096, ge=64)
    """The longest prompt plus reply, in tokens; a dialogue that outgrows it ends as "context_limit"."""
    end_on_truncation: bool = True
    """A reply cut off at max_new_tokens ends the episode as ``truncated``."""
    workers: int = Field(default=0, ge=0)
    """0: dialogues run in this process. N > 0: in N Ray actors, each with its own copy of the models
    (scope/rollout_workers.py; needs ``pip install 'scope[scale]'``)."""
    max_staleness: int = Field(default=0, ge=0)
    """K, asynchronous rollouts (scope/pipeline.py). 0: each step's dialogues are generated, then trained on
    (synchronous). K >= 1: the dialogues of the next K steps are generated while this step trains, on the
    weights of the last version sent; a step trains only on episodes whose oldest trained turn is at most K
    versions behind its learner. Generation runs in Ray workers (``workers`` > 0), on the vLLM engine, or in a
    thread of this process with its own copy of the models."""
    stale: Literal["drop", "finish"] = "drop"
    """With ``max_staleness`` >= 1: ``drop``: a step's dialogues play on the weights they started with; an episode
    past the bound is left out of training. ``finish`` (partial rollout): the generator takes up every new version
    between turns, so dialogues under way finish on the newer weights; an episode past the bound is kept. Both
    are counted (``async/dropped_episodes``, ``async/finished_episodes``)."""


class RayConfig(Strict):
    address: str | None = None
    """Join a running cluster (``ray start --head`` on one machine, ``ray start --address`` on the
    others; e.g. ``auto`` or ``10.0.0.1:6379``); unset: a local instance bound to 127.0.0.1."""
    cpus_per_worker: float = Field(default=1.0, gt=0)
    """CPUs Ray reserves for each rollout worker."""
    threads_per_worker: int = Field(default=0, ge=0)
    """torch threads in each worker (0: torch's default)."""


class TrainConfig(Strict):
    steps: int = Field(default=250, ge=0)
    """Training steps (each: rollouts, then one update per trainable role). ``0``: no training: the policy as
    built is evaluated on ``eval.panel`` once, as step 0 (a grid's untrained arm), and the run ends."""
    lr: float = Field(default=1e-6, gt=0)
    """AdamW learning rate (constant)."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW betas."""
    weight_decay: float = Field(default=0.1, ge=0)
    """AdamW weight decay."""
    eps_low: float = Field(default=0.2, gt=0, lt=1)
    """The clipped ratio's lower bound is 1 - eps_low (PPO's clip)."""
    eps_high: float = Field(default=0.28, gt=0, lt=1)
    """The upper bound is 1 + eps_high (DAPO's clip-higher)."""
    kl_coef: float = Field(default=0.005, ge=0)
    """Weight of the k3 KL estimate to the reference weights (the base, or the role's starting adapter)."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Gradient-norm clip per update."""
    micro_batch_tokens: int = Field(default=1024, ge=16)
    """Tokens per forward/backward pass (sequences, padded, are packed up to this; a beginning that all of them
    share, such as a group's prompt, runs once and counts once, except in a model sharded with FSDP2, whose
    trained pass runs every row whole); memory grows with it."""
    num_minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per update, each on its share of the step's episodes."""
    tis_cap: float | None = Field(default=None, ge=1)
    """Truncated importance sampling (off: unset). The clipped ratio is taken against the learner's own
    log-probs at the start of the update, and each token's policy-gradient term is weighted by
    min(learner / behaviour probability, tis_cap): the correction for tokens sampled by older weights
    (``rollout.max_staleness``) or another engine (vLLM). Logs ``train/mismatch_kl`` and ``train/tis_truncated``
    (the share of tokens the cap cut). Unset, the ratio is against the behaviour log-probs."""
    success_threshold: float = 1.0
    """A group is all-success when every reward is >= this, all-failure when every reward is <= 0."""
    no_signal_warn: int = Field(default=3, ge=1)
    """Warn when a trainable role's updates carried no signal (every advantage 0, or a zero gradient)
    for this many consecutive steps."""
    max_failed_steps: int = Field(default=3, ge=1)
    """Stop the run with an error naming the cause once every episode of this many consecutive steps has
    failed (a dead endpoint, a bad environment option): it can no longer learn anything."""


class EvalConfig(Strict):
    panel: str | None = None
    """A panel YAML (partners marked seen/unseen); None: no held-out evaluation during training."""
    every: int = Field(default=16, ge=1)
    """Evaluate the panel every this many steps (and at the last step)."""
    select_on: Literal["seen", "all"] = "seen"
    """The best checkpoint (RUN_DIR/best) is chosen by the mean over the seen partners only, as the paper
    selects with no evaluation-only simulator; ``all`` also lets the unseen ones choose (then the unseen
    score is no longer held out). best.json records every held-out score at the chosen step."""
    at_start: bool = False
    """Also evaluate the untrained policy, as step 0 (the start of every held-out curve)."""


class AlarmConfig(Strict):
    """One collapse alarm (:mod:`scope.alarms`): a detector, its rule's threshold and window, and an action."""

    name: str
    """The alarm's name in the logs, the metrics (``alarm/<name>``) and the trackers."""
    detector: Literal["exploit", "gap", "entropy_floor", "self_similarity_ceiling", "zero_variance_ceiling",
                      "partner_modal_mass_ceiling"]
    """exploit: the training reward rises while the unseen reward falls (paired s.e., over evaluations; another
    family's unseen members where the panel has them); gap: the seen-minus-unseen gap widens (paired s.e.);
    entropy_floor, self_similarity_ceiling, zero_variance_ceiling: a step metric's recent mean passes a bound;
    partner_modal_mass_ceiling: the partner's modal mass at the probe states."""
    threshold: float | None = None
    """The rule's bound (standard errors for exploit and gap); None: the detector's default
    (``scope.alarms.DEFAULTS``; docs/evaluation.md says where they were chosen)."""
    window: int | None = Field(default=None, ge=1)
    """Evaluations (exploit, gap) or steps (the others) the rule reads; None: the detector's default."""
    action: Literal["warn", "stop", "switch"] = "warn"
    """warn: a log line, a tracker event and a mark on the curves; stop: then end the run at that step;
    switch: then the partner plays ``monitor.fallback`` from the next step on."""


class MonitorConfig(Strict):
    alarms: list[AlarmConfig] = []
    """Collapse alarms checked at every step (``scope alarms RUN`` re-scores a finished run offline)."""
    fallback: dict[str, Any] | None = None
    """What the partner becomes on a ``switch`` alarm: keys of the partner's config set over it (e.g.
    ``{source: rotation, rotation: [...]}``, or ``{decoding: vs}``); the partner must be frozen."""

    @model_validator(mode="after")
    def _names(self):
        names = [a.name for a in self.alarms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"monitor.alarms: the name {dup[0]!r} is used twice")
        if any(a.action == "switch" for a in self.alarms) and not self.fallback:
            raise ValueError("monitor.alarms: a switch alarm needs monitor.fallback (what the partner becomes)")
        return self


class DiagnosticsConfig(Strict):
    decompose_every: int = Field(default=0, ge=0)
    """Every this many steps (0: never), split the group reward variance into partner and agent parts by
    nested resampling on a sample of this step's tasks (the agent's turns replayed, the partner resampled)."""
    decompose_tasks: int = Field(default=2, ge=1)
    """Tasks of the step whose reward variance is decomposed."""
    decompose_samples: int = Field(default=4, ge=2)
    """First-stage rollouts per task (the agent part is the variance between them, within the task)."""
    decompose_resamples: int = Field(default=4, ge=2)
    """Partner resamples per first-stage rollout (the partner part is the variance between them)."""
    probe_every: int = Field(default=10, ge=0)
    """Every this many steps (and at step 1; 0: never), the partner's behaviour modal mass at a fixed set of
    probe states (saved at step 1: the untrained agent's first turns), so that it measures the partner, not
    where the agent's rollouts happen to go (environments with a behaviour classifier, e.g. p4g)."""
    probe_states: int = Field(default=8, ge=1)
    """Fixed probe states the partner's modal mass is measured at."""
    probe_samples: int = Field(default=8, ge=2)
    """Partner replies sampled per probe state."""


class RunConfig(Strict):
    dir: str = "runs/scope"
    """The run directory: config, metrics, checkpoints, evaluations, rollouts."""
    seed: int = 0
    """Seeds sampling, task order and initialisation; the same seed, config and thread count give the same run."""
    save_every: int = Field(default=10, ge=1)
    """A checkpoint every this many steps (and at the last), written atomically."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Checkpoints kept (the oldest go; RUN_DIR/best is kept apart)."""
    save_rollouts: bool = True
    """Write each step's episodes (token ids, log-probs, rewards) to rollouts/."""
    threads: int | None = Field(default=None, ge=1)
    """torch threads (None: torch's default); the numbers of a run depend on it."""
    progress: bool = True
    """A progress line per step."""
    plugins: list[str] = []
    """Modules (``package.module``) imported before the rest of the config is checked, for what they register:
    an environment, a model builder, a persona pool (``scope.registry``), e.g. ``[recipes.collapse_lab]``. A
    module not found among the installed packages is looked for from the current directory too."""
    report_to: list[str] = ["tensorboard"]
    """Where the metrics go besides RUN_DIR/metrics.jsonl (always written), as TRL's ``report_to``: any of
    ``tensorboard``, ``wandb``, ``mlflow`` (scope.trackers; ``[]``: the JSONL file only). Each gets the config,
    every step's scalars and, at the end, the run's curves."""

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, v: list[str]) -> list[str]:
        from .trackers import TRACKERS

        unknown = [n for n in v if n != "jsonl" and n not in TRACKERS.names()]
        if unknown:
            raise ValueError(f"unknown tracker {unknown[0]!r}; known: jsonl, {', '.join(TRACKERS.names())}")
        return v


class PlacementConfig(Strict):
    ranks: list[int] | None = None
    """The ranks this trained model's learner runs on (its own process group); None: every rank."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """``ddp``: a full copy on each rank, gradients all-reduced; ``fsdp``: FSDP2, parameters, gradients and
    optimizer state sharded over the ranks."""


class ParallelConfig(Strict):
    """A run launched over several ranks (``torchrun --nproc-per-node N -m scope.cli train ...``; see
    ``scope.parallel``). Ignored by a one-process run."""

    agent: PlacementConfig = PlacementConfig()
    partner: PlacementConfig = PlacementConfig()
    envsim: PlacementConfig = PlacementConfig()
    """A trained environment simulator (``envsim: {trainable: true}``)."""
    timeout: float = Field(default=3600.0, gt=0)
    """Seconds a rank waits in a collective (the other ranks wait for rank 0's rollouts and evaluations)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """``auto``: NCCL when the models are on GPUs, gloo on the CPU."""


class Config(Strict):
    run: RunConfig = RunConfig()
    models: dict[str, ModelConfig] = {"policy": ModelConfig()}
    agent: RoleConfig = RoleConfig(trainable=True)
    partner: RoleConfig = RoleConfig()
    envsim: RoleConfig | None = None
    """The environment simulator (tau2 with ``env.options.tools: simulated``): a model that answers the agent's
    tool calls, a role like the partner (frozen, a rotation, trainable on its accuracy against the exact
    tools). Unset: the environment's own tools answer."""
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    ray: RayConfig = RayConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()
    monitor: MonitorConfig = MonitorConfig()
    parallel: ParallelConfig = ParallelConfig()

    @field_validator("models")
    @classmethod
    def _models_nonempty(cls, v):
        if not v:
            raise ValueError("at least one model is needed")
        return v

    @model_validator(mode="after")
    def _check_refs(self):
        from .config_checks import check_whole

        check_whole(self)  # the checks across sections (a role's model, alarms' panel, self-play, the env)
        return self

    def fallback_partner(self) -> RoleConfig:
        """The partner a ``switch`` alarm puts in place: ``monitor.fallback`` set over the partner's config."""
        data = {**self.partner.model_dump(exclude_unset=True), **(self.monitor.fallback or {})}
        try:
            return RoleConfig.model_validate(data)
        except ValidationError as e:
            msg = format_validation_error(e).removeprefix("invalid config: ")
            raise ValueError(f"monitor.fallback: {msg}") from None

    def roles(self) -> dict[str, RoleConfig]:
        out = {"agent": self.agent, "partner": self.partner}
        if self.envsim is not None:
            out["envsim"] = self.envsim
        return out


class ConfigError(ValueError):
    pass


def format_validation_error(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        if err["type"] == "value_error":  # a check of the whole config: its message names the key
            msg = msg.removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    if len(lines) == 1:
        return f"invalid config: {lines[0]}"
    return "invalid config:\n" + "\n".join(f"  {ln}" for ln in lines)


def parse_config(data: dict[str, Any] | None) -> Config:
    from .registry import load_plugins

    run = (data or {}).get("run")
    plugins = run.get("plugins") if isinstance(run, dict) else None
    if plugins is not None:
        if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
            raise ConfigError("invalid config: run.plugins: a list of module paths (package.module)")
        try:
            load_plugins(plugins)
        except ImportError as e:
            raise ConfigError(f"invalid config: run.plugins: {e}") from None
    try:
        return Config.model_validate(data or {})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def apply_override(data: dict[str, Any], item: str) -> None:
    """``a.b.c=value`` (value parsed as YAML) into a nested dict."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not KEY=VALUE")
    key, val = item.split("=", 1)
    parts = key.split(".")
    d = data
    for p in parts[:-1]:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise ConfigError(f"override {item!r}: {p} is not a mapping")
    d[parts[-1]] = yaml.safe_load(val)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
