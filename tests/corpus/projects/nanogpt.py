"""A GPT language model trained the nanoGPT way (karpathy/nanoGPT's train.py), as Lightning ports of it (Lightning's
``lightning.pytorch.demos.Transformer`` example, lit-gpt's pretraining) set it up.

Kept: a decoder-only transformer with causal mask and dropout; fixed-length blocks of a token stream (``x``, ``y``
shifted by one) served by a ``shuffle=True`` loader; AdamW with weight decay only on matrices, betas (0.9, 0.95);
learning rate by nanoGPT's ``get_lr`` (linear warmup, cosine decay to ``min_lr`` over ``lr_decay_iters``) through a
``LambdaLR`` stepped every optimizer step; ``gradient_clip_val=1.0``; gradient accumulation
(``accumulate_grad_batches=2``, nanoGPT's ``gradient_accumulation_steps``); training bounded by ``max_steps``
(``max_iters``), with evaluation every ``val_check_interval`` batches. Shrunk: vocabulary 32, context 8, one layer of
width 16, 26 blocks, 20 optimizer steps.
"""

from __future__ import annotations

import math

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ._data import tokens

FOLLOWS = "karpathy/nanoGPT train.py (warmup-cosine get_lr, AdamW decay groups, grad accumulation, max_iters)"
ALIGN = 2  # checkpoints after whole optimizer steps (accumulate_grad_batches=2), as ModelCheckpoint writes them
VOCAB, BLOCK = 32, 8


class Blocks(Dataset):
    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __len__(self) -> int:
        return (len(self.data) - 1) // BLOCK

    def __getitem__(self, i: int):
        chunk = self.data[i * BLOCK : i * BLOCK + BLOCK + 1]
        return chunk[:-1], chunk[1:]


class GPT(L.LightningModule):
    def __init__(
        self,
        n_embd: int = 16,
        dropout: float = 0.1,
        learning_rate: float = 6e-3,
        min_lr: float = 6e-4,
        warmup_iters: int = 4,
        lr_decay_iters: int = 20,
        weight_decay: float = 0.1,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(BLOCK, n_embd)
        self.drop = nn.Dropout(dropout)
        self.block = nn.TransformerEncoderLayer(n_embd, 2, 4 * n_embd, dropout, batch_first=True, norm_first=True)
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(BLOCK))

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        x = self.block(x, src_mask=self.mask[: idx.shape[1], : idx.shape[1]], is_causal=True)
        return self.lm_head(self.ln_f(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).view(-1, VOCAB), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).view(-1, VOCAB), y.reshape(-1)))

    def get_lr(self, it: int) -> float:
        hp = self.hparams
        if it < hp.warmup_iters:
            return hp.learning_rate * (it + 1) / (hp.warmup_iters + 1)
        if it > hp.lr_decay_iters:
            return hp.min_lr
        ratio = (it - hp.warmup_iters) / (hp.lr_decay_iters - hp.warmup_iters)
        return hp.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (hp.learning_rate - hp.min_lr)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.learning_rate,
            betas=(0.9, 0.95),
        )
        peak = self.hparams.learning_rate
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: self.get_lr(it) / peak)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main(run) -> None:
    L.seed_everything(1337)
    data = tokens(26 * BLOCK + 1 + 6 * BLOCK + 1, VOCAB)
    train, val = Blocks(data[: 26 * BLOCK + 1]), Blocks(data[26 * BLOCK :])
    trainer = run.trainer(
        max_steps=20, max_epochs=-1, accumulate_grad_batches=2, gradient_clip_val=1.0, val_check_interval=4
    )
    run.fit(
        trainer,
        GPT(),
        train_dataloaders=DataLoader(train, batch_size=4, shuffle=True),
        val_dataloaders=DataLoader(val, batch_size=4),
    )
