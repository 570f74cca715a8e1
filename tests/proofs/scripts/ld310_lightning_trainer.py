"""A Lightning script that asks FSDP for bf16 with a string. Linted and fixed by the LD310 proof, never run:
Lightning is not installed in the test environment (the FSDP call it makes is run raw by ld310_fsdp_string_policy)."""

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 4))
    trainer = L.Trainer(devices=2, max_epochs=1, strategy=FSDPStrategy(mixed_precision="bf16"))
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=8))
