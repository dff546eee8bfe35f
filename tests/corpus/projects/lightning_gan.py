"""Lightning's GAN example (examples/pytorch/domain_templates/generative_adversarial_net.py).

Kept: manual optimization (``automatic_optimization = False``) with two Adam optimizers returned as a tuple,
``toggle_optimizer``/``untoggle_optimizer``, ``manual_backward``, the latent noise drawn from torch's global RNG in
every ``training_step``, the fixed ``validation_z`` made in ``__init__``, work in ``on_train_epoch_end`` (a sample
generated from ``validation_z``), ``log_dict``. Shrunk: 8x8 synthetic images, MLP generator/discriminator, 3 epochs.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ._data import SyntheticImages

FOLLOWS = "Lightning examples/pytorch/domain_templates/generative_adversarial_net.py"
IMG_SHAPE = (1, 8, 8)


class Generator(nn.Module):
    def __init__(self, latent_dim: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 32), nn.LeakyReLU(0.2), nn.Linear(32, 64), nn.Tanh())

    def forward(self, z):
        return self.model(z).view(z.size(0), *IMG_SHAPE)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(64, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def forward(self, img):
        return self.model(img.view(img.size(0), -1))


class GAN(L.LightningModule):
    def __init__(self, lr: float = 2e-4, b1: float = 0.5, b2: float = 0.999, latent_dim: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim)
        self.discriminator = Discriminator()
        self.validation_z = torch.randn(4, latent_dim)

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch):
        imgs, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(imgs.shape[0], self.hparams.latent_dim).type_as(imgs)

        self.toggle_optimizer(opt_g)
        valid = torch.ones(imgs.size(0), 1).type_as(imgs)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), valid)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(imgs), valid)
        fake = torch.zeros(imgs.size(0), 1).type_as(imgs)
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

    def configure_optimizers(self):
        betas = (self.hparams.b1, self.hparams.b2)
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=betas)
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=betas)
        return opt_g, opt_d

    def on_train_epoch_end(self):
        self.last_sample = self(self.validation_z.type_as(self.generator.model[0].weight)).detach()


def main(run) -> None:
    L.seed_everything(42)
    model = GAN()
    # the example normalizes MNIST to [-1, 1] (the generator ends in tanh)
    loader = DataLoader(SyntheticImages(36, IMG_SHAPE, transform=lambda x: x * 2 - 1), batch_size=4, shuffle=True)
    trainer = run.trainer(max_epochs=3)
    run.fit(trainer, model, train_dataloaders=loader)
