"""A single-device training script, written the way PyTorch's "Quickstart" tutorial writes it (test client).

A global ``batch_size = 64``, a ``DataLoader`` over the training set, a small ``nn.Sequential`` network, and
``train(dataloader, model, loss_fn, optimizer)`` with ``zero_grad`` / ``backward`` / ``step`` for a few epochs.
It reads no arguments and knows nothing of processes: it has no ``init_process_group`` and no DDP. It is
what many researchers hand to a launcher first: started by torchrun on two processes, each trains its own
copy of the model on all the data, at its own batch of 64, whatever the launcher's batch says.

The data are synthetic (FashionMNIST's shapes: 28x28 images, 10 classes), labelled by a fixed random
teacher so the loss goes down; no download.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

batch_size = 64
epochs = 2

generator = torch.Generator().manual_seed(0)
images = torch.randn(2048, 1, 28, 28, generator=generator)
teacher = torch.randn(28 * 28, 10, generator=generator)
labels = (images.flatten(1) @ teacher).argmax(dim=1)
training_data = TensorDataset(images, labels)

train_dataloader = DataLoader(training_data, batch_size=batch_size, shuffle=True)

device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
print(f"Using {device} device")


class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


model = NeuralNetwork().to(device)
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)


def train(dataloader, model, loss_fn, optimizer):
    size = len(dataloader.dataset)
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        X, y = X.to(device), y.to(device)
        pred = model(X)
        loss = loss_fn(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if batch % 16 == 0:
            loss, current = loss.item(), (batch + 1) * len(X)
            print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")


for t in range(epochs):
    print(f"Epoch {t + 1}\n-------------------------------")
    train(train_dataloader, model, loss_fn, optimizer)
print("Done!")
