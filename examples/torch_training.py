"""Train a small PyTorch model on a `.grad` loss: the logistic loss written
as softplus(-y * z), with its stable grad block, used through
`dsl.to_torch` inside an ordinary torch.optim loop.

    python examples/torch_training.py
"""
import torch

import dsl

m = dsl.loads("""
def softplus(z):
    return maximum(z, 0) + log1p(exp(-abs(z)))
grad(dz):
    return dz * sigmoid(z)

def loss(z, y):
    return mean(softplus(-y * z))
""", "torch_training.grad")
loss = dsl.to_torch(m.loss)

torch.manual_seed(0)  # the model's initial weights
gen = torch.Generator().manual_seed(0)
x = torch.randn(512, 4, generator=gen, dtype=torch.float64)
y = torch.sign(x @ torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
model = model.to(torch.float64)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
losses = []
for step in range(41):
    opt.zero_grad()
    value = loss(model(x)[:, 0], y)
    value.backward()
    opt.step()
    losses.append(value.item())
    if step % 10 == 0:
        print(f"step {step:3d}: loss {value.item():.4f}")
