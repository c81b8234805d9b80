"""Clean: a single-process script: printing, saving and cuda:0 are all fine without other ranks."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    model = torch.nn.Linear(8, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    correct = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        correct += (out.argmax(1) == y).sum().item()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()
    print(f"accuracy {correct / len(dataset):.3f}, batch per half {8 // 2}")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
