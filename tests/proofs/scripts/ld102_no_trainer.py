"""Instruction tuning of a tiny Llama, written like the `*_no_trainer.py` examples: accumulation, clipping, a
scheduler, `completed_steps`, checkpoints, resume with `skip_first_batches`, a `break` at `--max_train_steps`,
and `--with_tracking` (a small JSON tracker: accelerate's own trackers need packages this proof does not install).

The per-micro-batch token mean of `outputs.loss` is LD102's finding. `Probe` records, at every optimizer step,
the window's micro-batches, the weights and the gradient before clipping, for the float64 check in the test.
"""

import argparse
import json
import math
import os

import torch
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

VOCAB = 64
PAD_ID = 0


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD_ID,
    )
    return LlamaForCausalLM(config)


def build_examples(count):
    """Prompt tokens (masked to -100) followed by a response of 1 to 13 tokens."""
    generator = torch.Generator().manual_seed(1)
    examples = []
    for index in range(count):
        prompt = torch.randint(1, VOCAB, (3 + index % 4,), generator=generator)
        response = torch.randint(1, VOCAB, (1 + (index * 5) % 13,), generator=generator)
        input_ids = torch.cat([prompt, response])
        labels = input_ids.clone()
        labels[: len(prompt)] = -100
        examples.append({"input_ids": input_ids, "labels": labels})
    return examples


def collate(rows):
    width = max(len(row["input_ids"]) for row in rows)
    batch = {
        "input_ids": torch.full((len(rows), width), PAD_ID),
        "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
        "labels": torch.full((len(rows), width), -100),
    }
    for i, row in enumerate(rows):
        length = len(row["input_ids"])
        batch["input_ids"][i, :length] = row["input_ids"]
        batch["attention_mask"][i, :length] = 1
        batch["labels"][i, :length] = row["labels"]
    return batch


class JsonTracker(GeneralTracker):
    name = "json"
    requires_logging_directory = False

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.rows = []

    @property
    def tracker(self):
        return self.rows

    def store_init_configuration(self, values):
        self.rows.append({"config": values})

    def log(self, values, step=None, **kwargs):
        self.rows.append({"step": step, **{key: float(value) for key, value in values.items()}})
        with open(self.path, "w") as out:
            json.dump(self.rows, out)


class Probe:
    """What the test needs to check each optimizer step against a float64 reference."""

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.window = []
        self.steps = []

    def micro_batch(self, batch):
        self.window.append({key: value.detach().cpu().clone() for key, value in batch.items()})

    def step(self, model):
        unwrapped = self.accelerator.unwrap_model(model)
        self.steps.append(
            {
                "batches": self.window,
                "weights": {key: value.detach().cpu().clone() for key, value in unwrapped.state_dict().items()},
                "grads": {name: p.grad.detach().cpu().clone() for name, p in unwrapped.named_parameters()},
            }
        )
        self.window = []

    def save(self, completed_steps, path):
        torch.save({"steps": self.steps, "completed_steps": completed_steps}, path)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gradient_accumulation_steps", type=int, default=3)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--checkpointing_steps", type=int, default=None)
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--output_dir", default=os.environ.get("PROOF_OUT", "out"))
    parser.add_argument("--with_tracking", action="store_true")
    return parser.parse_args()


def main():
    args = parse_args()
    tracker = JsonTracker(os.path.join(args.output_dir, "tracking.json"))
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=[tracker] if args.with_tracking else None,
    )
    model = build_model()
    # 28 examples, 2 per batch, 2 ranks: 7 batches per rank and epoch, so each epoch ends on a window of 1
    train_dataloader = DataLoader(
        build_examples(28), batch_size=args.per_device_train_batch_size, shuffle=False, collate_fn=collate
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.num_processes / 3)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, 1, args.max_train_steps * accelerator.num_processes)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    if args.with_tracking:
        accelerator.init_trackers("ld102_proof", {"gradient_accumulation_steps": args.gradient_accumulation_steps})

    completed_steps = 0
    starting_epoch = 0
    resume_step = None
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        step_name = os.path.basename(args.resume_from_checkpoint.rstrip("/"))
        resume_step = int(step_name.replace("step_", "")) * args.gradient_accumulation_steps
        starting_epoch = resume_step // len(train_dataloader)
        completed_steps = resume_step // args.gradient_accumulation_steps
        resume_step -= starting_epoch * len(train_dataloader)

    probe = Probe(accelerator)
    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        if args.with_tracking:
            total_loss = 0
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            # skip the batches of the steps the checkpoint already holds
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active_dataloader = train_dataloader
        for step, batch in enumerate(active_dataloader):
            probe.micro_batch(batch)
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                if args.with_tracking:
                    total_loss += loss.detach().float()
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    probe.step(model)
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:
                completed_steps += 1
                if args.checkpointing_steps and completed_steps % args.checkpointing_steps == 0:
                    accelerator.save_state(os.path.join(args.output_dir, f"step_{completed_steps}"))

            if completed_steps >= args.max_train_steps:
                break

        if args.with_tracking:
            accelerator.log(
                {"train_loss": total_loss.item() / len(train_dataloader), "epoch": epoch}, step=completed_steps
            )

    accelerator.end_training()
    probe.save(completed_steps, os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.pt"))
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{accelerator.process_index}.json"), "w") as out:
        json.dump({"world": accelerator.num_processes, "completed_steps": completed_steps}, out)


if __name__ == "__main__":
    main()
