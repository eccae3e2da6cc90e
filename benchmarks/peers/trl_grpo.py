"""TRL's side of the GRPO step comparison (benchmarks/peers/grpo_step.py writes the workload and runs this in
the peers venv, .venv-peers, which has TRL and not scope).

TRL's GRPOTrainer on the workload of scope's P4G step: the same model (the embedded SmolLM2 as a transformers
checkpoint), the persuader prompts scope's environment gives the agent, P x G completions of at most
``agent_tokens`` at the same temperature, LoRA of the same rank on every linear layer, the same learning rate,
KL coefficient and clip range. Its reward function plays scope's partner turn: the frozen base model (the
adapter switched off, as scope's persuadee is) reads each pitch in the persuadee's own prompt and answers after
the forced ``[DONATE $`` start, ``partner_tokens`` tokens at most; the reward is min(amount / 2, 1). Prints one
JSON line: the wall time of every optimizer step (generation, reward, reference and policy passes, update).

    .venv-peers/bin/python benchmarks/peers/trl_grpo.py WORKLOAD.json
"""
from __future__ import annotations

import json
import os
import re
import sys
import time


def main(path: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    w = json.load(open(path))
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(w["threads"])
    torch.manual_seed(w["seed"])
    tok = AutoTokenizer.from_pretrained(w["model"])
    model = AutoModelForCausalLM.from_pretrained(w["model"], dtype=torch.float32)
    forced = re.compile(r"\s*(-?\d+(?:\.\d+)?)")
    trainer: GRPOTrainer | None = None

    def persuadee(prompts, completions, task, **_):
        """scope's partner turn: the frozen base answers each pitch after the forced decision start."""
        texts = []
        for c, t in zip(completions, task):
            pitch = c[0]["content"] if isinstance(c, list) else c
            msgs = [dict(m, content=m["content"].replace("<<PITCH>>", pitch)) for m in w["partner_views"][t]]
            texts.append(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + w["prefix"])
        tok.padding_side = "left"
        batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        net = trainer.model  # the trained model with its adapter switched off: the frozen base
        with torch.no_grad(), net.disable_adapter():
            out = net.generate(**batch, max_new_tokens=w["partner_tokens"], do_sample=True, top_p=1.0,
                               temperature=w["temperature"], pad_token_id=tok.pad_token_id or tok.eos_token_id)
        rewards = []
        for row in out[:, batch["input_ids"].shape[1]:]:
            m = forced.match(tok.decode(row, skip_special_tokens=True))
            rewards.append(min(max(float(m.group(1)), 0.0), 2.0) / 2.0 if m else 0.0)
        return rewards

    ds = Dataset.from_list([{"prompt": p, "task": i} for i, p in enumerate(w["agent_prompts"])])
    cfg = GRPOConfig(output_dir=w["out"], use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
                     num_generations=w["group"], per_device_train_batch_size=w["group"] * len(w["agent_prompts"]),
                     gradient_accumulation_steps=1, max_completion_length=w["agent_tokens"],
                     temperature=w["temperature"], learning_rate=w["lr"], beta=w["kl"], epsilon=w["clip"][0],
                     epsilon_high=w["clip"][1], num_iterations=1, max_steps=w["steps"], logging_steps=1,
                     save_strategy="no", report_to="none", seed=w["seed"], dataloader_num_workers=0,
                     disable_tqdm=True, lr_scheduler_type="constant")
    lora = LoraConfig(r=w["lora_r"], lora_alpha=w["lora_alpha"], lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.time()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.time() - self.t0)
            print(f"  trl step {len(times)}: {times[-1]:.1f} s", file=sys.stderr, flush=True)

    trainer = GRPOTrainer(model=model, reward_funcs=persuadee, args=cfg, train_dataset=ds, processing_class=tok,
                          peft_config=lora, callbacks=[Clock()])
    trainer.train()
    print(json.dumps({"step_seconds": times}))


if __name__ == "__main__":
    main(sys.argv[1])
