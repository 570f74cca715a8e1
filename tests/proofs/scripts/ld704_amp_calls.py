"""LD704 proof script: the old AMP spellings, run on CPU. It prints what each object did as JSON; with
`-W error::FutureWarning` the old spellings stop it, the fixed ones must not (and must behave the same)."""

import json

import torch
from torch.cpu.amp import autocast as cpu_autocast
from torch.cuda.amp import custom_bwd, custom_fwd


class Double(torch.autograd.Function):
    @staticmethod
    @custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @custom_bwd
    def backward(ctx, grad):
        return grad * 2


@cpu_autocast(dtype=torch.bfloat16)
def decorated_matmul(a, b):
    return a @ b


def main():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    report = {}
    # enabled and dtype by position: the fix must name them (the new second parameter is dtype)
    with torch.cpu.amp.autocast(True, torch.bfloat16):
        report["autocast_positional"] = str((a @ b).dtype)
    with torch.cpu.amp.autocast(enabled=False):
        report["autocast_disabled"] = str((a @ b).dtype)
    report["autocast_decorator"] = str(decorated_matmul(a, b).dtype)
    with torch.cuda.amp.autocast(enabled=False):  # a CUDA autocast turned off: valid on a CPU-only build
        report["cuda_autocast_disabled"] = str((a @ b).dtype)
    scaler = torch.cpu.amp.GradScaler(128.0, growth_interval=7)
    report["cpu_scaler"] = [scaler.get_scale(), scaler.get_growth_interval(), scaler.is_enabled()]
    off = torch.cuda.amp.GradScaler(enabled=False)
    report["cuda_scaler_enabled"] = off.is_enabled()
    x = torch.ones(3, requires_grad=True)
    Double.apply(x).sum().backward()
    report["custom_function_grad"] = x.grad.tolist()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
