"""Fine-tuning a Hugging Face model on GLUE with Lightning (Lightning's tutorial "Finetune Transformers Models with
PyTorch Lightning", its ``GLUEDataModule`` and ``GLUETransformer``).

Kept: a ``datasets.Dataset`` tokenized with ``.map(batched=True)`` in the data module's ``setup`` and served with
``set_format("torch")``; dict batches (``input_ids``, ``attention_mask``, ``labels``) padded per batch by a collate
function (``DataCollatorWithPadding``'s job); a transformer encoder with dropout; AdamW with the no-decay parameter
groups (bias, LayerNorm); a linear warmup/decay schedule stepped every batch and sized from
``self.trainer.estimated_stepping_batches`` in ``configure_optimizers`` (``get_linear_schedule_with_warmup`` is a
``LambdaLR``); a validation loader. Shrunk: a made-up sentence-pair task with a 50-token vocabulary, a 1-layer
encoder of width 16, 48 training pairs, 2 epochs. Needs ``datasets`` (installed by ``make venv``).
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader

FOLLOWS = "Lightning tutorial text-transformers (GLUETransformer, GLUEDataModule), with HF datasets"
VOCAB = 50


def linear_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int):
    def lr_lambda(step: int) -> float:
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def tokenize(batch: dict) -> dict:
    """A tokenizer's output for sentence pairs: ids with [CLS]=1 and [SEP]=2, of varying lengths."""
    ids = [[1, *a, 2, *b, 2] for a, b in zip(batch["sentence1"], batch["sentence2"], strict=True)]
    return {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}


def pad_collate(features: list[dict]) -> dict:
    longest = max(len(f["input_ids"]) for f in features)
    batch = {"input_ids": [], "attention_mask": [], "labels": []}
    for f in features:
        pad = longest - len(f["input_ids"])
        batch["input_ids"].append(torch.cat([f["input_ids"], torch.zeros(pad, dtype=torch.long)]))
        batch["attention_mask"].append(torch.cat([f["attention_mask"], torch.zeros(pad, dtype=torch.long)]))
        batch["labels"].append(f["labels"])
    return {key: torch.stack(value) for key, value in batch.items()}


class GLUEDataModule(L.LightningDataModule):
    def __init__(self, train_batch_size: int = 4, eval_batch_size: int = 8) -> None:
        super().__init__()
        self.train_batch_size, self.eval_batch_size = train_batch_size, eval_batch_size

    def setup(self, stage: str) -> None:
        import datasets

        generator = torch.Generator().manual_seed(0)
        rows = {"sentence1": [], "sentence2": [], "label": []}
        for _ in range(60):
            rows["sentence1"].append(
                torch.randint(
                    3, VOCAB, (int(torch.randint(2, 7, (1,), generator=generator)),), generator=generator
                ).tolist()
            )
            rows["sentence2"].append(
                torch.randint(
                    3, VOCAB, (int(torch.randint(2, 7, (1,), generator=generator)),), generator=generator
                ).tolist()
            )
            rows["label"].append(int(torch.randint(0, 2, (1,), generator=generator)))
        dataset = datasets.Dataset.from_dict(rows).train_test_split(test_size=12, shuffle=False)
        self.dataset = {}
        for split, data in dataset.items():
            data = data.map(tokenize, batched=True).rename_column("label", "labels")
            data.set_format("torch", columns=["input_ids", "attention_mask", "labels"])
            self.dataset[split] = data

    def train_dataloader(self):
        return DataLoader(self.dataset["train"], batch_size=self.train_batch_size, shuffle=True, collate_fn=pad_collate)

    def val_dataloader(self):
        return DataLoader(self.dataset["test"], batch_size=self.eval_batch_size, collate_fn=pad_collate)


class GLUETransformer(L.LightningModule):
    def __init__(self, learning_rate: float = 2e-3, warmup_steps: int = 3, weight_decay: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, 16)
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask, labels=None):
        hidden = self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        logits = self.classifier(self.dropout(hidden[:, 0]))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return loss, logits

    def training_step(self, batch, batch_idx):
        loss, _ = self(**batch)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, logits = self(**batch)
        self.log("val_loss", loss)
        self.log("accuracy", (logits.argmax(-1) == batch["labels"]).float().mean())

    def configure_optimizers(self):
        no_decay = ["bias", "norm"]
        grouped = [
            {
                "params": [p for n, p in self.named_parameters() if not any(nd in n for nd in no_decay)],
                "weight_decay": self.hparams.weight_decay,
            },
            {"params": [p for n, p in self.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(grouped, lr=self.hparams.learning_rate)
        scheduler = linear_schedule_with_warmup(
            optimizer, self.hparams.warmup_steps, num_training_steps=self.trainer.estimated_stepping_batches
        )
        return [optimizer], [{"scheduler": scheduler, "interval": "step", "frequency": 1}]


def main(run) -> None:
    L.seed_everything(42)
    dm = GLUEDataModule()
    model = GLUETransformer()
    trainer = run.trainer(max_epochs=2)
    run.fit(trainer, model, datamodule=dm)
